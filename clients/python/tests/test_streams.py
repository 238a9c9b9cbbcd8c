"""A map read as it goes: `imap` (in order, and as items finish), what
Ctrl-C leaves (`Interrupted`), the progress bar, keyword arguments of
`run`, and which item failed."""

import json
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import peerwasm

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))
import fns  # noqa: E402
from test_peerwasm import PRIMES, setup_module  # noqa: E402,F401  (builds the guests)


def test_imap_yields_each_value_in_order_as_soon_as_it_is_done():
    # Two slots, one item that naps 5 s, last: the others are done (and
    # handed over) long before it, whichever slot each gets.
    started = time.monotonic()
    seen = []
    for value in peerwasm.imap(fns.nap, [0, 0, 0, 5]):
        seen.append((value, time.monotonic() - started))
    assert [v for v, _ in seen] == [0, 0, 0, 5]
    first, last = seen[0][1], seen[-1][1]
    assert last >= 5.0, seen
    assert first < last - 3.0, f"the first value came when the map was done: {seen}"


def test_imap_unordered_yields_what_finishes_first_and_with_index_says_which():
    pairs = list(peerwasm.imap_unordered(fns.nap, [3, 0, 0, 0], with_index=True))
    assert sorted(pairs) == [(0, 3), (1, 0), (2, 0), (3, 0)]
    assert pairs[-1] == (0, 3), f"the slow item came last: {pairs}"
    assert list(peerwasm.imap(fns.square, [1, 2, 3], ordered=False, with_index=True)) != []


def test_leaving_an_imap_loop_early_cancels_what_is_under_way():
    # One 30 s nap among the first submissions (which slot each takes is
    # not fixed): the fast items come first, then the loop is left.
    started = time.monotonic()
    for value in peerwasm.imap(fns.nap, [0, 0, 0, 30, 30]):
        assert value == 0
        break
    # The naps are cancelled: a new map gets both slots at once.
    assert peerwasm.map(fns.nap, [1, 1]) == [1, 1]
    assert time.monotonic() - started < 20, "the 30 s naps ran on"


def test_a_wasm_map_is_an_iterator_too_and_a_failed_item_is_named():
    outs = [r.output["count"] for r in peerwasm.imap(PRIMES, [{"n": 10}, {"n": 100}])]
    assert outs == [4, 25]
    with pytest.raises(peerwasm.JobError) as e:
        peerwasm.map(PRIMES, [{"n": 10}, {"n": 5000000000}])
    assert str(e.value).startswith("item 1 of the map: "), e.value
    assert e.value.result.index == 1


def test_run_passes_keyword_arguments_and_keeps_its_own():
    assert peerwasm.run(fns.power, 2, exponent=10, offset=1, mem="256MiB", timeout=60) == 1025
    assert peerwasm.run(fns.power, 3) == 9


def test_progress_shows_a_bar_that_ends_at_the_total(capsys):
    assert peerwasm.map(fns.square, [1, 2, 3], progress=True) == [1, 4, 9]
    err = capsys.readouterr().err
    assert "3/3" in err, err


def test_ctrl_c_keeps_what_was_done(tmp_path):
    # The slow item first: the fast ones after it are done but not yet
    # handed over (the map is in input order) when Ctrl-C comes; they are
    # kept all the same.
    script = tmp_path / "interrupted.py"
    script.write_text(
        "import json, signal, sys, time\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "import fns, peerwasm\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "peerwasm.map(fns.nap, [0])  # CPython started once, its snapshot made\n"
        "print('ready', flush=True)\n"
        "started = time.monotonic()\n"
        "try:\n"
        "    peerwasm.map(fns.nap, [60, 0, 0, 0])\n"
        "except peerwasm.Interrupted as e:\n"
        "    print(json.dumps({'done': sorted(e.done.items()), 'total': e.total,\n"
        "                      'keyboard': isinstance(e, KeyboardInterrupt),\n"
        "                      'after': time.monotonic() - started}))\n"
    )
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(6)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=30)
    finally:
        p.kill()
    report = json.loads(out)
    assert report["done"] == [[1, 0], [2, 0], [3, 0]], report
    assert report["total"] == 4 and report["keyboard"], report
    assert report["after"] < 30, report


def test_a_result_over_max_output_says_how_to_send_it_and_max_output_raises_the_limit():
    with pytest.raises(peerwasm.JobError) as e:
        peerwasm.run(fns.big_result, 2, max_output="1MiB")
    assert e.value.result.outcome == "output_limit_exceeded", e.value
    assert "max_output=" in str(e.value) and "outputs=" in str(e.value), e.value
    assert len(peerwasm.run(fns.big_result, 2, max_output="3MiB")) == 2 << 20
    with pytest.raises(peerwasm.JobError, match="item 1 of the map"):
        peerwasm.map(fns.big_result, [0, 2], max_output="1MiB")


def test_an_input_over_the_limit_is_refused_before_any_job_embedded_as_on_a_pool():
    big = b"x" * (peerwasm._peerwasm.MAX_INPUT_BYTES + 1)
    started = time.monotonic()
    with pytest.raises(ValueError, match="item 1's arguments pickle to 64.0 MiB.*files="):
        peerwasm.map(fns.square, [1, big])
    with pytest.raises(ValueError, match="the arguments pickle to"):
        peerwasm.run(fns.square, big)
    assert time.monotonic() - started < 10, "refused up front, not after running"
