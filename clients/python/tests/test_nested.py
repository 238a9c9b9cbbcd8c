"""Lambdas and functions made inside another travel as process pools send
them (`peerwasm/_nested.py`): their own text, checked against the code that
runs, and the variables they read of the functions around them by value."""

import pathlib
import sys

import numpy as np
import pytest

import peerwasm

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import fns_nested as n  # noqa: E402
from test_peerwasm import pool  # noqa: E402,F401  (the two-worker pool fixture)


def test_a_closure_takes_its_variables_helpers_modules_and_imports():
    work = n.worker([4.0, 9.0, 16.0], 10)
    assert peerwasm.map(work, range(3)) == [work(i) for i in range(3)]
    assert peerwasm.run(work, 1) == work(1)


def test_a_closure_runs_on_a_pool(pool):  # noqa: F811
    weights = np.random.rand(12)
    got = peerwasm.map(n.lambda_over(weights), range(12), peers=pool[:1])
    assert got == [float(w * 10) for w in weights]


def test_lambdas_at_the_top_level_and_in_a_call_run():
    assert peerwasm.map(n.SQUARE, [3, 4]) == [9, 16]
    assert peerwasm.map(n.PAIR[1], [3]) == [2]  # the right one of two on a line
    assert n.maps_with_lambdas() == ([107, 114], [6])


def test_a_variable_holding_the_modules_own_function_of_that_name_brings_it():
    assert peerwasm.map(n.through_a_default(), [1]) == [101]


def test_a_function_that_calls_itself_through_its_own_name_runs():
    assert peerwasm.map(n.recursive(), [5]) == [120]


@pytest.mark.parametrize(
    "make, says",
    [
        (n.accumulating, "nonlocal"),
        (n.drawing, "random generator"),
        (n.with_a_local_class, "a class defined inside a function"),
        (n.shadowing, "rename one"),
    ],
)
def test_what_cannot_travel_is_refused_saying_why(make, says):
    with pytest.raises(TypeError, match=says):
        peerwasm.map(make(), [0])


def test_a_lambda_in_a_notebook_cell_runs():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("import peerwasm\nbase = 5\ndef setup():\n    k = 3\n    return lambda x: x * k + base",
                   store_history=True).raise_error()
    shell.run_cell("out = peerwasm.map(setup(), [1, 2])\nsquares = peerwasm.map(lambda x: x * x, [4])",
                   store_history=True).raise_error()
    assert shell.user_ns["out"] == [8, 11] and shell.user_ns["squares"] == [16]


def test_a_bound_method_and_default_values_go_by_value():
    applies, makers = n.with_a_bound_method_and_defaults()
    assert peerwasm.map(applies, [1, 2]) == [3, 6]
    assert [peerwasm.run(m, 5) for m in makers] == [0, 5, 10]


def test_an_object_called_as_a_function_runs_as_its_call():
    assert peerwasm.map(n.Threshold(3), [5, 10]) == [1, 6]
    assert peerwasm.run(n.Threshold(0), 4) == 3


def test_lambdas_and_closures_inside_the_arguments_are_made_again_in_the_sandbox():
    for got, here in n.lambdas_in_the_arguments():
        assert got == here
    # A data global holding lambdas still travels as its statement.
    assert peerwasm.map(n.transforms, [1, 2]) == [n.transforms(1), n.transforms(2)]


def test_an_argument_holding_a_lambda_is_refused_saying_what_to_do():
    # One of another module than the function's: its module's definitions
    # do not travel.
    with pytest.raises(TypeError, match="holds a lambda"):
        peerwasm.run(n.Threshold(0), {"key": lambda v: v})
    # One that reads itself (a recursive closure): refused, not a pickling loop.
    with pytest.raises(TypeError, match="reads itself"):
        peerwasm.run(n.applies_each, {"fact": n.recursive()}, 3)
