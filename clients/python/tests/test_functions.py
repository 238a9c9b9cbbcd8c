"""Plain Python functions run inside the sandbox (CPython for WASI), on the
embedded worker and on a pool: values and numpy arrays in and out, the
guest's exceptions with their tracebacks, the memory limit."""

import os
import pathlib
import pickle
import signal
import subprocess
import time
import sys

import numpy as np
import pytest

import peerwasm

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import fns  # noqa: E402
import fns_blocks  # noqa: E402
import fns_lab  # noqa: E402
import fns_nested  # noqa: E402
import fns_random  # noqa: E402
import fns_seeded  # noqa: E402
import fns_shared  # noqa: E402
import plugins  # noqa: E402
from test_peerwasm import pool  # noqa: E402,F401  (the two-worker pool fixture)


def test_map_of_a_function_gives_its_values_in_order():
    assert peerwasm.map(fns.square, [1, 2, 3, 12]) == [1, 4, 9, 144]
    assert peerwasm.map(fns.dumps, [{"b": 1, "a": [2]}]) == ['{"a": [2], "b": 1}']


def test_numpy_arrays_cross_both_ways():
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    [out] = peerwasm.map(fns.describe, [a])
    assert out["mean"] == 2.5 and out["dtype"] == "float64"
    np.testing.assert_array_equal(out["doubled"], a * 2)


def test_an_import_the_sandbox_cannot_do_is_named_when_the_function_uses_it():
    # fns imports `peerwasm` (host-only): the functions that do not use it run.
    assert peerwasm.map(fns.square, [3]) == [9]
    with pytest.raises(peerwasm.RemoteError) as e:
        peerwasm.run(fns.names_the_client)
    assert e.value.type_name in ("ImportError", "ModuleNotFoundError"), e.value
    assert "import peerwasm" in e.value.message and "and the function uses it" in e.value.message, e.value


def test_a_host_only_import_stands_in_alone_not_for_the_others_of_its_statement():
    # `import dataclasses, os, peerwasm`: only `peerwasm` is missing in the
    # sandbox, and the dataclass defined with the others works there.
    pairs = [fns_shared.Pair(1, 2), fns_shared.Pair(3, 4)]
    assert peerwasm.map(fns_shared.total, pairs) == [3, 7]
    assert peerwasm.run(fns_shared.total, pairs[1]) == 7


def test_a_decorated_function_runs_as_its_decorators_made_it():
    # The module's name is bound to what the decorators made: the sandbox
    # runs the definition with its decorators, so the name means the same.
    assert peerwasm.map(fns_shared.twice_square, [3, 4]) == [18, 32]
    assert peerwasm.run(fns_shared.twice_square, 5) == 50
    assert peerwasm.map(fns_shared.cached_cube, [2, 3]) == [8, 27]
    for fn, says in ((fns_shared.gives_one_by_one, "generator function"), (fns_shared.awaits, "async function")):
        with pytest.raises(TypeError, match=says):
            peerwasm.map(fn, [1])


def test_a_module_that_cannot_load_in_the_sandbox_fails_each_item_with_its_error():
    # The class the function uses reads a file only the host has as it is
    # defined: every item of a map (warm: the prelude fails) and a run
    # (cold) say so alike, never a NameError of the map's own machinery.
    # (A constant read from that file travels as its value.)
    lines = fns_shared.local_lines(0)
    assert peerwasm.map(fns_shared.local_lines, [1, 2]) == [lines, lines]
    for call in (
        lambda: peerwasm.map(fns_shared.local_file_lines, [1, 2]),
        lambda: peerwasm.run(fns_shared.local_file_lines, 1),
    ):
        with pytest.raises(peerwasm.JobError) as e:
            call()
        message = str(e.value)
        assert "FileNotFoundError" in message and "localmod.py" in message, message
        assert "_pw_" not in message, message


def test_what_the_function_prints_comes_out_on_stderr_in_input_order(capsys):
    assert peerwasm.map(fns.square, [3, 4]) == [9, 16]
    err = capsys.readouterr().err
    assert "squaring 3" in err and "squaring 4" in err, err
    assert err.index("squaring 3") < err.index("squaring 4"), err
    assert peerwasm.run(fns.square, 5) == 25
    assert "squaring 5" in capsys.readouterr().err


