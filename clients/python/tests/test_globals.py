"""A function's data globals travel by value (`peerwasm/_globals.py`): the
sandbox computes with the caller's numbers, whatever their statements
would make there."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import peerwasm
from peerwasm import _arrays, _functions

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import fns_globals as g  # noqa: E402
from test_peerwasm import pool  # noqa: E402,F401  (the two-worker pool fixture)


def test_random_data_of_the_module_is_the_callers_in_every_item():
    # Made again in the sandbox, these would be other numbers (one set per
    # snapshot): the map would silently compute something else.
    assert peerwasm.map(g.noisy, range(8)) == [float(x) for x in g.NOISE[:8]]


def test_random_data_of_the_module_is_the_callers_on_every_worker_of_a_pool(pool):  # noqa: F811
    got = peerwasm.imap(g.noisy, range(16), peers=pool[:1], with_index=True)
    assert sorted(got) == [(i, float(g.NOISE[i])) for i in range(16)]


def test_a_value_read_from_a_file_only_the_caller_had_travels():
    assert not os.path.exists(g._path)
    assert peerwasm.map(g.scaled, [1, 2]) == [7, 14]


def test_what_a_value_names_travels_with_it():
    assert peerwasm.map(g.mixed, range(3)) == [g.mixed(i) for i in range(3)]


def test_a_value_read_as_the_module_loads_is_there_as_it_loads():
    assert peerwasm.map(g.loaded, [1, 2]) == [41, 42]


def test_large_values_go_beside_the_program_not_inside_it():
    arrays = _arrays.Arrays()
    try:
        source = _functions.program(g.large, [1], arrays=arrays, carried=[])
        assert len(source) < 200_000, len(source)
        assert arrays.moved and any(n.endswith(".pickle") for n in arrays._files), arrays._files
    finally:
        arrays.close()
    assert peerwasm.map(g.large, [0, 4999]) == [g.large(0), g.large(4999)]


def test_a_value_whose_package_is_not_in_the_sandbox_is_an_error_naming_it():
    with pytest.raises(peerwasm.RemoteError) as e:
        peerwasm.run(g.marker, 0)
    assert "could not load MARKER as the caller has it" in e.value.message, e.value.message
    assert "pluggy" in e.value.message, e.value.message


def test_a_small_value_that_changes_goes_with_the_items_and_keeps_the_program():
    # The program — and so a map's snapshot — stays the same from value to
    # value; each item is given the value of its map.
    programs = []
    for value in (10, 20):
        g.CHANGING[0] = value
        carried = []
        programs.append(_functions.program(g.changing, [1], carried=carried))
        assert carried[0], "the value goes with each item"
        assert peerwasm.map(g.changing, [1, 2]) == [value + 1, value + 2]
    assert programs[0] == programs[1]


def test_a_value_bound_in_the_scripts_main_block_reaches_the_function(tmp_path):
    # joblib's users write this: data made under the main guard, used by
    # the function mapped.
    script = tmp_path / "analysis.py"
    script.write_text(textwrap.dedent("""\
        import numpy as np
        import peerwasm

        def process(i):
            return float(data[i] * 2), labels[i]

        if __name__ == "__main__":
            data = np.arange(10.0) + 0.5
            labels = {"b", "a", "c"}
            labels = sorted(labels)
            print(peerwasm.map(process, range(3)))
        """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.stdout.strip() == "[(1.0, 'a'), (3.0, 'b'), (5.0, 'c')]", out.stderr[-3000:]


def test_the_same_values_make_the_same_program_in_every_process(tmp_path):
    # A set's order and the order globals are found in are per process (a
    # string's hash): the program, the key of a map's snapshot, must not be.
    code = (
        f"import sys; sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})\n"
        "import hashlib, fns_globals as g\n"
        "from peerwasm import _functions\n"
        "print(hashlib.sha256(_functions.program(g.mixed, [1]).encode()).hexdigest())\n"
    )
    seen = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout
        for seed in (1, 2, 3)
    }
    assert len(seen) == 1, seen


def test_a_notebooks_data_is_the_notebooks_not_made_again():
    # A cell loads (here: draws) data, a later one defines the function: the
    # cells' statements would make other numbers in the sandbox, or read a
    # file only this machine has.
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("import numpy as np\nsamples = np.random.rand(6)\nlabel = 'run-' + str(np.random.randint(1000))",
                   store_history=True).raise_error()
    shell.run_cell("def pick(i):\n    return label, float(samples[i])", store_history=True).raise_error()
    pick, ns = shell.user_ns["pick"], shell.user_ns
    assert peerwasm.map(pick, range(6)) == [(ns["label"], float(ns["samples"][i])) for i in range(6)]


def test_text_that_pandas_holds_in_pyarrow_reaches_the_sandbox():
    # pandas' default storage of text wherever pyarrow is installed (it is,
    # for these tests, as in most scientists' environments); the sandbox
    # has no pyarrow: the same strings go held by Python objects.
    import pandas as pd

    frame = pd.DataFrame({"name": ["a", None, "c"], "x": [1.0, 2.0, 3.0]}, index=pd.Index(["r1", "r2", "r3"]))
    assert frame["name"].dtype.storage == "pyarrow" and g.NAMES["name"].dtype.storage == "pyarrow"
    assert peerwasm.run(g.text_of, frame) == (["a", None, "c"], ["r1", "r2", "r3"], "str")
    assert peerwasm.map(g.name_at, [0, 1]) == [("p", "first"), ("q", "second")]


def test_data_kept_in_pyarrow_by_choice_is_refused_saying_how_to_convert_it():
    import pandas as pd

    counts = pd.Series([1, 2, None], dtype="int64[pyarrow]")
    with pytest.raises(peerwasm.RemoteError) as e:
        peerwasm.run(g.text_of, pd.DataFrame({"name": counts}))
    assert "pyarrow is not in the sandbox" in e.value.message and "convert_dtypes" in e.value.message, e.value.message


def test_a_library_function_given_a_function_of_ones_own_finds_it_there():
    # `partial(scipy.optimize.minimize, my_loss)`, `partial(sorted,
    # key=my_key)`: the library's function is imported there, and the
    # caller's function it is given travels with what it reads.
    import functools

    assert peerwasm.map(functools.partial(sorted, key=g.rank), [["a", "b", "c"], ["c", "a"]]) == [
        ["b", "a", "c"],
        ["a", "c"],
    ]
    assert peerwasm.run(functools.partial(max, key=g.rank), ["a", "b", "c"]) == "c"
