"""Files that land whole or not at all, and survive a power cut once written.

Every file recd writes for others to read goes through here: write a temp file beside the
final name (``.<name>.tmp-<tag>``, a dot file no listing mistakes for the real one), fsync it,
``os.replace`` it onto the final name (atomic on POSIX), fsync the directory. A directory tree
is replaced the same way with one rename. The standard library has the pieces but no helper
that does all four steps, so they are written once here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

TEMP_MARKER = ".tmp-"
_TEMP_NAME_RE = re.compile(r"^\..+\.tmp-[A-Za-z0-9_.-]+$")


def temp_path_for(final_path: str | os.PathLike[str], tag: str | None = None) -> Path:
    """``<dir>/.<name>.tmp-<tag>`` beside ``final_path``; ``tag`` defaults to this process id.

    In a distributed save all ranks must write the same temp file: pick one tag for the job
    (e.g. ``f"job{job_id}-step{step}"``) and pass it on every rank.
    """
    final = Path(final_path)
    tag = str(os.getpid()) if tag is None else tag
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", tag):
        raise ValueError(f"temp tag {tag!r}: use letters, digits, '_', '.', '-' only")
    return final.parent / f".{final.name}{TEMP_MARKER}{tag}"


def is_temp_name(name: str) -> bool:
    """True for names ``temp_path_for`` produces (and only those)."""
    return bool(_TEMP_NAME_RE.match(name))


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """fsync a directory so the renames and creations inside it are durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(tmp_path: str | os.PathLike[str], final_path: str | os.PathLike[str]) -> Path:
    """fsync ``tmp_path``, rename it onto ``final_path``, fsync the directory."""
    tmp, final = Path(tmp_path), Path(final_path)
    if tmp.parent.resolve() != final.parent.resolve():
        raise ValueError(f"{tmp} and {final} must be in the same directory for an atomic rename")
    fsync_file(tmp)
    os.replace(tmp, final)
    fsync_directory(final.parent)
    return final


@contextlib.contextmanager
def replacing(
    path: str | os.PathLike[str], *, suffix: str = "", durable: bool = True
) -> Iterator[Path]:
    """Write a file whole or not at all: yields a temp path beside ``path`` (``suffix`` added
    for writers that insist on one, e.g. ``.npz``); when the block ends normally the temp file
    is renamed onto ``path``, else it is removed. ``durable``: fsync the file before the
    rename and the directory after it (off for files that only coordinate live processes).
    Every file recd writes for others to read goes through here."""
    final = Path(path)
    tmp = temp_path_for(final)
    tmp = tmp.with_name(tmp.name + suffix)
    try:
        yield tmp
        if durable:
            fsync_file(tmp)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        fsync_directory(final.parent)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> Path:
    """Replace ``path`` with ``data`` atomically (and durably, see :func:`replacing`)."""
    with replacing(path, durable=durable) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> Path:
    """Replace ``path`` with ``obj`` as JSON (strict: no NaN) atomically and durably."""
    text = json.dumps(obj, indent=1, allow_nan=False, sort_keys=False) + "\n"
    return write_bytes_atomic(path, text.encode())


def sha256_file(path: str | os.PathLike[str], *, chunk_bytes: int = 16 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def copy_bytes(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    each: Callable[[bytes], object] | None = None,
    durable: bool = False,
) -> str:
    """Copy ``src`` into ``dst`` (created or truncated; no rename) in 16 MiB chunks, handing
    each chunk to ``each`` too (e.g. a checksum); fsync it with ``durable``. Returns the
    sha256 of the bytes copied."""
    digest = hashlib.sha256()
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(16 << 20):
            digest.update(chunk)
            if each is not None:
                each(chunk)
            fout.write(chunk)
        if durable:
            fout.flush()
            os.fsync(fout.fileno())
    return digest.hexdigest()


def copy_file_atomic(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> str:
    """Copy ``src`` to ``dst`` atomically and durably; returns the sha256 of the bytes copied."""
    final = Path(dst)
    tmp = temp_path_for(final)
    try:
        sha256 = copy_bytes(src, tmp, durable=True)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(final.parent)
    return sha256


@contextlib.contextmanager
def replace_dir_atomically(out_dir: Path) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``out_dir``; on success it replaces ``out_dir``.

    The new tree becomes visible with one rename; an old ``out_dir`` is first renamed aside and
    then deleted, so readers see either the old or the new complete tree, never a mix. On error
    the temporary directory is removed and ``out_dir`` is left untouched.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{tag}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out_dir.parent / f".{out_dir.name}.old-{tag}"
    if out_dir.exists():
        out_dir.rename(old)
    tmp.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)
