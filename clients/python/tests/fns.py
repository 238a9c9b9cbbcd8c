"""Functions the tests send into the sandbox (defined in a file, as
`peerwasm.map(fn, ...)` needs: their source is what crosses)."""

import collections
import dataclasses
import enum
import functools
import json

import numpy as np

import lazypkg  # a package of the tests' own that loads its submodule on first use
import localmod  # a module of the tests' own, beside this file
import peerwasm  # the host's client: a host-only import, not in the sandbox


def describe(a):
    """numpy in and out."""
    return {"mean": float(a.mean()), "doubled": a * 2, "dtype": str(a.dtype)}


SCALE = 3
OFFSETS = {"a": 1, "b": SCALE * 10}


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def norm1(self):
        return abs(self.x) + abs(self.y)


def _scaled(x):
    return x * SCALE + OFFSETS["b"]


def uses_its_module(x):
    """A helper, constants (one built from another) and a class of its module."""
    return _scaled(x) + Point(x, -x).norm1()


@functools.lru_cache(maxsize=None)
def _squares(n):
    """A helper kept by a decorator's wrapper object, not a function."""
    return tuple(i * i for i in range(n))


@functools.cache
def _cubes(n):
    return tuple(i**3 for i in range(n))


def uses_cached_helpers(n):
    _squares(n)  # a second call in the same item: the cache's
    return sum(_squares(n)) + sum(_cubes(n)), _squares.cache_info().hits


def uses_a_local_module(a, b):
    return localmod.hypotenuse(a, b)


def norm_of(p):
    """A class of its module as the argument (it is not named here)."""
    return p.norm1()


def names_the_client():
    """Uses what only the host could import."""
    return peerwasm.__name__


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


def returns_reducing(marker):
    """Returns an object whose unpickling would run `os.system` in whoever
    unpickles it (the class is defined here: only the function's own source
    travels)."""

    class Reducing:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {marker}",))

    return Reducing()


def writes_raw_pickle(marker):
    """A guest taken over: it writes a pickle's opcodes as its reply and exits."""
    import os
    import sys

    payload = b"cos\nsystem\n(S'touch " + marker.encode() + b"'\ntR."
    sys.__stdout__.buffer.write(payload)
    sys.__stdout__.flush()
    os._exit(0)


def frame(n):
    import pandas as pd

    return pd.DataFrame({"i": list(range(n)), "name": [f"row{i}" for i in range(n)], "x": [i / 2 for i in range(n)]})


SEEN = []


def leaks(i):
    """Tries to leave state for the next item: its module's list, an
    attribute of an imported module, a builtin; and draws from both global
    random generators."""
    import builtins
    import random

    SEEN.append(i)
    before = (getattr(json, "_left_by", None), getattr(builtins, "_left_by", None))
    json._left_by = builtins._left_by = i
    return list(SEEN), before, random.random(), float(np.random.random())


def grabs(mib):
    """Holds `mib` MiB at once: its peak says so."""
    block = bytearray(mib << 20)
    return len(block)


def product(n):
    """A matrix product of n × n ones (none for 0): numpy's BLAS at work."""
    if not n:
        return 0.0
    a = np.ones((n, n))
    return float((a @ a).sum())


def _kept_open():
    import tempfile

    return tempfile.TemporaryFile()


KEPT = _kept_open()  # a file its module keeps open: a snapshot cannot carry it


def writes_to_a_kept_file(i):
    KEPT.seek(0)
    KEPT.truncate()
    KEPT.write(str(i).encode())
    KEPT.seek(0)
    return KEPT.read().decode()


def nap(seconds):
    """Sleeps, then says so (on stderr: forwarded as the item is done)."""
    import time

    time.sleep(seconds)
    print("napped", seconds)
    return seconds


def spin(seconds):
    """Keeps its CPU busy for `seconds`."""
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return seconds


def power(base, exponent=2, *, offset=0):
    return base**exponent + offset


def reads(path):
    """A data file given with `files=`, read where the host has it."""
    with open(path) as f:
        return f.read()


def uses_tinypkg(x):
    """A package given with `packages=` (unknown to the host's Python)."""
    import tinypkg

    return tinypkg.triple(x), tinypkg.__name__


def writes(path):
    with open(path, "w") as f:
        f.write("x")
    return path


def plots(n):
    """A matplotlib figure, returned as PNG bytes."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2), dpi=50)
    ax.plot(range(n), [i * i for i in range(n)])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def saves_figure(path):
    """A matplotlib figure written to a file (`outputs=`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2), dpi=50)
    ax.bar(["a", "b"], [1, 2])
    fig.savefig(path)
    plt.close(fig)
    return path


def big_result(mib):
    return b"r" * (mib << 20)


def draws_with_a_package(n):
    """Its package plots; nothing here names the plotting library."""
    import plotpkg

    return plotpkg.png(n)


class Scaler:
    """A class whose bound methods are mapped: its instance travels with
    each call, and the method runs as the class defines it."""

    def __init__(self, factor):
        self.factor = factor

    def apply(self, x):
        return _scaled(x) * self.factor

    def __hidden(self, x):
        return -x

    def hidden(self):
        return self.__hidden

    def steps(self, n):
        yield from range(n)

    @classmethod
    def of(cls, factor):
        return cls(factor).factor * 10


class Holder:
    """Holds a `Point`: its class travels though nothing here names it in
    the function mapped."""

    def __init__(self, inner):
        self.inner = {"p": inner}


