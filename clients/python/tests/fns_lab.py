"""A function that uses a package of the tests' own (labpkg, beside it)."""

from labpkg.scaling import scale


def uses_the_package(x):
    return scale(x) - 1
