"""The pipelines shipped with recd: package data, like the profiles of ``recd/profiles``.

``recd run --config NAME`` runs one by name (when NAME is no existing file); ``recd init NAME
DIR`` copies one, with the files it uses, into DIR to edit; ``recd init --list`` lists them.

Paths in a pipeline TOML: ``[run] work_dir`` is relative to the directory recd runs in; the
others (``[train] config``, ``[ingest] input``, ``[ingest] mapping``) to the TOML's directory.
A shipped pipeline run by name reads its training template (and mapping) from the installed
package, but its ``[ingest] input`` is relative to the directory recd runs in too: nothing is
read from the user's side of, or written into, the installed package.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from recd.errors import ConfigError

DIR = Path(__file__).resolve().parent
"""Where the shipped TOML files are (inside the installed package)."""


@dataclass(frozen=True, slots=True)
class ShippedPipeline:
    """One shipped pipeline and the files ``recd init`` copies for it."""

    name: str
    description: str
    files: tuple[str, ...]
    """The pipeline TOML first, then the files it uses ([train] config) or comes with."""
    example_events: str | None = None
    """The ``[ingest] input`` that ``recd init --example-events`` writes (None: no [ingest])."""

    @property
    def path(self) -> Path:
        """The shipped pipeline TOML."""
        return DIR / self.files[0]


SHIPPED: dict[str, ShippedPipeline] = {
    p.name: p
    for p in (
        ShippedPipeline(
            name="small",
            description="synthetic logs of the small profile (18k rows) -> shard -> ETL -> "
            "analyze -> train the RM1-like model (what make run runs)",
            files=("small.toml", "train_small.toml"),
        ),
        ShippedPipeline(
            name="own_data",
            description="your event log (CSV, JSON Lines, Parquet; events.csv) -> ingest -> "
            "shard -> ETL -> analyze -> train, the last hour held out",
            files=("own_data.toml", "train_own_data.toml", "own_data_mapping.toml"),
            example_events="events.csv",
        ),
        ShippedPipeline(
            name="impressions",
            description="synthetic impression logs (313k candidate rows of 13.6k requests) -> "
            "shard -> ETL -> analyze -> train the rm1 model with the history group on the "
            "clustered table, the last 6 hours held out",
            files=("impressions.toml", "train_impressions.toml"),
        ),
    )
}


def shipped_names() -> str:
    """``impressions, own_data, small``: the names, for messages."""
    return ", ".join(sorted(SHIPPED))


def shipped_pipeline(name: str) -> ShippedPipeline:
    """The shipped pipeline ``name``; ConfigError listing the names if there is none."""
    try:
        return SHIPPED[name]
    except KeyError:
        raise ConfigError(
            f"no shipped pipeline {name!r}; shipped: {shipped_names()} (recd init --list)"
        ) from None


def resolve_pipeline_config(config: str | Path) -> tuple[Path, ShippedPipeline | None]:
    """``recd run --config``'s argument: an existing file, else the name of a shipped pipeline
    (which is returned too); ConfigError in one line naming the shipped ones otherwise."""
    path = Path(config)
    if path.is_file():
        return path, None
    shipped = SHIPPED.get(str(config))
    if shipped is not None:
        return shipped.path, shipped
    what = "is a directory" if path.is_dir() else "does not exist"
    raise ConfigError(
        f"pipeline config {config} {what}, and it is no shipped pipeline name "
        f"({shipped_names()}; recd init --list describes them)"
    )
