"""Functions the tests send into the sandbox (defined in a file, as
`peerwasm.map(fn, ...)` needs: their source is what crosses)."""

import json

import numpy as np


def describe(a):
    """numpy in and out."""
    return {"mean": float(a.mean()), "doubled": a * 2, "dtype": str(a.dtype)}


def square(x):
    print("squaring", x)  # goes to the job's stderr, not into the reply
    return x * x


def fails_on(x):
    if x == 2:
        raise ValueError(f"bad input {x}")
    return x


def add(a, b, scale=1):
    return (a + b) * scale


def dumps(d):
    return json.dumps(d, sort_keys=True)


def grows(n_mib):
    return len(bytearray(n_mib << 20))
