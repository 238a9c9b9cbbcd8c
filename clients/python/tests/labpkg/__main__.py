"""`python -m labpkg`: a package's own script, with nothing guarded,
mapping a function it defines with relative imports (test_functions)."""
import peerwasm

from . import scaling
from .scaling import scale


def twice_scaled(x):
    return scale(scaling.scale(x))


print("VALUES", peerwasm.map(twice_scaled, [1, 2]))
