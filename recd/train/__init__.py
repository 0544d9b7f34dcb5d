"""The trainer: models from :mod:`recd.models`, Adam from :mod:`recd.optim`."""