def test_a_function_defined_in_a_notebook_cell_takes_the_notebooks_imports():
    # A real IPython session (what Jupyter runs): the imports are in an
    # earlier cell than the function, beside a magic; the function's module
    # is `__main__`, whose file is not the notebook.
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("import json\nimport numpy as np\n%time _ = 1", store_history=True).raise_error()
    shell.run_cell(
        "def total(a):\n    return json.dumps({'total': int(np.sum(a))})", store_history=True
    ).raise_error()
    total = shell.user_ns["total"]
    assert peerwasm.run(total, [1, 2, 3]) == '{"total": 6}'
    assert peerwasm.map(total, [[1], [2, 3]]) == ['{"total": 1}', '{"total": 5}']


def test_a_function_takes_its_modules_helpers_constants_and_classes():
    assert peerwasm.run(fns.uses_its_module, 2) == 2 * 3 + 30 + 4
    assert peerwasm.map(fns.norm_of, [fns.Point(1, -2), fns.Point(3, 4)]) == [3, 7]
    assert peerwasm.map(fns.norm_of, (fns.Point(i, i) for i in range(3))) == [0, 2, 4]
    assert peerwasm.run(fns.uses_a_local_module, 3, 4) == 5.0
    # Helpers behind functools.lru_cache / functools.cache (wrapper objects,
    # not functions) travel as their decorated `def` (they were not sent:
    # NameError in the sandbox).
    assert peerwasm.map(fns.uses_cached_helpers, [3, 4]) == [(5 + 9, 1), (14 + 36, 1)]


def test_a_parameter_named_like_a_global_does_not_bring_the_global():
    # The global (computable only on the host) stays home: the function
    # never reads it.
    assert peerwasm.map(fns.doubles, [1, 2]) == [2, 4]


def test_globals_changed_after_their_definitions_arrive_as_the_module_made_them():
    assert peerwasm.map(fns.reads_changed_globals, ["b", "c"]) == [(15, 15, ["x", "y"]), (15, 3, ["x", "y"])]


def test_globals_bound_inside_top_level_blocks_travel_with_their_block():
    # `try: import ujson as json / except ImportError: import json`, a
    # constant and a function an `if` defines, a loop's last value; the
    # `if __name__ == "__main__":` block stays home.
    assert peerwasm.map(fns_blocks.encodes, [1]) == ['{"x": 1, "mode": "PY3", "last": 2}']
    # A global a top-level loop fills, after its definition.
    assert peerwasm.map(fns_blocks.squares, [1, 3]) == [1, 9]


def test_a_package_of_ones_own_travels_with_the_functions_that_need_it():
    import labpkg.models

    # Imported by the function's module; a function defined in it (with a
    # relative import), imported there by its names; its .py files only.
    assert peerwasm.map(fns_lab.uses_the_package, [1, 2]) == [9, 19]
    # One in a src/ directory, found through sys.path.
    assert peerwasm.map(fns_lab.uses_the_src_package, [4]) == [8]
    assert peerwasm.map(labpkg.models.fit, [1, 2]) == [11, 21]
    assert peerwasm.run(labpkg.models.shipped) == ["__init__.py", "__main__.py", "models.py", "scaling.py"]


