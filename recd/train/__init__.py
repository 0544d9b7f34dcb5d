"""The trainer (issue 4): models from :mod:`models`, Adam from :mod:`recd.optim`."""
