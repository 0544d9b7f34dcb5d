"""The defaults of ``recd analyze``, in a module of their own: the command line shows them in
``--help`` without importing torch and torchrec (which the analysis itself needs)."""

DEFAULT_BATCH_SIZE = 512
DEFAULT_THRESHOLD = 1.5
DEFAULT_SYNC_THRESHOLD = 0.99
PAY_MARGIN = 0.02
"""A group is kept only if, with the other kept groups deduplicated, leaving it out costs the
reader more than this share of the plain job's time (conversion + sparse preprocessing); the
kept set as a whole must save more than this share too."""