def test_a_script_run_as_a_packages_module_keeps_its_relative_imports():
    # `python -m labpkg.models` and `python -m labpkg`: the functions are
    # `__main__`'s, their `from .scaling import scale` the package's.
    here = os.path.dirname(os.path.abspath(__file__))
    for module, want in (("labpkg.models", [11, 21]), ("labpkg", [100, 200])):
        p = subprocess.run([sys.executable, "-m", module], cwd=here, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        assert p.stdout.split("VALUES")[1].strip() == repr(want), p.stdout


def test_dataclasses_named_tuples_and_enums_come_back_as_the_callers_own_classes():
    import localmod

    out = peerwasm.map(fns.measure, [1, 2])
    assert out == [fns.Measurement(1.5, localmod.Unit.METRE, fns.Bounds(0, 2)),
                   fns.Measurement(3.0, localmod.Unit.METRE, fns.Bounds(1, 3))]
    assert type(out[0]) is fns.Measurement and type(out[0].bounds) is fns.Bounds
    assert out[0].unit is localmod.Unit.METRE
    # What is not data is still named from the value itself.
    with pytest.raises(peerwasm.RemoteError, match=r"cannot be sent back: result is a fns.Point,"):
        peerwasm.run(fns.make_point, 1)


def test_errors_returned_tuples_made_inside_flags_and_masked_arrays_come_back_as_made():
    (summary, access, recent, readings, table), = peerwasm.map(fns.survey, [3])
    assert summary.good == 2 and type(summary).__name__ == "Summary"
    (error,) = summary.bad
    # Returned, not raised: a value, catchable as its own type, saying where it was raised.
    assert isinstance(error, ValueError) and isinstance(error, peerwasm.RemoteError)
    assert "invalid literal" in error.message and "in survey" in error.traceback
    assert access is fns.Access.READ | fns.Access.WRITE and list(recent) == [1, 2] and recent.maxlen == 2
    assert readings.mask.tolist() == [False, True, False] and readings.sum() == 4.0
    assert table.dtype.names == ("id", "v") and table["v"][0] == 2.5
    # `run` returns such a value; it raises only what the function raised.
    assert peerwasm.run(fns.survey, 1)[0].bad == []


def test_a_pool_started_inside_the_function_fails_saying_why_and_what_to_do():
    for kind in ("threads", "processes"):
        with pytest.raises(peerwasm.RemoteError, match="the sandbox runs one thread and starts no processes") as e:
            peerwasm.run(fns.starts_a_pool, kind)
        assert e.value.type_name in ("RuntimeError", "AttributeError", "OSError", "NotImplementedError"), e.value
    # Other errors are left as they are.
    with pytest.raises(peerwasm.RemoteError) as e:
        peerwasm.run(fns.fails_on, 2)
    assert "starts no processes" not in str(e.value)


def test_an_argument_the_sandbox_cannot_unpickle_is_an_error_naming_what_is_missing():
    # An object of a class of a package the sandbox does not have (here
    # the host-only client itself): said, with what to do — not a bare
    # traceback from the guest's unpickler.
    stranger = peerwasm.Interrupted({}, 3)
    with pytest.raises(peerwasm.RemoteError, match="could not unpickle the item's arguments: 'peerwasm' is not in"):
        peerwasm.run(fns.add, stranger, 1)
    out = peerwasm.map(fns.power, [2, stranger], keep_going=True)
    assert out[0] == 4 and isinstance(out[1], peerwasm.RemoteError) and out[1].index == 1, out


def test_a_forked_child_of_a_process_that_used_peerwasm_can_use_it_too():
    # multiprocessing's fork (Linux's default before Python 3.14): the
    # child inherits no threads and no slot processes, so it makes its own
    # (was: its first call waited for ever on its parent's runtime).
    import multiprocessing

    assert peerwasm.run(fns.power, 3) == 9
    with multiprocessing.get_context("fork").Pool(2) as children:
        assert children.map_async(fns.power_in_the_sandbox, [4, 5]).get(timeout=300) == [16, 25]


def test_the_functions_exception_is_caught_as_its_own_type_where_this_process_has_it():
    # A builtin type and one of the function's module: `except` catches
    # them as with a process pool; the error stays a RemoteError.
    with pytest.raises(ValueError, match="bad input 2") as e:
        peerwasm.run(fns.fails_on, 2)
    assert isinstance(e.value, peerwasm.RemoteError) and e.value.type_name == "ValueError"
    assert str(e.value).startswith("ValueError: bad input 2"), str(e.value)
    out = peerwasm.map(fns.raises_own, ["plain", "key", "custom", "bytes"], keep_going=True)
    assert isinstance(out[0], fns.PlainError) and isinstance(out[0], peerwasm.RemoteError)
    assert isinstance(out[1], KeyError) and str(out[1]).startswith("item 1 of the map: KeyError:"), str(out[1])
    # One whose class runs code of its own as it is made is not made:
    # a plain RemoteError, named.
    assert not isinstance(out[2], fns.CustomError) and out[2].type_name == "CustomError"
    assert type(out[3]) is peerwasm.RemoteError and out[3].type_name == "UnicodeDecodeError"


def test_rows_of_itertuples_travel_though_their_class_was_made_on_the_fly():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"a": [1, 2], "b": [0.5, 0.25]})
    assert peerwasm.map(fns.row_total, frame.itertuples()) == [(1.5, "Pandas"), (2.25, "Pandas")]
    assert peerwasm.map(fns.row_total, frame.itertuples(name="Row")) == [(1.5, "Row"), (2.25, "Row")]


