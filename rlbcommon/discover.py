"""A folder of plug-ins: every module of a package, imported (each registers itself when it is).
What a layer runs per fabric kind lives in its kinds/ folder and is found this way, so adding a
kind adds modules and edits no list."""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def modules_of(package: str, path) -> list[ModuleType]:
    """Every module in the package's folder (`path`: its __path__), in name order; names that
    start with _ are left out."""
    return [importlib.import_module(f"{package}.{m.name}") for m in sorted(pkgutil.iter_modules(path), key=lambda m: m.name)
            if not m.name.startswith("_")]
