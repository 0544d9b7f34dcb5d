"""Shared fixtures: progress bars off, the tiny catalogue, helpers to run the CLI."""

from __future__ import annotations

import os

import pytest

from recd.schema import Catalogue, load_catalogue

os.environ.setdefault("RECD_PROGRESS", "0")


@pytest.fixture(scope="session")
def tiny_catalogue() -> Catalogue:
    return load_catalogue("tiny")
