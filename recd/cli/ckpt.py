"""``recd ckpt inspect|verify|diff|export|materialize`` and ``recd fork``: look into, check,
compare, export, materialise and branch checkpoints.

::

    recd ckpt inspect FILE [--layout-from LAYOUT_JSON] [--json]
    recd ckpt verify FILE|RUN_DIR... [--layout-from LAYOUT_JSON] [--json]
                                                                exit 0 all valid, 1 otherwise
    recd ckpt diff A B [--layout-from LAYOUT_JSON] [--json]     exit 0 identical, 1 different
    recd ckpt export FILE OUT [--format state_dict|safetensors] [--with-optimizer]
    recd ckpt materialize RUN_DIR|DELTA [--step N] --out FILE.bin [--overwrite] [--json]
    recd fork CKPT NEWDIR [--json]

Every FILE may be a full ``step_NNNNNN.bin`` or a delta ``step_NNNNNN.delta``, which stands
for its chain (the full file it starts at and every delta up to it, beside it):
``inspect`` lists the chain (base, links, sizes, each link's CRC), ``verify`` checks every
link (each delta's CRC, the base's checksum sidecar), ``diff`` and ``export`` compare and
export the state the chain restores, ``fork`` writes it as a full file in the new directory,
and ``materialize`` writes it as the full file the run would have written at that step
(byte for byte, with its checksum sidecar).

The layout (parameter names and shapes, in the checkpoint's order) comes from
``--layout-from`` or else from ``_layout.json`` beside the (first) file; without one, only
whole-region statistics are shown. Statistics (min, max, mean, std, abs-max) are over the
finite values; NaN and Inf are counted separately. ``verify`` runs the checks a resume runs:
size and header (against the layout), then the bytes against the checksum recorded beside
the file (``step_NNNNNN.bin.crc32``: a mismatch names the damaged region; a checkpoint
written before recd stored checksums has none and is reported ``checksum absent``, not
failed), then every value finite (the first NaN / infinity is named by region, tensor and
index). ``inspect`` shows the checksum's state too, without refusing a damaged file. Large
files are streamed in chunks from the memory map, so memory stays bounded.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recd.checkpoint.atomic import (
    LAYOUT_FILE,
    checkpoint_file,
    checkpoint_step,
    list_checkpoints,
    materialize_checkpoint,
    newest_valid_checkpoint,
    read_layout,
    read_layout_or_none,
)
from recd.checkpoint.chain import (
    chain_paths,
    check_finite_any,
    is_delta,
    read_any,
    validate_any,
)
from recd.checkpoint.checksum import read_checksum, verify_checksum
from recd.checkpoint.delta import read_delta
from recd.checkpoint.format import (
    REGIONS,
    Checkpoint,
    ParamLayout,
    checkpoint_size_bytes,
)
from recd.checkpoint.sidecars import fork_run
from recd.cli.output import add_json_option, emit
from recd.errors import CheckpointChecksumError, CheckpointCorruptError, CheckpointError

CHUNK_ELEMS = 1 << 22  # 4M float32 = 16 MiB per chunk


@dataclass(slots=True)
class ArrayStats:
    """Mergeable summary of a float32 range (statistics over the finite values)."""

    count: int = 0
    finite: int = 0
    nan: int = 0
    inf: int = 0
    min: float = math.inf
    max: float = -math.inf
    mean: float = 0.0
    m2: float = 0.0  # sum of squared deviations from the mean (Chan et al. merge)

    def merge(self, other: ArrayStats) -> None:
        n = self.finite + other.finite
        if other.finite:
            delta = other.mean - self.mean
            self.mean += delta * other.finite / n
            self.m2 += other.m2 + delta * delta * self.finite * other.finite / n
            self.min = min(self.min, other.min)
            self.max = max(self.max, other.max)
        self.count += other.count
        self.finite = n
        self.nan += other.nan
        self.inf += other.inf

    def to_dict(self) -> dict[str, Any]:
        has = self.finite > 0
        return {
            "count": self.count,
            "min": self.min if has else None,
            "max": self.max if has else None,
            "mean": self.mean if has else None,
            "std": math.sqrt(self.m2 / self.finite) if has else None,
            "abs_max": max(abs(self.min), abs(self.max)) if has else None,
            "nan": self.nan,
            "inf": self.inf,
        }


def summarize(array: np.ndarray) -> ArrayStats:
    """Statistics of a 1-D float32 array, streamed in chunks (float64 accumulation)."""
    total = ArrayStats()
    for start in range(0, array.size, CHUNK_ELEMS):
        chunk = np.asarray(array[start : start + CHUNK_ELEMS], dtype=np.float64)
        finite_mask = np.isfinite(chunk)
        values = chunk[finite_mask]
        nan = int(np.isnan(chunk).sum())
        part = ArrayStats(count=chunk.size, finite=values.size, nan=nan)
        part.inf = chunk.size - values.size - nan
        if values.size:
            part.min, part.max = float(values.min()), float(values.max())
            part.mean = float(values.mean())
            part.m2 = float(np.square(values - part.mean).sum())
        total.merge(part)
    return total


@dataclass(slots=True)
class DiffStats:
    """Mergeable comparison of two equal-length float32 ranges."""

    count: int = 0
    differing: int = 0
    """Elements whose 32 bits differ (so -0.0 vs 0.0 differs, identical NaNs do not)."""
    max_abs_diff: float = 0.0
    """Largest |a - b| over elements finite in both."""
    nonfinite_mismatch: int = 0
    """Elements non-finite in exactly one file, or non-finite in both with different bits."""

    def merge(self, other: DiffStats) -> None:
        self.count += other.count
        self.differing += other.differing
        self.max_abs_diff = max(self.max_abs_diff, other.max_abs_diff)
        self.nonfinite_mismatch += other.nonfinite_mismatch

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bitwise_identical": self.differing == 0}


def compare(a: np.ndarray, b: np.ndarray) -> DiffStats:
    """Bitwise and numeric differences of two 1-D float32 arrays, in chunks."""
    total = DiffStats()
    for start in range(0, a.size, CHUNK_ELEMS):
        ca, cb = (
            np.asarray(a[start : start + CHUNK_ELEMS]),
            np.asarray(b[start : start + CHUNK_ELEMS]),
        )
        differ = ca.view(np.uint32) != cb.view(np.uint32)
        part = DiffStats(count=ca.size, differing=int(differ.sum()))
        if part.differing:
            da, db = ca[differ].astype(np.float64), cb[differ].astype(np.float64)
            both = np.isfinite(da) & np.isfinite(db)
            part.nonfinite_mismatch = int((~both).sum())
            if both.any():
                part.max_abs_diff = float(np.abs(da[both] - db[both]).max())
        total.merge(part)
    return total


# ----------------------------------------------------------------------------- helpers


def _layout_for(path: Path, layout_from: str | None) -> tuple[ParamLayout | None, str | None]:
    if layout_from:
        return read_layout(layout_from), layout_from
    layout = read_layout_or_none(path.parent)
    return layout, (str(path.parent / LAYOUT_FILE) if layout is not None else None)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells)
    return "\n".join(line.rstrip() for line in lines)


def _per_tensor(
    ckpt: Checkpoint, layout: ParamLayout, fn: Any, merge_into: dict[str, Any], other: Any = None
) -> list[dict[str, Any]]:
    tensors = []
    for spec, offset in zip(layout.specs, layout.offsets, strict=True):
        sl = slice(offset, offset + spec.numel)
        regions = {}
        for region in REGIONS:
            args = (ckpt.region(region)[sl],) + ((other.region(region)[sl],) if other else ())
            result = fn(*args)
            merge_into[region].merge(result)
            regions[region] = result.to_dict()
        tensors.append(
            {
                "name": spec.name,
                "shape": list(spec.shape),
                "offset": offset,
                "numel": spec.numel,
                "regions": regions,
            }
        )
    return tensors


# ----------------------------------------------------------------------------- inspect


def chain_report(file: Path) -> dict[str, Any] | None:
    """A delta's chain, as ``inspect`` shows it (None for a full file): the base (name, size,
    its checksum's state) and every delta (name, step, parent, blocks, rows, elements, size,
    whether its bytes match the CRC in its header), base first. A missing or torn link raises
    ``CheckpointCorruptError`` naming it; a CRC mismatch is reported, not raised."""
    if not is_delta(file):
        return None
    paths = chain_paths(file)
    base = paths[0]
    base_checksum: str
    try:
        base_checksum = verify_checksum(base)
    except CheckpointChecksumError as exc:
        base_checksum = f"MISMATCH: {exc}"
    links = []
    for path in paths[1:]:
        delta = read_delta(path, verify=False)
        try:
            read_delta(path, verify=True)
            crc = "ok"
        except CheckpointCorruptError as exc:
            crc = f"MISMATCH: {exc}"
        links.append(
            {
                "file": path.name,
                "step": delta.step,
                "parent": delta.parent,
                "blocks": len(delta.blocks),
                "rows": sum(len(b.rows) for b in delta.blocks),
                "elements": sum(b.n_elems for b in delta.blocks),
                "size_bytes": path.stat().st_size,
                "crc": crc,
            }
        )
    return {
        "base": base.name,
        "base_step": checkpoint_step(base),
        "base_size_bytes": base.stat().st_size,
        "base_checksum": base_checksum,
        "links": links,
        "size_bytes": sum(p.stat().st_size for p in paths),
    }


def _chain_checksum(chain: dict[str, Any]) -> str:
    """One word for a chain's checksums: a mismatch anywhere, else the base's state."""
    bad = [link["file"] for link in chain["links"] if link["crc"] != "ok"]
    if str(chain["base_checksum"]).startswith("MISMATCH"):
        bad.insert(0, chain["base"])
    if bad:
        return f"MISMATCH in {', '.join(bad)}"
    return f"{chain['base_checksum']} (base sidecar), {len(chain['links'])} delta CRCs ok"


def inspect_checkpoint(path: str, layout_from: str | None = None) -> dict[str, Any]:
    """Everything ``recd ckpt inspect`` prints, as a JSON-ready dict. A delta shows the state
    its chain restores and ``chain`` (:func:`chain_report`); a full file has ``chain`` None."""
    file = Path(path)
    layout, layout_source = _layout_for(file, layout_from)
    chain = chain_report(file)
    ckpt = read_any(file, layout, verify=False)  # the CRCs are reported, not enforced
    regions: dict[str, ArrayStats] = {r: ArrayStats() for r in REGIONS}
    if layout is not None:
        tensors = _per_tensor(ckpt, layout, summarize, regions)
    else:
        tensors = []
        for r in REGIONS:
            regions[r] = summarize(ckpt.region(r))
    checksum: str
    if chain is not None:
        checksum = _chain_checksum(chain)
    else:
        try:
            checksum = verify_checksum(file)
        except CheckpointChecksumError as exc:
            checksum = f"MISMATCH: {exc}"
    return {
        "path": str(file),
        "step": ckpt.step,
        "n_params": ckpt.n_params,
        "size_bytes": file.stat().st_size,
        "checksum": checksum,
        "layout": layout_source,
        "chain": chain,
        "regions": {r: s.to_dict() for r, s in regions.items()},
        "tensors": tensors,
    }


_STAT_COLUMNS = ["min", "max", "mean", "std", "abs_max", "nan", "inf"]


def _print_inspect(report: dict[str, Any]) -> None:
    print(f"file      {report['path']}")
    print(f"step      {report['step']:,}")
    print(f"n_params  {report['n_params']:,}")
    chain = report.get("chain")
    if chain is None:
        print(f"size      {report['size_bytes']:,} bytes (8 + 12 * n_params)")
    else:
        full = checkpoint_size_bytes(report["n_params"])
        print(
            f"size      {report['size_bytes']:,} bytes (this delta); chain "
            f"{chain['size_bytes']:,} bytes in {len(chain['links']) + 1} files (a full file: "
            f"{full:,})"
        )
    print(f"checksum  {report['checksum']}")
    print(f"layout    {report['layout'] or '- (no _layout.json; pass --layout-from)'}")
    if chain is not None:
        print(
            f"\nchain: base {chain['base']} ({chain['base_size_bytes']:,} bytes, checksum "
            f"{chain['base_checksum']}), then {len(chain['links'])} delta(s) in order:"
        )
        rows = [
            [link[c] for c in ("file", "step", "parent", "blocks", "rows", "elements")]
            + [link["size_bytes"], link["crc"]]
            for link in chain["links"]
        ]
        header = ["delta", "step", "parent", "blocks", "rows", "elements", "bytes", "crc"]
        print(_table(header, rows))
    print()
    rows = [[r] + [s[c] for c in _STAT_COLUMNS] for r, s in report["regions"].items()]
    print(_table(["region", *_STAT_COLUMNS], rows))
    if report["tensors"]:
        print("\ntensors in checkpoint order (elements [start, end) of each region):")
        rows = []
        for i, t in enumerate(report["tensors"]):
            for region, s in t["regions"].items():
                rows.append(
                    [
                        i,
                        t["name"],
                        "x".join(map(str, t["shape"])) or "scalar",
                        f"[{t['offset']}, {t['offset'] + t['numel']})",
                        region,
                    ]
                    + [s[c] for c in _STAT_COLUMNS]
                )
        print(_table(["#", "name", "shape", "range", "region", *_STAT_COLUMNS], rows))


def run_inspect(args: argparse.Namespace) -> int:
    report = inspect_checkpoint(args.file, args.layout_from)
    emit(args, report, lambda: _print_inspect(report))
    return 0


# ----------------------------------------------------------------------------- verify


def verify_checkpoints(paths: list[str], layout_from: str | None = None) -> list[dict[str, Any]]:
    """What ``recd ckpt verify`` prints: one ``{"path", "ok", "step", "checksum", "chain",
    "error"}`` per file, a run directory standing for all its checkpoints (newest first, the
    order a resume tries them). ``checksum``: ``"ok"``, ``"absent"`` (no sidecar: written
    before recd stored checksums; not a failure), ``"mismatch"``, or None when the size/header
    checks failed first. A delta is checked with its whole chain (``chain``: its files, base
    first; None for a full file): every link present, sized and linked right, every delta's
    CRC (a mismatch: ``"mismatch"``), the base's sidecar (its state is ``checksum``), then
    the values the chain restores all finite.
    """
    files: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found = list_checkpoints(path)
            if not found:
                raise CheckpointError(
                    f"{path}: no checkpoints (step_NNNNNN.bin or .delta) in this directory"
                )
            files.extend(reversed(found))
        else:
            files.append(path)
    reports = []
    for file in files:
        layout, _ = _layout_for(file, layout_from)
        report: dict[str, Any] = {
            "path": str(file),
            "ok": False,
            "step": None,
            "checksum": None,
            "chain": None,
        }
        try:
            if is_delta(file):
                report["chain"] = [p.name for p in chain_paths(file)]
            report["step"] = validate_any(file, layout).step  # a chain: sizes, headers, links
            try:
                if is_delta(file):
                    validate_any(file, layout, verify=True)  # every delta's CRC, base sidecar
                    base = chain_paths(file)[0]
                    report["checksum"] = "absent" if read_checksum(base) is None else "ok"
                else:
                    report["checksum"] = verify_checksum(file)
            except CheckpointCorruptError:
                report["checksum"] = "mismatch"
                raise
            check_finite_any(file, layout)
        except CheckpointCorruptError as exc:
            reports.append({**report, "error": str(exc)})
        else:
            reports.append({**report, "ok": True, "error": None})
    return reports


def run_verify(args: argparse.Namespace) -> int:
    reports = verify_checkpoints(args.paths, args.layout_from)

    def show() -> None:
        for r in reports:
            if r["ok"]:
                chain = f", chain of {len(r['chain'])} files" if r.get("chain") else ""
                print(f"ok    {r['path']} (step {r['step']:,}, checksum {r['checksum']}{chain})")
            else:
                print(f"FAIL  {r['error']}")

    emit(args, reports, show)
    return 0 if all(r["ok"] for r in reports) else 1


# ----------------------------------------------------------------------------- diff


def diff_checkpoints(path_a: str, path_b: str, layout_from: str | None = None) -> dict[str, Any]:
    """Everything ``recd ckpt diff`` prints, as a JSON-ready dict."""
    file_a, file_b = Path(path_a), Path(path_b)
    layout, layout_source = _layout_for(file_a, layout_from)
    a = read_any(file_a, layout)  # a delta: the state its chain restores (CRCs checked)
    b = read_any(file_b)
    if a.n_params != b.n_params:
        raise CheckpointError(
            f"cannot diff {file_a} ({a.n_params:,} params) and {file_b} ({b.n_params:,} params): "
            "different models (n_params must be equal)"
        )
    regions: dict[str, DiffStats] = {r: DiffStats() for r in REGIONS}
    if layout is not None:
        tensors = _per_tensor(a, layout, compare, regions, other=b)
    else:
        tensors = []
        for r in REGIONS:
            regions[r] = compare(a.region(r), b.region(r))
    identical = a.step == b.step and all(s.differing == 0 for s in regions.values())
    return {
        "a": str(file_a),
        "b": str(file_b),
        "chain_a": [p.name for p in chain_paths(file_a)] if is_delta(file_a) else None,
        "chain_b": [p.name for p in chain_paths(file_b)] if is_delta(file_b) else None,
        "step_a": a.step,
        "step_b": b.step,
        "n_params": a.n_params,
        "layout": layout_source,
        "bitwise_identical": identical,
        "regions": {r: s.to_dict() for r, s in regions.items()},
        "tensors": tensors,
    }


_DIFF_COLUMNS = ["max_abs_diff", "differing", "nonfinite_mismatch", "bitwise_identical"]


def _print_diff(report: dict[str, Any]) -> None:
    for side in ("a", "b"):
        chain = report.get(f"chain_{side}")
        via = f", chain {' + '.join(chain)}" if chain else ""
        print(f"{side}         {report[side]} (step {report[f'step_{side}']:,}{via})")
    print(f"n_params  {report['n_params']:,}")
    print(f"layout    {report['layout'] or '-'}")
    print()
    rows = [[r] + [_yes(s[c]) for c in _DIFF_COLUMNS] for r, s in report["regions"].items()]
    print(_table(["region", *_DIFF_COLUMNS], rows))
    if report["tensors"]:
        print("\ntensors in checkpoint order:")
        rows = [
            [i, t["name"], region] + [_yes(s[c]) for c in _DIFF_COLUMNS]
            for i, t in enumerate(report["tensors"])
            for region, s in t["regions"].items()
        ]
        print(_table(["#", "name", "region", *_DIFF_COLUMNS], rows))
    print(f"\nbitwise identical (header and all regions): {_yes(report['bitwise_identical'])}")


def _yes(value: Any) -> Any:
    return ("yes" if value else "no") if isinstance(value, bool) else value


def run_diff(args: argparse.Namespace) -> int:
    report = diff_checkpoints(args.a, args.b, args.layout_from)
    emit(args, report, lambda: _print_diff(report))
    return 0 if report["bitwise_identical"] else 1


# ----------------------------------------------------------------------------- export


def run_export(args: argparse.Namespace) -> int:
    from recd.checkpoint.export import export_checkpoint

    path = Path(args.file)
    layout, source = _layout_for(path, args.layout_from)
    if layout is None:
        raise CheckpointError(
            f"{path}: no {LAYOUT_FILE} beside it to name the tensors; pass --layout-from"
        )
    report = export_checkpoint(
        path,
        args.out,
        layout,
        fmt=args.format,
        with_optimizer=args.with_optimizer,
        overwrite=args.overwrite,
    )
    print(
        f"exported {path} (step {report.step:,}, layout {source}): {report.tensors} tensors, "
        f"{report.bytes / 1e6:,.1f} MB -> {report.out} ({args.format})"
    )
    return 0


# ----------------------------------------------------------------------------- fork


def run_fork(args: argparse.Namespace) -> int:
    result = fork_run(args.checkpoint, args.new_dir)

    def show() -> None:
        print(f"forked {result.source} (step {result.step:,}, sha256 {result.sha256[:16]}...)")
        if result.chain:
            print(f"    materialised from its chain: {' + '.join(result.chain)}")
        print(f"    -> {result.checkpoint}")
        print(
            f"new run directory {result.run_dir}: fresh .state.json and .loss.json with the origin"
        )

    body = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(result).items()}
    emit(args, body, show)
    return 0


# ----------------------------------------------------------------------------- materialize


def materialize(
    path: str | Path,
    out: str | Path,
    *,
    step: int | None = None,
    layout_from: str | None = None,
    overwrite: bool = False,
    announce: Any = None,
) -> dict[str, Any]:
    """What ``recd ckpt materialize`` does: the full flat file of a checkpoint (a delta's
    chain applied) written to ``out`` with its checksum sidecar; returns the report.

    ``path``: a checkpoint file (a delta, or a full file: copied, verified), or a run
    directory: its checkpoint of ``step`` (full or delta), by default its newest valid one.
    ``announce(line)`` is called once every link is checked, before the work (a progress
    line).
    ``CheckpointError`` (one line) on bad input: no such checkpoint, a torn, missing or damaged
    link (named), a step that does not match, ``out`` existing without ``overwrite``.
    """
    source = Path(path)
    if source.is_dir():
        if step is not None:
            found = checkpoint_file(source, step)
            if found is None:
                raise CheckpointError(
                    f"{source}: no checkpoint of step {step} (step_{step:06d}.bin or "
                    f"step_{step:06d}.delta)"
                )
        else:
            found = newest_valid_checkpoint(source)
            if found is None:
                raise CheckpointError(
                    f"{source}: no checkpoints (step_NNNNNN.bin or .delta) in this directory"
                )
        source = found
    elif not source.is_file():
        raise CheckpointError(f"{source}: no such checkpoint file or run directory")
    elif step is not None and checkpoint_step(source) not in (None, step):
        raise CheckpointError(
            f"{source} is the checkpoint of step {checkpoint_step(source)}, not --step {step}"
        )
    target = Path(out)
    if target.is_dir():
        raise CheckpointError(f"{target}: is a directory; --out names the file to write")
    if target.exists() and not overwrite:
        raise CheckpointError(f"{target}: already exists; pass --overwrite to replace it")
    layout, layout_source = _layout_for(source, layout_from)
    chain = chain_paths(source)
    validate_any(source, layout, verify=True)  # every link, before a line is printed
    if not is_delta(source):
        verify_checksum(source)
    if announce is not None:
        links = len(chain) - 1
        what = f"{chain[0].name} + {links} delta(s)" if links else f"{chain[0].name} (full file)"
        announce(f"materializing {source.name}: {what} -> {target}")
    made = materialize_checkpoint(source, target, layout=layout, verify=False)  # checked above
    header = validate_any(made)
    return {
        "source": str(source),
        "step": header.step,
        "n_params": header.n_params,
        "chain": [p.name for p in chain],
        "layout": layout_source,
        "out": str(made),
        "size_bytes": header.size_bytes,
        "checksum": str(made.with_name(made.name + ".crc32")),
    }


def run_materialize(args: argparse.Namespace) -> int:
    import sys

    def announce(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = materialize(
        args.source,
        args.out,
        step=args.step,
        layout_from=args.layout_from,
        overwrite=args.overwrite,
        announce=announce,
    )

    def show() -> None:
        print(
            f"materialized {report['source']} (step {report['step']:,}, "
            f"{len(report['chain'])} file(s) in its chain) -> {report['out']} "
            f"({report['size_bytes']:,} bytes, checksum {Path(report['checksum']).name})"
        )

    emit(args, report, show)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    ckpt = sub.add_parser(
        "ckpt",
        help="inspect, verify, compare, export and materialize checkpoints (step_NNNNNN.bin, "
        "and step_NNNNNN.delta with its chain)",
    )
    verbs = ckpt.add_subparsers(dest="ckpt_command", metavar="VERB", required=True)

    inspect = verbs.add_parser("inspect", help="header, size and per-region/per-tensor statistics")
    inspect.add_argument(
        "file", help="a step_NNNNNN.bin checkpoint, or a step_NNNNNN.delta (shows its chain)"
    )
    inspect.add_argument("--layout-from", metavar="LAYOUT_JSON", help="a _layout.json to use")
    add_json_option(inspect)
    inspect.set_defaults(func=run_inspect)

    verify = verbs.add_parser(
        "verify",
        help="check checkpoints as a resume does: size, header, layout, checksum, finite "
        "values (exit 0 all valid, 1 otherwise)",
    )
    verify.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="step_NNNNNN.bin / step_NNNNNN.delta files (a delta: its whole chain) or run "
        "directories",
    )
    verify.add_argument("--layout-from", metavar="LAYOUT_JSON", help="a _layout.json to use")
    add_json_option(verify)
    verify.set_defaults(func=run_verify)

    diff = verbs.add_parser("diff", help="compare two checkpoints (exit 0 identical, 1 different)")
    diff.add_argument("a", help="first checkpoint")
    diff.add_argument("b", help="second checkpoint (same n_params)")
    diff.add_argument("--layout-from", metavar="LAYOUT_JSON", help="a _layout.json to use")
    add_json_option(diff)
    diff.set_defaults(func=run_diff)

    export = verbs.add_parser(
        "export",
        help="write a checkpoint's weights as a torch state_dict or a safetensors file",
        description=(
            "The weights under the model's parameter names (from _layout.json beside the file "
            "or --layout-from): model.load_state_dict(torch.load(OUT)) on a model built from "
            "the same config. --with-optimizer adds Adam m and v (adam_m.<name>, adam_v.<name>)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    export.add_argument("file", help="a step_NNNNNN.bin checkpoint or a step_NNNNNN.delta")
    export.add_argument("out", type=Path, help="file to write")
    export.add_argument(
        "--format", choices=("state_dict", "safetensors"), default="state_dict", help="file format"
    )
    export.add_argument("--with-optimizer", action="store_true", help="also Adam m and v")
    export.add_argument("--layout-from", metavar="LAYOUT_JSON", help="a _layout.json to use")
    export.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    export.set_defaults(func=run_export)

    materialize_ = verbs.add_parser(
        "materialize",
        help="write a delta checkpoint's chain as one full step_NNNNNN.bin",
        description=(
            "The full flat file of a checkpoint: a delta's chain (the full file it starts at "
            "and every delta up to it) applied, written with its checksum sidecar; byte for "
            "byte the full checkpoint the run would have written at that step. Every link is "
            "checked first (each delta's CRC, the base's sidecar): a torn, missing or damaged "
            "one stops it (exit 2) naming the file."
        ),
    )
    materialize_.add_argument(
        "source",
        metavar="RUN_DIR_OR_DELTA",
        help="a step_NNNNNN.delta (or .bin), or a run directory (its newest valid checkpoint, "
        "or the one of --step)",
    )
    materialize_.add_argument(
        "--step", type=int, default=None, help="with a run directory: the checkpoint of this step"
    )
    materialize_.add_argument(
        "--out", type=Path, required=True, metavar="FILE.bin", help="the full file to write"
    )
    materialize_.add_argument(
        "--layout-from", metavar="LAYOUT_JSON", help="a _layout.json to check n_params against"
    )
    materialize_.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    add_json_option(materialize_)
    materialize_.set_defaults(func=run_materialize)

    fork = sub.add_parser("fork", help="start a new run directory from one checkpoint (audit fork)")
    fork.add_argument(
        "checkpoint",
        help="the step_NNNNNN.bin to branch from, or a step_NNNNNN.delta (written to NEWDIR "
        "as a full .bin)",
    )
    fork.add_argument("new_dir", help="new run directory (must not exist or be empty)")
    add_json_option(fork)
    fork.set_defaults(func=run_fork)
