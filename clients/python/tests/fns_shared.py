"""A module as scientists write them: a host-only import sharing its
statement with one the sandbox has, and a constant made from a file only
the host has (`peerwasm.map` sends what a function uses of it)."""

import dataclasses, os, peerwasm  # noqa: E401,F401  (one statement, on purpose)

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


def local_lines(_):
    return len(LOCAL_SOURCE.splitlines())
