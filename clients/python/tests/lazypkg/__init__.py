"""A package that loads its submodule on first use, as scipy loads
`scipy.stats` (a module `__getattr__`, PEP 562): for the tests of what a
map's snapshot holds."""

import importlib


def __getattr__(name):
    if name == "sub":
        return importlib.import_module(f"{__name__}.sub")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
