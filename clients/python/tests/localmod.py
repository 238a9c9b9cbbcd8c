"""A module of the tests' own, beside fns.py: it travels with the
functions of fns that use it (it is not installed anywhere)."""

import math


def hypotenuse(a, b):
    return math.hypot(a, b)