def inner_norm(h):
    return h.inner["p"].norm1()


SHADOWED = peerwasm.__name__  # host-only: computing it in the sandbox fails


def doubles(SHADOWED):
    """Its parameter is named like a module global it never reads."""
    return SHADOWED * 2


TOTAL = 10
TOTAL += 5
WEIGHTS = {"a": 1}
WEIGHTS["b"] = TOTAL
WEIGHTS.update(c=3)
NAMES = ["x"]
NAMES.append("y")


def reads_changed_globals(key):
    """Module globals changed after their definitions, as the module ran."""
    return TOTAL, WEIGHTS[key], NAMES


@dataclasses.dataclass
class Measurement:
    """Returned by `measure`: rebuilt as this very class in the caller."""

    value: float
    unit: object
    bounds: object = None

    def __post_init__(self):
        if self.value < 0:
            raise ValueError("a measurement is not negative")


Bounds = collections.namedtuple("Bounds", "low high")


def measure(i):
    return Measurement(i * 1.5, localmod.Unit.METRE, Bounds(i - 1, i + 1))


class Access(enum.Flag):
    READ = 4
    WRITE = 2
    EXECUTE = 1


def survey(rows):
    """What a scientist's function returns as it is: errors caught per row
    (returned, not raised), a named tuple made inside, a Flag's combined
    members, a bounded deque, masked and structured arrays."""
    Summary = collections.namedtuple("Summary", "good bad")
    errors = []
    for row in range(rows):
        try:
            int("x" if row % 2 else str(row))
        except ValueError as e:
            errors.append(e)
    readings = np.ma.masked_invalid(np.array([1.0, np.nan, 3.0]))
    table = np.array([(1, 2.5)], dtype=[("id", "i4"), ("v", "f8")])
    recent = collections.deque(range(rows), maxlen=2)
    return Summary(rows - len(errors), errors), Access.READ | Access.WRITE, recent, readings, table


def make_point(x):
    """A plain class's instance: not data, refused."""
    return Point(x, x)


def plants_links(directory):
    """Links made in a directory the caller gave as outputs=: which the
    sandbox made (one pointing out must not be: the caller's own programs
    would follow it)."""
    import os

    made = []
    for name, target in (("up", "../../../../../../etc/passwd"), ("abs", "/etc/passwd"), ("down", "sub/x.txt")):
        try:
            os.symlink(target, os.path.join(directory, name))
            made.append(name)
        except OSError:
            pass
    return made


def starts_a_pool(kind):
    """A pool of threads or processes started inside the function: neither
    exists in the sandbox."""
    if kind == "threads":
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            return list(pool.map(abs, [-1, -2]))
    import multiprocessing

    with multiprocessing.Pool(2) as pool:
        return pool.map(abs, [-1, -2])


def power_in_the_sandbox(x):
    """Called in a forked child of a process that used peerwasm: runs
    `power` in the sandbox from there."""
    return peerwasm.run(power, x)


class PlainError(Exception):
    """Caught as itself in the caller."""


class CustomError(Exception):
    """Made with arguments of its own: stays a plain RemoteError."""

    def __init__(self, code, detail):
        super().__init__(f"{code}: {detail}")


def raises_own(kind):
    if kind == "plain":
        raise PlainError("plain")
    if kind == "key":
        raise KeyError("missing")
    if kind == "custom":
        raise CustomError(3, "custom")
    return b"\xff".decode("utf-8")  # UnicodeDecodeError: made from five arguments


def row_total(row):
    """A row of `DataFrame.itertuples()`: a named tuple of a class pandas
    makes on the fly."""
    return float(row.a + row.b), type(row).__name__


def time_index(series):
    """What of a series' time index arrives: its frequency, its first and
    last stamps, and the values."""
    index = series.index
    return index.freqstr, str(index[0]), str(index[-1]), series.tolist()


def word_counts(text):
    """A Counter (a dict subclass) back as a Counter."""
    import collections

    return collections.Counter(text.split())


def fits_a_model(n):
    """Returns a fitted scikit-learn model: not data."""
    from sklearn.linear_model import LogisticRegression

    X = [[i, i % 3] for i in range(n)]
    return LogisticRegression().fit(X, [i % 2 for i in range(n)])


def searches(n):
    """A grid search's `cv_results_` (its parameters are masked object
    arrays) and its best parameters: what a scientist returns of one."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV

    X = [[i, i % 3] for i in range(n)]
    search = GridSearchCV(LogisticRegression(), {"C": [0.1, 1.0]}, cv=2).fit(X, [i % 2 for i in range(n)])
    return search.cv_results_, search.best_params_


def imports_inside(i):
    """Whether `colorsys` — imported inside this function only — was
    imported already as the item started, and one the sandbox lacks
    still failing where the function imports it."""
    import sys

    before = "colorsys" in sys.modules
    import colorsys

    try:
        import definitely_not_in_the_sandbox  # noqa: F401
    except ImportError:
        missing = True
    return before, colorsys.rgb_to_hsv(1, 0, 0)[2] + i, missing


def reaches_lazily(i):
    """Whether `lazypkg.sub` — loaded by its package on first use — was
    loaded already as the item started; and `lazypkg.eager`, which no
    package loads, still missing as in any process."""
    import sys

    before = "lazypkg.sub" in sys.modules
    try:
        eager = lazypkg.eager.VALUE
    except AttributeError:
        eager = None
    return before, lazypkg.sub.VALUE + i, eager
