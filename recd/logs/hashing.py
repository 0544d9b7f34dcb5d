"""Stable 64-bit hashing, vectorised over numpy arrays.

* ``splitmix64``: a strong 64-bit mixer (the SplitMix64 finaliser). Sequential ids (session 1,
  2, 3...) come out as unrelated 64-bit values, so anything keyed on them spreads evenly.
* ``jump_hash``: Jump Consistent Hash (Lamping & Veach, 2014) of an array of keys into
  ``num_buckets`` buckets. It is *consistent*: growing K to K+1 buckets moves only ~1/(K+1) of the
  keys, and every moved key moves to the new bucket K. ``jump_hash_scalar`` is the paper's loop
  in plain Python, the reference the vectorised version is tested against.
* ``hash_strings``: a stable (seed-free, platform-independent) 63-bit hash of strings, used to
  turn string session ids into int64 ids reproducibly (FNV-1a over the UTF-8 bytes, then
  SplitMix64).

All arithmetic is modulo 2**64 on ``uint64`` arrays; numpy wraps on overflow by design.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_JUMP_MULT = np.uint64(2862933555777941757)
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_INT63_MASK = np.uint64((1 << 63) - 1)


def as_uint64(keys: np.ndarray) -> np.ndarray:
    """View int64 keys as uint64 (two's complement bits), copying only if the dtype differs."""
    keys = np.asarray(keys)
    if keys.dtype == np.uint64:
        return keys
    if keys.dtype == np.int64:
        return keys.view(np.uint64)
    return keys.astype(np.int64).view(np.uint64)


def splitmix64(keys: np.ndarray) -> np.ndarray:
    """SplitMix64 of every key: (N,) int64/uint64 -> (N,) uint64."""
    with np.errstate(over="ignore"):
        z = as_uint64(keys) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


def splitmix64_scalar(key: int) -> int:
    """Plain-Python SplitMix64 (the reference for ``splitmix64``)."""
    z = (key + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def jump_hash(keys: np.ndarray, num_buckets: int) -> np.ndarray:
    """Jump Consistent Hash of every key: (N,) uint64 -> (N,) int64 buckets in [0, num_buckets).

    Runs the paper's loop for all keys at once, dropping keys once their jump passes
    ``num_buckets``; the expected number of rounds is ~ln(num_buckets) + 1. Keys should be well
    mixed (pass them through ``splitmix64`` first): the loop itself uses a weak LCG.
    """
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    key = as_uint64(keys).copy()
    n = key.shape[0]
    b = np.full(n, -1, dtype=np.int64)
    j = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    with np.errstate(over="ignore"):
        while active.size:
            b_a = j[active]
            k_a = key[active] * _JUMP_MULT + np.uint64(1)
            denom = ((k_a >> np.uint64(33)) + np.uint64(1)).astype(np.float64)
            j_a = np.floor((b_a + 1).astype(np.float64) * (float(1 << 31) / denom)).astype(np.int64)
            b[active] = b_a
            key[active] = k_a
            j[active] = j_a
            active = active[j_a < num_buckets]
    return b


def jump_hash_scalar(key: int, num_buckets: int) -> int:
    """Jump Consistent Hash of one key, exactly as in the paper (the reference)."""
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    key &= MASK64
    b, j = -1, 0
    while j < num_buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & MASK64
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def shard_of(keys: np.ndarray, num_shards: int) -> np.ndarray:
    """The shard of every key: ``jump_hash(splitmix64(keys), num_shards)``."""
    return jump_hash(splitmix64(keys), num_shards)


def hash_strings(strings: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Stable 63-bit hash of every string: (N,) strings -> (N,) non-negative int64.

    FNV-1a over the UTF-8 bytes, then SplitMix64, then the top bit cleared so the result is a
    valid non-negative int64 id. Deterministic across runs, processes and machines (unlike
    Python's ``hash``). Nulls hash like the empty string; callers reject them first. Each
    distinct string is hashed once (dictionary encoding), byte position by byte position over
    the strings still that long, so the cost is O(distinct bytes), with no per-string loop.
    """
    if isinstance(strings, pa.ChunkedArray):
        strings = strings.combine_chunks()
    encoded = pc.dictionary_encode(pc.cast(strings, pa.large_binary()))
    dictionary: pa.LargeBinaryArray = encoded.dictionary
    unique_hashes = _fnv1a_splitmix(dictionary)
    indices = pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    if len(dictionary) == 0:  # all null
        return np.full(len(indices), _fnv1a_splitmix(pa.array([b""], pa.large_binary()))[0])
    hashed = unique_hashes[indices]
    if encoded.indices.null_count:
        empty = _fnv1a_splitmix(pa.array([b""], pa.large_binary()))[0]
        hashed[encoded.indices.is_null().to_numpy(zero_copy_only=False)] = empty
    return hashed


def _fnv1a_splitmix(binary: pa.LargeBinaryArray) -> np.ndarray:
    """FNV-1a + SplitMix64 of each entry of a large_binary array (no nulls), as int64 >= 0."""
    n = len(binary)
    buffers = binary.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[binary.offset : binary.offset + n + 1]
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, np.uint8)
    )
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    order = np.argsort(-lengths, kind="stable")  # longest first: active rows form a prefix
    sorted_starts = starts[order]
    sorted_lengths = lengths[order]
    h = np.full(n, _FNV_OFFSET, dtype=np.uint64)
    max_len = int(sorted_lengths[0]) if n else 0
    # count_longer[j] = how many strings are longer than j bytes (a prefix of ``order``).
    count_longer = np.searchsorted(-sorted_lengths, -np.arange(max_len), side="left")
    with np.errstate(over="ignore"):
        for j in range(max_len):
            c = int(count_longer[j])
            h[:c] = (h[:c] ^ data[sorted_starts[:c] + j].astype(np.uint64)) * _FNV_PRIME
    mixed = np.empty(n, dtype=np.uint64)
    mixed[order] = splitmix64(h)
    return (mixed & _INT63_MASK).view(np.int64)
