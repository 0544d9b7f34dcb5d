"""Package namespaces whose names load their submodule on first use (PEP 562).

``recd.reader``, ``recd.models``, ``recd.optim`` and ``recd.analyze`` re-export their modules'
names, and most of those modules need torch and torchrec (seconds to import). A command that only
validates a config, or prints ``--help``, imports a light submodule (``recd.reader.config``,
``recd.models.options``, ``recd.optim.config``) and should not pay for the package's heavy
neighbours: a package builds its ``__getattr__``/``__dir__`` here and the names resolve lazily.
The standard library has no helper for this (``importlib.util.LazyLoader`` defers a whole
module, not a package's re-exports).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(
    package: str, homes: Mapping[str, Sequence[str]], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``homes`` maps a submodule name to the names
    it exports; a resolved name is cached in the package's ``namespace`` (its ``globals()``)."""
    module_of = {name: module for module, names in homes.items() for name in names}

    def getattr_(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(module_of))

    return getattr_, dir_


def exported_names(homes: Mapping[str, Sequence[str]]) -> list[str]:
    """Every name ``homes`` exports, sorted (a package's ``__all__`` is checked against it)."""
    return sorted(name for names in homes.values() for name in names)
