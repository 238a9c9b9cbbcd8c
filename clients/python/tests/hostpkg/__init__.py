"""A package of the tests' own whose modules import one the sandbox does
not have (pluggy, a dependency of pytest's): its other functions still
work there."""

import pluggy

from . import inner


def double(x):
    return inner.twice(x)


def marker_name():
    return pluggy.HookspecMarker("lab").project_name
