"""The house rule the Rust crates keep (`runtime/src/house.rs`), kept by
the Python package too: no module grows past 600 lines without saying why
at its top."""

import pathlib

import peerwasm

LONGEST = 600


def test_no_module_of_the_package_is_long_without_a_reason_at_its_top():
    source = pathlib.Path(__file__).resolve().parents[1] / "python" / "peerwasm"
    modules = sorted(source.glob("*.py"))
    assert modules, source
    long = []
    for path in modules:
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) > LONGEST and "Past 600 lines because" not in "\n".join(lines[:40]):
            long.append(f"{path.name} ({len(lines)} lines)")
    assert not long, f"past {LONGEST} lines with no reason at the top (split it, or say why not): {long}"
    # The package the tests import is this source's.
    assert {p.name for p in modules} <= {p.name for p in pathlib.Path(peerwasm.__file__).parent.glob("*.py")}