def test_series_with_regular_time_indexes_arrive_whatever_pandas_pickles_them_with():
    # pandas pickles time indexes through private functions that changed
    # between 3.0 (the sandbox's) and 3.1: they go by their constructor.
    pd = pytest.importorskip("pandas")
    hourly = pd.Series([1.0, 2.0, 3.0], index=pd.date_range("2024-03-31", periods=3, freq="h", tz="Europe/Berlin"))
    minutes = pd.Series(range(10), index=pd.date_range("2024-01-01", periods=10, freq="min"))
    waits = pd.Series([5, 6], index=pd.timedelta_range("1s", periods=2, freq="s"))
    out = peerwasm.map(fns.time_index, [hourly, minutes.resample("5min").sum(), waits])
    assert out == [
        ("h", "2024-03-31 00:00:00+01:00", "2024-03-31 03:00:00+02:00", [1.0, 2.0, 3.0]),
        ("5min", "2024-01-01 00:00:00", "2024-01-01 00:05:00", [10, 35]),
        ("s", "0 days 00:00:01", "0 days 00:00:02", [5, 6]),
    ]


def test_a_dict_subclass_comes_back_as_its_class():
    import collections

    counts = peerwasm.run(fns.word_counts, "a b a")
    assert type(counts) is collections.Counter and counts.most_common(1) == [("a", 2)]


def test_run_calls_the_function_with_its_arguments():
    assert peerwasm.run(fns.add, 2, 3) == 5
    assert peerwasm.run(fns.add, [1], [2]) == [1, 2]


def test_an_exception_in_the_sandbox_arrives_with_its_traceback():
    with pytest.raises(peerwasm.RemoteError) as e:
        peerwasm.map(fns.fails_on, [1, 2, 3])
    err = e.value
    assert err.type_name == "ValueError" and err.message == "bad input 2"
    assert "fails_on" in err.traceback and "raise ValueError" in err.traceback
    assert err.result.index == 1 and err.result.exit_code == 1
    assert err.index == 1 and str(err).startswith("item 1 of the map: ValueError: bad input 2"), err
    out = peerwasm.map(fns.fails_on, [1, 2, 3], keep_going=True)
    assert out[0] == 1 and out[2] == 3 and isinstance(out[1], peerwasm.RemoteError)
    with pytest.raises(peerwasm.RemoteError, match="bad input 2"):
        peerwasm.run(fns.fails_on, 2)


def test_the_memory_limit_holds():
    # (Lambdas and closures, once refused here, travel: test_nested.py.)
    with pytest.raises(peerwasm.JobError) as e:
        peerwasm.run(fns.grows, 300, mem="128MiB")
    assert e.value.result.outcome == "memory_limit_exceeded" and e.value.result.exit_code == 137


def test_a_function_is_mapped_over_a_pool_with_numpy_arrays(pool):  # noqa: F811
    arrays = [np.full((4, 4), i, dtype=np.float64) for i in range(50)]
    out = peerwasm.map(fns.describe, arrays, peers=pool)
    assert [o["mean"] for o in out] == [float(i) for i in range(50)]
    for i, o in enumerate(out):
        np.testing.assert_array_equal(o["doubled"], arrays[i] * 2)


