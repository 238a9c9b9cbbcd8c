"""A module of the tests' own, beside fns.py: it travels with the
functions of fns that use it (it is not installed anywhere)."""

import enum
import math


def hypotenuse(a, b):
    return math.hypot(a, b)


class Unit(enum.Enum):
    """Returned inside a fns result: a class of a module of one's own."""

    METRE = "m"
    SECOND = "s"
