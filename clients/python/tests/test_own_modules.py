"""The caller's own modules and packages travel with a function, their
imports guarded as the function's module's are: one the sandbox cannot do
(a host-only package) fails only what uses it, naming it."""

import pathlib
import sys

import pytest

import peerwasm

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import fns_hostonly  # noqa: E402


def test_a_module_of_ones_own_that_imports_a_host_only_package_still_serves_the_rest():
    assert peerwasm.map(fns_hostonly.uses_the_module, [1, 2]) == [3.142, 12.566]


def test_a_package_of_ones_own_that_imports_a_host_only_package_still_serves_the_rest():
    assert peerwasm.map(fns_hostonly.uses_the_package, [1, 2]) == [2, 4]


def test_what_uses_the_host_only_import_fails_naming_it():
    with pytest.raises(peerwasm.RemoteError) as e:
        peerwasm.run(fns_hostonly.uses_the_missing_import, "lab")
    assert "import pluggy" in e.value.message and "the function uses it" in e.value.message, e.value.message
