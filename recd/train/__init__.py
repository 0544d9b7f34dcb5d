"""The trainer: models from :mod:`models`, Adam from :mod:`recd.optim`."""
