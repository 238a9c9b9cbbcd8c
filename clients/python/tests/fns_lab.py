"""Functions that use packages of the tests' own: labpkg, beside this file,
and deeppkg, in src/ (on sys.path, as a src layout or an editable install
puts it)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))

from deeppkg import twice  # noqa: E402
from labpkg.scaling import scale  # noqa: E402


def uses_the_package(x):
    return scale(x) - 1


def uses_the_src_package(x):
    return twice(x)
