"""A module as scientists write them: a host-only import sharing its
statement with one the sandbox has, a constant made from a file only the
host has (`peerwasm.map` sends what a function uses of it: its value), a
class that reads that file as the module loads (its source travels, and
fails there), decorated functions, and functions that cannot be mapped (a
generator, a coroutine)."""

import dataclasses, os, peerwasm  # noqa: E401,F401  (one statement, on purpose)
import functools

HERE = os.path.dirname(os.path.abspath(__file__))
# Beside this file on the host; in the sandbox the program is /script/job.py
# and nothing is beside it.
LOCAL_SOURCE = open(os.path.join(HERE, "localmod.py")).read()


@dataclasses.dataclass
class Pair:
    a: int
    b: int


def total(p):
    return p.a + p.b


def shifted(p, by):
    """Names no class: a `Pair` bound by a partial must travel with it."""
    return p.a + p.b + by


def local_lines(_):
    return len(LOCAL_SOURCE.splitlines())


class LocalFile:
    """Reads a file beside this one as its module loads."""

    LINES = open(os.path.join(HERE, "localmod.py")).read().splitlines()


def local_file_lines(_):
    return len(LocalFile.LINES)


def doubled(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return 2 * fn(*args, **kwargs)

    return wrapper


@doubled
def twice_square(x):
    return x * x


@functools.lru_cache(maxsize=None)
def cached_cube(x):
    return x**3


def gives_one_by_one(n):
    yield from range(n)


async def awaits(x):
    return x
