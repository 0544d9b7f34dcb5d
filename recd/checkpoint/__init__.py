"""Checkpoints: the shared flat ``step_NNNNNN.bin`` format, atomic writes, retention, sidecars.

- ``format``: the byte layout, ``ParamLayout`` (THE parameter order: the logical unsharded
  model's parameter-iterator order), the reader, ranged writes for distributed saves;
- ``atomic``: commit (through recd.durable), listing, fallback to the newest valid file,
  ``_layout.json``, materialising a chain into a full file;
- ``delta`` and ``chain``: ``step_NNNNNN.delta``, the rows changed since the previous
  checkpoint, and chains (a full file + the deltas after it), which every reader takes like a
  full file (``read_any``, ``validate_any``);
- ``checksum``: ``step_NNNNNN.bin.crc32``, the CRC-32 of each part of a checkpoint, written
  before it and checked by every reader that loads weights;
- ``retention``: keep the newest K plus every Mth (by step), with their ``.state.json`` entries;
- ``sidecars``: ``.loss.json`` (append-only JSON Lines), ``.samples.json``, ``.state.json``,
  pivot archive and fork;
- ``state_file``: the trainer's ``.state.json`` document (data policy, reader position and
  RNG per checkpoint step);
- ``lock``: one owner per run directory (``.lock``), taken before anything in it is touched.

Formats: the file in :mod:`recd.checkpoint.format`, the run directory and its sidecars in
:mod:`recd.checkpoint.sidecars` and :mod:`recd.checkpoint.state_file` (docs/checkpoints.md).
"""

from recd.checkpoint.atomic import (
    LAYOUT_FILE,
    checkpoint_file,
    checkpoint_path,
    checkpoint_step,
    clean_stray_temp_files,
    commit,
    copy_checkpoint,
    list_checkpoints,
    materialize_checkpoint,
    move_checkpoint,
    newest_valid_checkpoint,
    read_layout,
    read_layout_or_none,
    remove_checkpoint,
    write_checkpoint,
    write_checksum,
    write_layout,
)
from recd.checkpoint.chain import (
    chain_paths,
    check_finite_any,
    is_delta,
    read_any,
    validate_any,
)
from recd.checkpoint.checksum import (
    CHECKSUM_SUFFIX,
    Checksum,
    ChecksumStatus,
    checksum_of_file,
    checksum_path,
    read_checksum,
    verify_checksum,
)
from recd.checkpoint.format import (
    MAX_PARAMS,
    REGIONS,
    Checkpoint,
    CheckpointHeader,
    CheckpointNonFiniteError,
    ParamLayout,
    ParamSpec,
    check_checkpoint_finite,
    check_finite,
    checkpoint_filename,
    checkpoint_size_bytes,
    parse_checkpoint_step,
    preallocate,
    read_checkpoint,
    validate_checkpoint,
    write_region_range,
)
from recd.checkpoint.lock import (
    RUN_LOCK_FILE,
    RunDirectoryBusyError,
    RunDirectoryLock,
    lock_run_directory,
)
from recd.checkpoint.retention import (
    RetentionPolicy,
    apply_retention,
    apply_retention_in_background,
)
from recd.checkpoint.sidecars import (
    LOSS_FILE,
    SAMPLES_FILE,
    STATE_FILE,
    ForkResult,
    LossHistory,
    LossLog,
    append_sample_audit,
    archive_policy_sidecars,
    drop_state_entries,
    fork_run,
    read_loss_history,
    read_samples,
    read_state,
    write_samples,
    write_state,
)
from recd.checkpoint.state_file import STATE_FORMAT, StateFile, read_step_state
from recd.errors import (
    CheckpointChecksumError,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointTooLargeError,
    SidecarError,
)

__all__ = [
    "CHECKSUM_SUFFIX",
    "LAYOUT_FILE",
    "LOSS_FILE",
    "MAX_PARAMS",
    "REGIONS",
    "RUN_LOCK_FILE",
    "SAMPLES_FILE",
    "STATE_FILE",
    "STATE_FORMAT",
    "Checkpoint",
    "CheckpointChecksumError",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointHeader",
    "CheckpointNonFiniteError",
    "CheckpointTooLargeError",
    "Checksum",
    "ChecksumStatus",
    "ForkResult",
    "LossHistory",
    "LossLog",
    "ParamLayout",
    "ParamSpec",
    "RetentionPolicy",
    "RunDirectoryBusyError",
    "RunDirectoryLock",
    "SidecarError",
    "StateFile",
    "append_sample_audit",
    "apply_retention",
    "apply_retention_in_background",
    "archive_policy_sidecars",
    "chain_paths",
    "check_checkpoint_finite",
    "check_finite",
    "check_finite_any",
    "checkpoint_file",
    "checkpoint_filename",
    "checkpoint_path",
    "checkpoint_size_bytes",
    "checkpoint_step",
    "checksum_of_file",
    "checksum_path",
    "clean_stray_temp_files",
    "commit",
    "copy_checkpoint",
    "drop_state_entries",
    "fork_run",
    "is_delta",
    "list_checkpoints",
    "lock_run_directory",
    "materialize_checkpoint",
    "move_checkpoint",
    "newest_valid_checkpoint",
    "parse_checkpoint_step",
    "preallocate",
    "read_any",
    "read_checkpoint",
    "read_checksum",
    "read_layout",
    "read_layout_or_none",
    "read_loss_history",
    "read_samples",
    "read_state",
    "read_step_state",
    "remove_checkpoint",
    "validate_any",
    "validate_checkpoint",
    "verify_checksum",
    "write_checkpoint",
    "write_checksum",
    "write_layout",
    "write_region_range",
    "write_samples",
    "write_state",
]
