"""Functions using modules of the tests' own that import a package the
sandbox does not have (`hostmod`, `hostpkg`)."""

import hostmod
import hostpkg


def uses_the_module(r):
    return hostmod.area(r)


def uses_the_package(x):
    return hostpkg.double(x)


def uses_the_missing_import(name):
    return hostmod.project(name)