def test_a_guest_cannot_run_code_in_the_caller(tmp_path):
    """A result whose unpickling would run code, and a guest that writes a
    pickle's opcodes as its reply: neither is ever unpickled here."""
    marker = tmp_path / "pwned"
    with pytest.raises(peerwasm.RemoteError, match="cannot be sent back") as e:
        peerwasm.run(fns.returns_reducing, str(marker))
    assert "Reducing" in e.value.message and "a result may be numbers" in e.value.message, e.value.message
    with pytest.raises(RuntimeError, match="not a peerwasm result"):
        peerwasm.run(fns.writes_raw_pickle, str(marker))
    with pytest.raises(RuntimeError, match="not a peerwasm result"):
        peerwasm.map(fns.writes_raw_pickle, [str(marker)])
    assert not marker.exists(), "the guest's bytes ran code in the caller"
    # Honest data of the same kinds still comes back.
    frames = peerwasm.map(fns.frame, [3])
    assert list(frames[0]["name"]) == ["row0", "row1", "row2"] and list(frames[0]["x"]) == [0.0, 0.5, 1.0]


def _map_results(fn, items):
    """The map's Results themselves (peaks, wall times), as `map` runs it:
    warm, from the prelude `map` sends."""
    from peerwasm import _functions, _peerwasm, _warm

    inputs = [pickle.dumps(((i,), {}), protocol=_functions.PROTOCOL) for i in items]
    warm = (_warm.prelude(None), _warm.TURN)
    return list(_peerwasm._map_python(_functions.runtime_dir(), _functions.program(fn, items), inputs, warm=warm))


def _no_item_sees_another(out):
    assert [o[0] for o in out] == [[i] for i in range(len(out))], out
    assert all(o[1] == (None, None) for o in out), out
    assert len({o[2] for o in out}) == len(out), "random is seeded afresh per item"
    assert len({o[3] for o in out}) == len(out), "numpy's global generator too"


def test_what_the_function_imports_inside_is_imported_in_the_snapshot_not_by_each_item():
    # (scikit-learn imported inside a fit: 1.75 s of every item before.)
    assert peerwasm.map(fns.imports_inside, [0, 1, 2]) == [(True, 1.0, True), (True, 2.0, True), (True, 3.0, True)]
    # A submodule its package loads on first use (scipy.stats after
    # `import scipy`): loaded in the snapshot; one no package loads is not.
    assert peerwasm.map(fns.reaches_lazily, [0, 1]) == [(True, 40, None), (True, 41, None)]


def test_items_start_warm_and_none_sees_what_another_left():
    out = peerwasm.map(fns.leaks, range(8))
    _no_item_sees_another(out)


def test_generators_seeded_from_entropy_draw_afresh_in_each_item():
    # Made as the module loaded, i.e. in the snapshot every item starts
    # from: a Monte-Carlo map must not compute one sample eight times.
    out = peerwasm.map(fns_random.draws_unseeded, range(8))
    for column in range(len(out[0])):
        drawn = [o[column] for o in out]
        assert len(set(drawn)) == len(drawn), (column, drawn)


def test_generators_seeded_with_a_value_start_each_item_from_it_as_a_process_would():
    import random

    expected = [
        float(np.random.default_rng(7).normal()),
        float(np.random.RandomState(42).rand()),
        random.Random(5).random(),
        float(np.random.RandomState(7).rand()),
        int(np.random.SFC64(8).random_raw()),
    ]
    assert peerwasm.map(fns_random.draws_seeded, range(6)) == [expected] * 6
    # numpy's and random's own, seeded by a local module as it loads.
    own = (float(np.random.RandomState(3).rand()), random.Random(5).random())
    assert peerwasm.map(fns_seeded.draws_from_the_seeded_globals, range(6)) == [own] * 6


def test_items_after_the_snapshot_start_without_the_imports_and_each_has_its_own_peak():
    results = _map_results(fns.grabs, [0, 64, 0, 32, 0, 0])
    walls = sorted(r.wall_s for r in results)
    # Two slots: at most two items start cold (one makes the snapshot); the
    # rest skip starting CPython and importing numpy.
    assert walls[3] < 0.3 * walls[-1], walls
    peaks = [r.peak_memory_bytes for r in results]
    mib = 1 << 20
    base = min(peaks)
    assert all(abs(peaks[i] - base) <= mib for i in (0, 2, 4, 5)), peaks
    assert abs(peaks[1] - base - 64 * mib) <= 2 * mib, peaks
    assert abs(peaks[3] - base - 32 * mib) <= 2 * mib, peaks


