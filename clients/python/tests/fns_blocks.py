"""Module globals bound inside top-level blocks, as real modules bind them."""

import sys

try:
    import ujson as json  # not in the sandbox (nor, likely, here)
except ImportError:
    import json

if sys.version_info >= (3, 0):
    MODE = "py3"

    def shout(s):
        return s.upper()
else:
    MODE = "py2"

    def shout(s):
        return s

for _n in range(3):
    LAST = _n


def encodes(x):
    """A fallback import, an `if`'s constant and function, a loop's value."""
    return json.dumps({"x": x, "mode": shout(MODE), "last": LAST})


if __name__ == "__main__":
    raise SystemExit("the script's own run never travels")


SQUARES = []
for _n in range(4):
    SQUARES.append(_n * _n)


def squares(i):
    """A list a top-level loop filled."""
    return SQUARES[i]
