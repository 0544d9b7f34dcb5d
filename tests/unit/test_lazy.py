"""Packages whose names load lazily (recd.lazy): every name resolves to its home module's object,
``__all__`` lists exactly the names, an unknown name is an AttributeError."""

from __future__ import annotations

import importlib

import pytest

from recd.lazy import exported_names

LAZY_PACKAGES = ("recd.analyze", "recd.models", "recd.optim", "recd.reader")


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_every_name_comes_from_its_home_module(name: str) -> None:
    package = importlib.import_module(name)
    assert sorted(package.__all__) == exported_names(package._HOME)
    for module, names in package._HOME.items():
        home = importlib.import_module(f"{name}.{module}")
        for export in names:
            assert getattr(package, export) is getattr(home, export), export
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        package.not_a_name  # noqa: B018