def test_blas_work_memory_is_made_in_the_snapshot_so_a_product_does_not_grow_an_item():
    # numpy's first matrix product makes BLAS's work buffer (~15 MiB). Made
    # by an item, it grew the item's memory — its peak, and an instance that
    # grew is not kept for the next item; made in the snapshot, an item with
    # a product peaks where one without does.
    results = _map_results(fns.product, [0, 150, 0, 200, 0, 150])
    assert [r.ok for r in results] == [True] * 6
    peaks = [r.peak_memory_bytes for r in results]
    assert max(peaks) - min(peaks) <= (1 << 20), peaks


def test_entry_points_are_read_into_the_snapshot_and_still_follow_sys_path():
    # Each item finds no `pw.test` plugin (none an earlier item installed
    # reaches it), then its own once it puts it on sys.path; the lookups
    # came from the reading the prelude kept.
    out = peerwasm.map(plugins.seen, range(3))
    assert out == [([], [f"item{i}"], True) for i in range(3)], out


def test_a_module_that_keeps_a_file_open_runs_each_item_from_its_own_start():
    assert peerwasm.map(fns.writes_to_a_kept_file, range(5)) == [str(i) for i in range(5)]


def test_items_start_warm_on_a_pool_and_none_sees_what_another_left(pool):
    out = peerwasm.map(fns.leaks, range(8), peers=pool[:1])
    _no_item_sees_another(out)
    # What the worker keeps for the next items (the snapshot of CPython
    # with numpy imported, the resident interpreters) is charged to its
    # ledger, and shows in its metrics.
    import urllib.request

    with urllib.request.urlopen(f"http://{pool[0]}/metrics") as r:
        metrics = r.read().decode()
    [warm] = [line for line in metrics.splitlines() if line.startswith('peerwasm_memory_bytes{kind="warm_held"}')]
    assert 16 << 20 <= float(warm.split()[-1]) <= 1 << 30, warm


def _kept_snapshots():
    """The snapshots the embedded worker keeps on disk, by name: their bytes' hash."""
    import hashlib
    import os

    base = os.environ.get("PEERWASM_CACHE_DIR")
    if base is None:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "peerwasm")
    folder = pathlib.Path(base) / "modules" / "snapshots"
    kept = {}
    for p in folder.glob("*.snap"):
        try:
            kept[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
        except FileNotFoundError:  # another process sharing the cache let it go
            pass
    return kept


def test_the_next_process_starts_warm_from_the_snapshot_kept_on_disk(tmp_path):
    # A fresh process maps a function whose module imports numpy: its first
    # items run the imports (the prelude); a second fresh process, same
    # program, starts its items from the snapshot the first kept on disk —
    # mapped from its file in each slot process — with the same answers,
    # no item seeing what another left, and the file as it was.
    # (A constant of its own makes the program one no earlier run kept.)
    module = tmp_path / "kept.py"
    module.write_text(
        "import numpy as np\n"
        f"TAG = {time.time_ns()}\n"
        "SEEN = []\n"
        "def total(x):\n"
        "    SEEN.append(x)\n"
        "    return int(np.arange(x).sum()) + TAG * 0, list(SEEN)\n"
    )
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from kept import total\n"
        "import pickle\nfrom peerwasm import _functions, _peerwasm, _warm\n"
        "items = [3, 4, 5, 6, 7, 8, 9, 10]\n"
        "inputs = [pickle.dumps(((i,), {}), protocol=_functions.PROTOCOL) for i in items]\n"
        "warm = (_warm.prelude(None), _warm.TURN)\n"
        "rs = list(_peerwasm._map_python(_functions.runtime_dir(), _functions.program(total, items), inputs, warm=warm))\n"
        "print('VALUES', [_functions._reply(r) for r in rs])\n"
        "print('WALLS', max(r.wall_s for r in rs))\n"
    )
    walls = []
    kept = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        walls.append(float(p.stdout.split("WALLS")[1]))
        values = p.stdout.split("VALUES")[1].split("WALLS")[0].strip()
        want = [(sum(range(i)), [i]) for i in range(3, 11)]
        assert values == repr(want), values
        kept.append(_kept_snapshots())
    # Measured here: 0.22 s cold, 0.04 s from the kept snapshot.
    assert walls[1] < 0.5 * walls[0], f"the second process ran the imports again: {walls}"
    new = set(kept[1]) & set(kept[0])
    assert new, f"no snapshot was kept: {kept}"
    assert all(kept[0][n] == kept[1][n] for n in new), "a kept snapshot changed under the jobs mapped from it"


