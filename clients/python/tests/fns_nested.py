"""Functions that are not a module's top-level `def`, for the tests of
`peerwasm/_nested.py`: lambdas, and functions made inside another that
read its variables."""

import math

import numpy as np

import peerwasm

OFFSET = 100
data = "the module's own data"


def shift(x):
    return x + OFFSET


SQUARE = lambda x: x * x  # noqa: E731  (a lambda bound at the top level)
PAIR = (lambda x: x + 1, lambda x: x - 1)  # two on one line
ADD = lambda a, b: a + b  # noqa: E731


def worker(values, scale):
    """A closure over data, a module, a library function, a helper made
    beside it (with a default value read as it is made), and a function
    of this module."""
    import statistics
    from math import sqrt

    factor = 2

    def helper(x, k=factor):
        return math.floor(sqrt(x)) * k + shift(0)

    def work(i):
        return helper(values[i]) * scale, statistics.mean([1, 3])

    return work


def lambda_over(weights):
    return lambda i: float(weights[i] * 10)


def recursive():
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)

    return fact


def accumulating():
    total = 0

    def bump(i):
        nonlocal total
        total += i
        return total

    return bump


def drawing():
    rng = np.random.default_rng()

    def draw(i):
        return rng.random()

    return draw


def with_a_local_class():
    class Local:
        pass

    def make(i):
        return Local()

    return make


def shadowing():
    """`data` here is not the module's `data`, which `describe` reads."""
    data = [1, 2, 3]

    def uses_both(i):
        return data[i], describe()

    return uses_both


def describe():
    return data



def maps_with_lambdas():
    """Lambdas written in the call, one reading a variable of its own."""
    k = 7
    return peerwasm.map(lambda x: x * k + OFFSET, [1, 2]), peerwasm.map(lambda x: (lambda y: y * 3)(x), [2])


TRANSFORMS = {"inc": lambda x: x + 1, "dbl": lambda x: 2 * x}


def transforms(x):
    """A data global holding lambdas: its statement travels, lambdas and all."""
    return applies_each(TRANSFORMS, x)


def applies_each(functions, x):
    """Each function it is given, applied to `x`."""
    return {name: f(x) for name, f in sorted(functions.items())}


def lambdas_in_the_arguments():
    """What a cloudpickle user passes inside the arguments: lambdas (one
    reading this module's helper, one in a loop with its default computed),
    a closure over data and a module, a sort key in a partial — each
    returned beside what it gives here."""
    import functools
    import statistics

    scale = np.array([1.5, 2.0])

    def weighted(x, k=OFFSET):
        return float(statistics.mean(scale * x)) + k

    functions = {"shifted": lambda x: shift(x) * 2, "weighted": weighted,
                 **{f"times{k}": (lambda x, k=k: x * k) for k in (2, 3)}}
    by_second = functools.partial(sorted, key=lambda row: row[1])
    rows = [[(1, "b"), (2, "a")], [(3, "z"), (4, "y")]]
    return (
        (peerwasm.map(functools.partial(applies_each, functions), [1, 2]), [applies_each(functions, x) for x in (1, 2)]),
        (peerwasm.map(by_second, rows), [by_second(r) for r in rows]),
    )


def with_a_bound_method_and_defaults():
    """A closure over a bound method; lambdas whose default values were
    computed in a loop (`k=k`)."""
    scaler = Scaler(3)
    apply = scaler.apply
    makers = [lambda x, k=k: x * k + apply(0) for k in range(3)]
    return (lambda i: apply(i)), makers


class Scaler:
    def __init__(self, factor):
        self.factor = factor

    def apply(self, x):
        return x * self.factor


class Threshold:
    """An object called as a function, as `Pool.map(Threshold(3), xs)`
    takes it."""

    def __init__(self, limit):
        self.limit = limit

    def __call__(self, x):
        return sum(1 for i in range(x) if i > self.limit)


def through_a_default(shift=shift):
    """A closure over a variable holding this module's own `shift`, by the
    same name."""

    def work(i):
        return shift(i)

    return work
