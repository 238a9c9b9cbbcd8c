"""Large numpy arrays in the arguments travel as files by content hash
(`peerwasm/_arrays.py`): past the 64 MiB input limit, once per map however
many items share them, embedded and on a pool."""

import functools
import os
import time

import numpy as np
import pytest

import peerwasm
from peerwasm import _arguments, _arrays

import fns_arrays
from test_peerwasm import pool  # noqa: F401  (the two-worker pool fixture)


def _kept():
    root = os.path.join(os.environ["PEERWASM_CACHE_DIR"], "arrays")
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def test_an_array_over_the_input_limit_arrives_whole_and_its_file_goes_after():
    big = np.arange(10_000_000, dtype=np.float64)  # 80 MB: over the 64 MiB a job's input may be
    before = _kept()
    got = peerwasm.run(fns_arrays.summary, big, again=big, mem="768MiB")
    assert got == (float(big.sum()), [10_000_000], "float64", True, True)
    assert _kept() == before, "the arrays' directory is removed once the jobs are done"


def test_arrays_of_every_plain_dtype_travel_as_files():
    n = 200_000
    arrays = [
        np.arange(n).astype("datetime64[s]"),
        np.arange(n).astype("timedelta64[ms]"),
        np.zeros(n, dtype=[("a", "<f8"), ("b", "<i4")]),
        np.ones(n, dtype=">f8"),
        np.asfortranarray(np.arange(300_000, dtype=np.float64).reshape(1000, 300)),
    ]
    for a in arrays:
        assert a.nbytes >= _arrays.ARRAY_AS_FILE
        assert peerwasm.run(fns_arrays.same_values, a, a.tolist()[:5]) == [str(a.dtype), list(a.shape), True]


def test_an_array_bound_to_every_item_travels_once_not_in_each_item():
    X = np.random.default_rng(1).random((1500, 1000))  # 12 MB
    calls = [((i,), {"X": X}) for i in range(50)]
    inputs, _, mounts = _arguments.inputs(fns_arrays.row_sum, calls, None, None, None)
    mounts.finish()
    try:
        assert max(len(i) for i in inputs) < 1024, [len(i) for i in inputs[:3]]
        [(host, guest, read_only)] = mounts.grants
        assert guest == _arrays.GUEST and read_only
        assert [n for n in os.listdir(host) if n.endswith(".npy")] and len(os.listdir(host)) == 1
    finally:
        mounts.close()
    out = peerwasm.map(functools.partial(fns_arrays.row_sum, X=X), range(50))
    assert np.allclose(out, X[:50].sum(axis=1))


def test_large_arrays_reach_a_pool_by_content_hash(pool):  # noqa: F811
    X = np.random.default_rng(2).random((1200, 1000))
    out = peerwasm.map(functools.partial(fns_arrays.row_sum, X=X), range(8), peers=pool[:1])
    assert np.allclose(out, X[:8].sum(axis=1))
    big = np.ones(9_000_000, dtype=np.float64)
    got = peerwasm.run(fns_arrays.summary, big, mem="768MiB", peers=pool[:1])
    assert got[:3] == (9_000_000.0, [9_000_000], "float64")


def test_a_map_over_new_arrays_starts_from_the_snapshot_the_last_one_made():
    # Only items read the arrays: a new set of them is no reason to run the
    # module's imports again (the embedded worker keeps its snapshots on disk).
    snapshots = os.path.join(os.environ["PEERWASM_CACHE_DIR"], "modules", "snapshots")

    def kept():
        return set(os.listdir(snapshots)) if os.path.isdir(snapshots) else set()

    rng = np.random.default_rng()
    first = rng.random((400, 1000))
    assert np.allclose(peerwasm.map(functools.partial(fns_arrays.row_sum, X=first), range(4)), first[:4].sum(axis=1))
    before = kept()
    assert before, "the first map kept its snapshot"
    second = rng.random((400, 1000))
    assert np.allclose(peerwasm.map(functools.partial(fns_arrays.row_sum, X=second), range(4)), second[:4].sum(axis=1))
    assert kept() <= before, "a new snapshot for new arrays"


def test_the_directory_of_arrays_lives_while_any_map_holds_it():
    x = np.arange(300_000, dtype=np.int64)  # 2.4 MB
    first, second = _arrays.Arrays(), _arrays.Arrays()
    for arrays in (first, second):
        assert arrays.persistent_id(x)[0] == _arrays.TAG
        assert arrays.persistent_id(np.arange(10)) is None  # small: inside the pickle
        arrays.finish()
    assert first.dir == second.dir and os.path.isdir(first.dir)
    first.close()
    assert os.path.isdir(second.dir), "still held by the second map"
    second.close()
    assert not os.path.exists(second.dir)


def test_what_a_dead_map_left_is_swept_but_not_what_a_live_one_holds():
    root = _arrays._root()
    orphan = os.path.join(root, "0" * 32)
    os.makedirs(orphan, exist_ok=True)
    held = _arrays.Arrays()
    held.persistent_id(np.zeros(200_000))
    held.finish()
    old = time.time() - 2 * _arrays._ORPHAN_AGE_S
    for d in (orphan, held.dir):
        os.utime(d, (old, old))
    try:
        other = _arrays.Arrays()
        other.persistent_id(np.ones(200_000))
        other.finish()
        other.close()
        assert not os.path.exists(orphan), "left by a map that died: swept"
        assert os.path.isdir(held.dir), "held by a live map: kept"
    finally:
        held.close()


def test_other_large_arguments_are_refused_before_any_job_saying_what_to_do():
    blob = b"x" * (peerwasm._peerwasm.MAX_INPUT_BYTES + 1)
    with pytest.raises(ValueError, match="files="):
        peerwasm.run(fns_arrays.summary, blob)
    assert not [d for d in _kept() if d.startswith(".partial-")], "nothing staged is left behind"


def test_on_a_pool_an_array_only_its_item_has_goes_inside_its_pickle():
    # A directory of per-item arrays would go whole to every worker before
    # its first item; each item's own array goes only where it runs.
    rng = np.random.default_rng(3)
    X = rng.random((300, 1000))  # 2.4 MB, shared by every item
    own = [rng.random(300_000) for _ in range(4)]  # 2.4 MB each, one per item
    huge = np.ones(9_000_000)  # 72 MB: cannot go inside an input
    calls = [((a,), {"X": X}) for a in own] + [((huge,), {"X": X})]
    for pool, inside in ((True, [True] * 4 + [False]), (False, [False] * 5)):
        inputs, _, mounts = _arguments.inputs(fns_arrays.row_sum, calls, None, None, None, pool=pool)
        mounts.finish()
        try:
            assert [len(i) > own[0].nbytes for i in inputs] == inside, (pool, [len(i) for i in inputs])
            [(host, _, _)] = mounts.grants
            files = sorted(n for n in os.listdir(host) if n.endswith(".npy"))
            assert len(files) == (2 if pool else 6), files  # X and huge; or every one
        finally:
            mounts.close()


def test_a_map_over_arrays_of_their_own_runs_on_a_pool(pool):  # noqa: F811
    rng = np.random.default_rng(4)
    own = [rng.random(200_000) for _ in range(6)]
    X = rng.random((6, 200_000))
    out = peerwasm.map(functools.partial(fns_arrays.dot_with_row, X=X), list(enumerate(own)), peers=pool)
    assert np.allclose(out, [float(own[i] @ X[i]) for i in range(6)])
