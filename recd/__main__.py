import sys

from recd.cli import main

sys.exit(main())