def test_mem_may_be_given_per_item():
    out = peerwasm.map(fns.grows, [8, 200], mem=["256MiB", "128MiB"], keep_going=True)
    assert out[0] == 8 << 20
    assert isinstance(out[1], peerwasm.JobError) and out[1].result.outcome == "memory_limit_exceeded", out[1]
    assert out[1].result.memory_limit_bytes == 128 << 20
    with pytest.raises(ValueError, match="1 sizes for 2 inputs"):
        peerwasm.map(fns.grows, [8, 9], mem=["256MiB"])
    with pytest.raises(ValueError, match=r"mem\[1\]"):
        peerwasm.map(fns.grows, [8, 9], mem=["256MiB", "lots"])
    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_lost must be at least 1"):
            peerwasm.map(fns.grows, [8], max_lost=bad)


def _slot_processes():
    """This process's slot processes (`python -m peerwasm slot`): where the
    embedded worker runs a Python map's items."""
    found = []
    me = str(os.getpid())
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if fields[1] == me and b"peerwasm\0slot" in cmdline:
            found.append(int(stat.parent.name))
    return found


def _kill_slot_processes_while(busy_for, done):
    """Kills every slot process once it has run for `busy_for` seconds (an
    item naps that long in it), until `done` is set: each item run in one
    is lost with it."""
    seen = {}
    while not done.is_set():
        now = time.monotonic()
        for pid in _slot_processes():
            if now - seen.setdefault(pid, now) > busy_for:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        time.sleep(0.05)


def test_an_item_lost_with_its_slot_process_runs_again_and_is_given_up_after_max_lost():
    import threading

    done = threading.Event()
    killer = threading.Thread(target=_kill_slot_processes_while, args=(1.0, done), daemon=True)
    killer.start()
    try:
        out = peerwasm.map(fns.nap, [30], keep_going=True, max_lost=2)
    finally:
        done.set()
        killer.join()
    assert isinstance(out[0], peerwasm.JobError), out
    assert out[0].result.outcome == "lost" and "lost 2 times" in str(out[0]), out[0]
    # Killed once, under its item, the item is run again and its value
    # comes back.
    killed = []

    def cpu(pid):
        try:
            fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0
        return int(fields[11]) + int(fields[12])

    def once():
        while not killed and not done.is_set():
            busy = [p for p in _slot_processes() if cpu(p) > 30]  # 0.3 s of CPU: running the item
            if busy:
                os.kill(busy[0], signal.SIGKILL)
                killed.append(busy[0])
            time.sleep(0.05)

    done.clear()
    killer = threading.Thread(target=once, daemon=True)
    killer.start()
    try:
        out = _map_results(fns.spin, [2.0])
    finally:
        done.set()
        killer.join()
    assert killed, "no slot process ran the item"
    assert out[0].ok and out[0].attempts == 2, out[0]


def test_a_partial_travels_with_the_arguments_it_binds():
    import functools

    cube = functools.partial(fns.power, exponent=3)
    assert peerwasm.map(cube, [2, 3]) == [8, 27]
    tenfold = functools.partial(functools.partial(fns.add, 1), scale=10)
    assert peerwasm.map(tenfold, [2]) == [30]
    assert peerwasm.run(tenfold, 2, scale=2) == 6, "the call's keywords win, as a partial's do"
    # The classes of a partial's arguments travel too.
    assert peerwasm.map(functools.partial(fns_shared.shifted, fns_shared.Pair(1, 2)), [10, 20]) == [13, 23]
    # A partial of a lambda: the lambda travels as its text.
    assert peerwasm.map(functools.partial(fns_nested.ADD, 1), [1]) == [2]


