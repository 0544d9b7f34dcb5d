"""Reader processes keep freed memory: glibc's malloc thresholds fixed once per process."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from recd.reader import keep_freed_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="the thresholds are glibc's")
def test_thresholds_are_set_once_in_a_fresh_process() -> None:
    code = (
        "from recd.reader import memory\n"
        "assert not memory._done\n"
        "assert memory.keep_freed_memory() and memory._done\n"
        "assert memory.keep_freed_memory()\n"  # idempotent
        "memory.worker_init(0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_is_a_no_op_answer_elsewhere() -> None:
    assert keep_freed_memory() is GLIBC
