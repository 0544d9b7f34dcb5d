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

An impression log (one request scores several candidate items) comes in one of two shapes:
one row per request with a candidate list (``candidates``, with parallel per-candidate lists
``candidate_dense`` / ``candidate_sparse`` / ``candidate_labels`` or the ``clicked`` item), or
one row per candidate with a request key (``request``). For example::

    session = "session_id"
    ts = "timestamp"
    item = "reference"                  # the item of an interaction (history) event
    event = "action_type"
    candidates = "impressions"          # "3|17|42": a request, one sample per candidate
    candidate_dense = ["prices"]        # "120|89|240": one price per candidate
    clicked = "reference"               # label 1 on the candidate equal to it
    sparse = ["platform", "city"]       # request-level: mapped once, on every candidate
    history = 20                        # the session's last 20 interactions before a request

A key that is not a field, or a value of the wrong type, is a ``ConfigError`` of one line that
names the section (``[mapping]`` / ``[ingest.mapping]``), the key and what was expected.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recd.config_types import build_section, load_toml
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
HISTORY_GROUP = "history"  # the catalogue group of the histories ingest builds


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
    """``auto``, ``ms``, ``s`` or ``iso``: auto picks per file (numbers: the unit most of them
    have, ms for a magnitude >= 1e11; a file of both kinds has bad lines)."""
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
    histories: dict[str, list[str]] = field(default_factory=dict)
    """History columns the log already has: group name -> list columns (ids, oldest first, like
    ``sparse_lists``). Each group is catalogued as one synchronised history group, which the
    ``rm1`` model pools with one transformer (``{recent = ["past_items", "past_actions"]}``)."""
    request: str = ""
    """Impression logs, one row per candidate: the request-key column. Rows of a session with
    one key are one request's candidates, in file order, sharing its ``request_id`` (the key:
    an integer, or a string's stable hash) and the ``ts`` of its first row; a row with an
    empty key is an interaction event (history only, keeping its item). With ``candidates``:
    the request id of each request row (default: its line number)."""
    candidates: str = ""
    """Impression logs, one row per request: the candidate-list column (item ids, like
    ``sparse_lists``). A row with candidates is a request: one sample per candidate, in list
    order, sharing the row's ``request_id``, ``ts`` and request-level features (``dense``,
    ``sparse``, ``sparse_lists``, ``histories``). A row without is an interaction event
    (history only, keeping its item); without an ``item`` column every row must have
    candidates."""
    candidate_dense: list[str] = field(default_factory=list)
    """Impression logs (``candidates``): list columns parallel to the candidate list, one
    number per candidate -> float32 dense features named like the columns (prices)."""
    candidate_sparse: list[str] = field(default_factory=list)
    """Impression logs (``candidates``): list columns parallel to the candidate list, one id
    per candidate -> sparse features of one id per candidate."""
    candidate_labels: list[str] = field(default_factory=list)
    """Impression logs (``candidates``): list columns parallel to the candidate list, one
    label per candidate (numbers or true/false) -> float32 labels named like the columns."""
    clicked: str = ""
    """Impression logs (``candidates``): the column of the clicked item: ``label`` = 1 on the
    candidate equal to it, 0 on the others; empty: no click. A clicked item that is not in
    the row's list makes the row bad."""
    position: str = "position"
    """Impression logs: the float32 dense feature holding each candidate's 0-based place in
    its request's list; "" for none."""

    def __post_init__(self) -> None:
        for key in ("session", "ts"):
            if not getattr(self, key):
                raise ConfigError(f"mapping.{key}: a column name is required")
        if not self.item and not self.candidates:
            raise ConfigError("mapping.item: a column name is required (or mapping.candidates)")
        if not self.event and not self.label_columns:
            raise ConfigError(
                "mapping.event: a column name is required unless the labels come from label "
                "columns (labels, candidate_labels or clicked)"
            )
        if not self.event and self.positive_events:
            raise ConfigError("mapping.positive_events: labels from event types need mapping.event")
        self._check_impressions()
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

    def _check_impressions(self) -> None:
        """The keys of impression logs: which go together, and where labels come from."""
        per_candidate = {
            "candidate_dense": self.candidate_dense,
            "candidate_sparse": self.candidate_sparse,
            "candidate_labels": self.candidate_labels,
            "clicked": self.clicked,
        }
        if not self.candidates:
            given = [k for k, v in per_candidate.items() if v]
            if given:
                raise ConfigError(
                    f"mapping.{given[0]}: per-candidate lists need mapping.candidates (the "
                    "candidate-list column of a log with one row per request)"
                )
            return
        if self.candidate_labels and self.clicked:
            raise ConfigError(
                "mapping: give either candidate_labels or clicked (the labels of the candidates), "
                "not both"
            )
        if not self.candidate_labels and not self.clicked:
            raise ConfigError(
                "mapping.candidates: the candidates' labels come from candidate_labels (lists "
                "parallel to the candidates) or clicked (the clicked item's column)"
            )
        if self.labels or self.positive_events:
            key = "labels" if self.labels else "positive_events"
            raise ConfigError(
                f"mapping.{key}: a log with one row per request labels its candidates with "
                "candidate_labels or clicked, not with request-level labels"
            )
        if self.history and not self.item:
            raise ConfigError(
                "mapping.history: histories are built from the items of interaction events "
                "(mapping.item); set history = 0, or declare history columns in "
                "mapping.histories"
            )

    @property
    def impressions(self) -> bool:
        """An impression log: candidates (one row per request) or a request key (one per
        candidate)."""
        return bool(self.candidates or self.request)

    @property
    def label_columns(self) -> list[str]:
        """Columns the labels come from (empty: the event types)."""
        return [*self.labels, *self.candidate_labels, *([self.clicked] if self.clicked else [])]

    @property
    def history_columns(self) -> list[str]:
        """The declared history columns (``histories``), group by group."""
        return [c for columns in self.histories.values() for c in columns]

    @property
    def hist_sparse(self) -> tuple[str, ...]:
        """The history features ingest builds: items, and event types when there is an event
        column; () without a history."""
        if not self.history:
            return ()
        return HISTORY_SPARSE if self.event else HISTORY_SPARSE[:1]

    def _check_names(self) -> None:
        """Output names are the column names: valid, distinct, not a generated feature."""
        generated = {*RESERVED_NAMES, ITEM_FEATURE, *TIME_DENSE}
        if self.history:
            generated |= {*HISTORY_DENSE, *self.hist_sparse}
        if not self.labels and not self.candidate_labels:  # label from events or clicked
            generated.add(LABEL)
        if self.impressions and self.position:
            if not _is_name(self.position):
                raise ConfigError(
                    f"mapping.position: {self.position!r} cannot be a feature name (letters, "
                    'digits, _ and - only; "" for no position feature)'
                )
            if self.position in generated:
                raise ConfigError(
                    f"mapping.position: {self.position!r} is a feature ingest writes itself"
                )
            generated.add(self.position)
        seen: dict[str, str] = {}
        for key in (
            "labels",
            "dense",
            "sparse",
            "sparse_lists",
            "candidate_dense",
            "candidate_sparse",
            "candidate_labels",
            "histories",
        ):
            names = self.history_columns if key == "histories" else getattr(self, key)
            for name in names:
                if not _is_name(name):
                    raise ConfigError(
                        f"mapping.{key}: column {name!r} cannot be a feature name (letters, "
                        "digits, _ and - only): rename the column"
                    )
                if name in generated:
                    hint = (
                        ' (or set mapping.position = "" or another name)'
                        if name == self.position and self.impressions
                        else ""
                    )
                    raise ConfigError(
                        f"mapping.{key}: column {name!r} has the name of a feature ingest "
                        f"writes itself: rename the column{hint}"
                    )
                if name in seen:
                    raise ConfigError(
                        f"mapping.{key}: column {name!r} is already in mapping.{seen[name]}"
                    )
                seen[name] = key
        for group, columns in self.histories.items():
            if not _is_name(group):
                raise ConfigError(
                    f"mapping.histories: group name {group!r}: letters, digits, _ and - only"
                )
            if group == HISTORY_GROUP and self.history:
                raise ConfigError(
                    f"mapping.histories: group {group!r} is the group of the history ingest "
                    "builds (mapping.history); name yours otherwise"
                )
            if not columns:
                raise ConfigError(f"mapping.histories.{group}: name at least one list column")

    @property
    def label_names(self) -> list[str]:
        """The label columns of the output: the label columns, or ``label`` (from the event
        types, or from ``clicked``)."""
        if self.labels or self.candidate_labels:
            return [*self.labels, *self.candidate_labels]
        return [LABEL]

    @property
    def positives(self) -> list[str]:
        """Event types that give label 1 (trimmed, lower-cased, sorted); [] with label columns."""
        if self.label_columns:
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
        data = load_toml(path, "mapping file")
        return cls.from_dict({**data, **(overrides or {})}, source=str(path))


def _is_name(name: str) -> bool:
    """A valid feature (column) name: letters, digits, ``_`` and ``-``."""
    return bool(name) and name.replace("_", "").replace("-", "").isalnum()