def test_a_bound_method_runs_on_its_instance_as_its_class_defines_it():
    import fractions

    double = fns.Scaler(2)
    assert peerwasm.map(double.apply, [1, 2]) == [2 * fns._scaled(1), 2 * fns._scaled(2)]
    assert peerwasm.run(fns.Scaler(3).apply, 1) == 3 * fns._scaled(1)
    assert peerwasm.map(double.hidden(), [5]) == [-5], "a private method, by its mangled name"
    # A library class's instance: the class comes by import, as pickle has it.
    third = fractions.Fraction(1, 3)
    assert peerwasm.run(third.as_integer_ratio) == (1, 3)
    assert peerwasm.map(third.limit_denominator, [10]) == [third]
    import collections

    assert peerwasm.run(collections.Counter("aab").copy) == collections.Counter("aab")
    # (a class itself is not data)
    with pytest.raises(peerwasm.RemoteError, match="the result of Fraction.__reduce__ cannot be sent back"):
        peerwasm.run(third.__reduce__)
    with pytest.raises(TypeError, match="generator"):
        peerwasm.map(double.steps, [2])
    assert peerwasm.map(fns.Scaler.of, [4]) == [40], "a class method, on its class"


def test_the_classes_of_objects_inside_the_arguments_travel_too():
    # A Point inside a dict inside a Holder: a pickle that names both.
    assert peerwasm.map(fns.inner_norm, [fns.Holder(fns.Point(1, -2))]) == [3]
    assert peerwasm.run(fns.inner_norm, fns.Holder(fns.Point(3, 4))) == 7


def test_a_library_function_is_imported_in_the_sandbox_by_its_names():
    import json

    # A builtin, a ufunc, a library `def`: found again by module and name,
    # as pickle finds them for a process pool; nothing of theirs is sent.
    assert peerwasm.map(abs, [-1, 2]) == [1, 2]
    assert peerwasm.map(np.sqrt, [4.0]) == [2.0]
    assert peerwasm.run(json.dumps, {"a": 1}, sort_keys=True) == '{"a": 1}'
    with pytest.raises(peerwasm.RemoteError, match="expected 2 arguments"):
        import operator

        peerwasm.map(operator.add, [1])
    # A library the sandbox does not have: its import's error, as the call's.
    with pytest.raises(peerwasm.RemoteError, match="No module named '_pytest'"):
        peerwasm.run(pytest.importorskip, "json")


def test_a_notebooks_class_travels_with_its_instances_bound_method():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("import numpy as np", store_history=True).raise_error()
    shell.run_cell(
        "class Model:\n"
        "    def __init__(self, w):\n        self.w = np.asarray(w)\n"
        "    def __score(self, x):\n        return float(self.w @ np.asarray(x))\n"
        "    def predict(self, x):\n        return self.__score(x)\n",
        store_history=True,
    ).raise_error()
    shell.run_cell("m = Model([1.0, 2.0])", store_history=True).raise_error()
    assert peerwasm.map(shell.user_ns["m"].predict, [[1, 1], [2, 0]]) == [3.0, 2.0]


def test_a_fitted_model_sent_back_is_refused_saying_what_to_return():
    # scikit-learn is in the sandbox; a fitted model is not data.
    with pytest.raises(peerwasm.RemoteError) as e:
        peerwasm.run(fns.fits_a_model, 20)
    assert "LogisticRegression" in e.value.message and "coef_" in e.value.message, e.value.message


def test_an_item_that_cannot_go_to_the_sandbox_is_named_with_what_to_do():
    import threading

    with pytest.raises(TypeError, match=r"^item 2 of the map: the arguments cannot go.*a lock, a generator"):
        peerwasm.map(fns.square, [1, 2, threading.Lock(), 4])
    with pytest.raises(TypeError, match=r"^the arguments cannot go.*'generator'"):
        peerwasm.run(fns.square, (x for x in range(3)))


def test_a_grid_searchs_results_come_back_masked_parameters_and_all():
    results, best = peerwasm.run(fns.searches, 20)
    assert isinstance(results["param_C"], np.ma.MaskedArray) and results["param_C"].tolist() == [0.1, 1.0]
    assert best["C"] in (0.1, 1.0) and len(results["mean_test_score"]) == 2
