"""The defaults of ``recd analyze``, in a module of their own: the command line and the
pipeline config show them without importing torch and torchrec (which the analysis itself
needs)."""

from typing import Literal

DEFAULT_BATCH_SIZE = 512
"""B when neither the command line nor a training job gives one."""
DEFAULT_THRESHOLD = 1.5
DEFAULT_SYNC_THRESHOLD = 0.99
PAY_MARGIN = 0.02
"""A group is kept only if, with the other kept groups deduplicated, leaving it out costs the
priced job more than this share of the plain job's time (reader + trainer when priced for a
training job, the reader's conversion + sparse preprocessing when priced for the reader
only); the kept set as a whole must save more than this share too."""

Pricing = Literal["job", "reader", "factor"]
"""How a proposal is priced: ``job`` (the reader and the trainer step of a training job,
timed), ``reader`` (the reader alone, timed; a single one-id feature is never proposed) or
``factor`` (the dedup factor alone: the paper's rule)."""
PRICINGS: tuple[Pricing, ...] = ("job", "reader", "factor")
