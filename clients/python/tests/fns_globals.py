"""Functions that read their module's data globals, for the tests of what
travels by value (`peerwasm/_globals.py`): values the sandbox could not
make again from their statements."""

import dataclasses
import functools
import json
import os
import tempfile

import numpy as np
import pandas as pd
import pluggy  # a package the sandbox does not have

# Other numbers each time the statement runs: the sandbox must see these.
NOISE = np.random.rand(64)
# Read from a file that is gone once the module has loaded.
_fd, _path = tempfile.mkstemp(suffix=".json")
with os.fdopen(_fd, "w") as _f:
    json.dump({"scale": 7}, _f)
with open(_path) as _f:
    PARAMS = json.load(_f)
os.remove(_path)


@dataclasses.dataclass
class Setting:
    factor: float


def double(x):
    return 2 * x


def triple(x):
    return 3 * x


# What their pickles name travels too: a class, functions by name.
SETTING = Setting(1.5)
OPS = {"d": double, "t": triple}
PARTIAL = functools.partial(triple, 5)
STOP = {"the", "a", "an", "of", "and", "or"}
# Read as the module loads: a class body's value.
SCALED = 4


class Uses:
    FACTOR = SCALED * 10


# Over the size that goes inside the program: one file beside the arrays.
TABLE = {f"key{i}": f"value {i} " * 4 for i in range(5000)}
# A large array: a file of its own.
BIG = np.random.rand(300_000)
# Loads only where its package is.
MARKER = pluggy.HookspecMarker("lab")
# Text held by pyarrow where it is installed (pandas' default).
NAMES = pd.DataFrame({"name": ["p", "q"]}, index=pd.Index(["first", "second"]))
# Changed by the tests between maps.
CHANGING = [0]


def noisy(i):
    return float(NOISE[i])


def scaled(i):
    return i * PARAMS["scale"]


def mixed(i):
    return [OPS["d"](i), OPS["t"](i), PARTIAL(), SETTING.factor * i, type(SETTING).__name__, sorted(STOP)[i]]


def loaded(i):
    return Uses.FACTOR + i


def large(i):
    return TABLE[f"key{i}"], float(BIG[i])


def marker(i):
    return MARKER.project_name


def changing(i):
    return CHANGING[0] + i


def name_at(i):
    return NAMES.name.iloc[i], NAMES.index[i]


def text_of(frame):
    return [None if pd.isna(v) else v for v in frame["name"]], list(frame.index), str(frame["name"].dtype)


# Ranks read by `rank`, a key a library's function is given.
ORDER = {"a": 2, "b": 1, "c": 3}


def rank(letter):
    return ORDER[letter] * SETTING.factor
