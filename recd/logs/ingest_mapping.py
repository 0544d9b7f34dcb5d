"""IngestMapping: which input columns ``recd logs ingest`` reads, and what each one becomes.

A mapping is given by flags (``--session-col``, ``--label-cols``, ...), by a TOML file
(``--mapping FILE``, top-level keys), or inline in a pipeline's ``[ingest.mapping]`` table;
flags override the file. Every key is a field below. For example::

    session = "user_session"            # session (or user) id column
    ts = "event_time"                   # timestamp column
    item = "product_id"                 # item id column
    event = "event_type"                # event type column
    positive_events = ["cart", "purchase"]   # label = 1 for these event types
    dense = ["price"]                   # numeric columns -> float32 dense features
    sparse = ["category_id", "brand_id"]     # id columns -> length-1 sparse features
    sparse_lists = ["tags"]             # list columns ("3|17|42", JSON / Parquet lists)
    history = 20                        # last N events of the session (0: no history)
    keep_itemless = true                # searches etc.: in the history, not samples

A key that is not a field, or a value of the wrong type, is a ``ConfigError`` of one line that
names the section (``[mapping]`` / ``[ingest.mapping]``), the key and what was expected.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recd.config_types import build_section
from recd.errors import ConfigError

TS_UNITS = ("auto", "ms", "s", "iso")
SESSION_ID_MODES = ("auto", "int", "hash")
DEFAULT_POSITIVE_EVENTS = (
    "cart",
    "purchase",
    "order",
    "add_to_cart",
    "addtocart",
    "transaction",
)
LABEL = "label"
ITEM_FEATURE = "item_id"
HISTORY_DENSE = ("hist_len",)
TIME_DENSE = ("secs_since_prev_event",)
HISTORY_SPARSE = ("hist_item_ids", "hist_event_types")
RESERVED_NAMES = ("session_id", "request_id", "ts")


@dataclass(kw_only=True, slots=True)
class IngestMapping:
    """Input columns and what they become in the sample schema."""

    session: str = "session_id"
    """Session (or user) id column: integers, or strings hashed to a stable 63-bit id."""
    ts: str = "ts"
    """Timestamp column: epoch ms, epoch s or ISO 8601 (see ``ts_unit``)."""
    item: str = "item_id"
    """Item id column (integers >= 0); becomes the ``item_id`` sparse feature."""
    event: str = "event_type"
    """Event type column (strings, trimmed and lower-cased); feeds ``hist_event_types`` and,
    with ``positive_events``, the label."""
    ts_unit: str = "auto"
    """``auto``, ``ms``, ``s`` or ``iso``: auto picks per file (numbers: ms if any >= 1e11)."""
    session_ids: str = "auto"
    """``auto``, ``int`` or ``hash``: auto uses the integers when every id is one."""
    positive_events: list[str] | None = None
    """Event types whose ``label`` is 1 (others 0). None: the defaults (cart, purchase, ...)
    unless ``labels`` names label columns; giving both is an error."""
    labels: list[str] = field(default_factory=list)
    """Label columns (numbers or true/false) -> float32 labels named like the columns,
    instead of the ``label`` derived from event types."""
    dense: list[str] = field(default_factory=list)
    """Numeric columns -> float32 dense features named like the columns."""
    missing_dense: float | None = None
    """Value of a missing (empty / null) dense value; None: such a line is a bad line."""
    sparse: list[str] = field(default_factory=list)
    """Integer id columns (>= 0) -> sparse features of one id (missing: no id)."""
    sparse_lists: list[str] = field(default_factory=list)
    """List columns -> sparse features: JSON / Parquet lists of integers, or in CSV the ids
    joined by ``list_separator`` (``3|17|42``; surrounding ``[ ]`` allowed; empty: no ids)."""
    list_separator: str = "|"
    """Separator of the ids in a CSV list value (one character, not the CSV delimiter)."""
    history: int = 20
    """N: the session's last N earlier events in ``hist_item_ids`` / ``hist_event_types``
    (with ``hist_len``); 0: no history features."""
    keep_itemless: bool = False
    """Events with no item (empty / null item: searches, filters) stay in the session's
    history with item id ``itemless_item_id`` and their event type, but are no samples.
    False: such a line is a bad line (missing value)."""
    itemless_item_id: int = 0
    """Item id that stands for "no item" in ``hist_item_ids`` (pick one no real item has)."""

    def __post_init__(self) -> None:
        for key in ("session", "ts", "item", "event"):
            if not getattr(self, key):
                raise ConfigError(f"mapping.{key}: a column name is required")
        if self.ts_unit not in TS_UNITS:
            raise ConfigError(
                f"mapping.ts_unit: must be one of {', '.join(TS_UNITS)}, got {self.ts_unit!r}"
            )
        if self.session_ids not in SESSION_ID_MODES:
            raise ConfigError(
                f"mapping.session_ids: must be one of {', '.join(SESSION_ID_MODES)}, "
                f"got {self.session_ids!r}"
            )
        if self.history < 0:
            raise ConfigError(f"mapping.history: must be >= 0, got {self.history}")
        if self.itemless_item_id < 0:
            raise ConfigError(
                f"mapping.itemless_item_id: must be >= 0, got {self.itemless_item_id}"
            )
        if len(self.list_separator) != 1 or self.list_separator in '\r\n"[] ':
            raise ConfigError(
                f"mapping.list_separator: one character other than a quote, bracket, space or "
                f"line break, got {self.list_separator!r}"
            )
        if self.labels and self.positive_events:
            raise ConfigError(
                "mapping: give either labels (label columns) or positive_events (labels from "
                "event types), not both"
            )
        self._check_names()

    def _check_names(self) -> None:
        """Output names are the column names: valid, distinct, not a generated feature."""
        generated = {*RESERVED_NAMES, ITEM_FEATURE, *TIME_DENSE}
        if self.history:
            generated |= {*HISTORY_DENSE, *HISTORY_SPARSE}
        if not self.labels:
            generated.add(LABEL)
        seen: dict[str, str] = {}
        for key in ("labels", "dense", "sparse", "sparse_lists"):
            for name in getattr(self, key):
                if not name or not name.replace("_", "").replace("-", "").isalnum():
                    raise ConfigError(
                        f"mapping.{key}: column {name!r} cannot be a feature name (letters, "
                        "digits, _ and - only): rename the column"
                    )
                if name in generated:
                    raise ConfigError(
                        f"mapping.{key}: column {name!r} has the name of a feature ingest "
                        "writes itself: rename the column"
                    )
                if name in seen:
                    raise ConfigError(
                        f"mapping.{key}: column {name!r} is already in mapping.{seen[name]}"
                    )
                seen[name] = key

    @property
    def label_names(self) -> list[str]:
        """The label columns of the output: the label columns, or ``label``."""
        return list(self.labels) if self.labels else [LABEL]

    @property
    def positives(self) -> list[str]:
        """Event types that give label 1 (trimmed, lower-cased, sorted); [] with label columns."""
        if self.labels:
            return []
        given = DEFAULT_POSITIVE_EVENTS if self.positive_events is None else self.positive_events
        return sorted({p.strip().lower() for p in given if p.strip()})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], *, section: str = "mapping", source: str | None = None
    ) -> IngestMapping:
        """A mapping from TOML keys; one-line ConfigError naming ``[section]`` and the key."""
        return build_section(cls, data, section, source=source)

    @classmethod
    def from_toml(cls, path: Path, *, overrides: dict[str, Any] | None = None) -> IngestMapping:
        """Read a mapping TOML file (top-level keys); ``overrides`` (e.g. flags) win."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"mapping file {path} does not exist")
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
        return cls.from_dict({**data, **(overrides or {})}, source=str(path))
