"""Shared fixtures: progress bars off, the tiny catalogue, helpers to run the CLI."""

from __future__ import annotations

import os

import pytest
import torch

from recd.schema import Catalogue, load_catalogue

os.environ.setdefault("RECD_PROGRESS", "0")
# One intra-op thread: on a 2-core machine torch's thread pool fights pytest, worker processes
# and child processes for the cores and runs many times slower.
torch.set_num_threads(1)


_FOLDER_MARKERS = ("unit", "integration", "distributed")
"""Each test carries the marker of its folder: ``-m unit``, ``-m "not integration"``, ..."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        for name in _FOLDER_MARKERS:
            if "tests" in parts and name in parts[parts.index("tests") :]:
                item.add_marker(getattr(pytest.mark, name))


@pytest.fixture(scope="session")
def tiny_catalogue() -> Catalogue:
    return load_catalogue("tiny")
