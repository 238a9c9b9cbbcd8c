"""Functions that draw random numbers, for the tests of what a map's items
start from: a snapshot of the prelude, where these generators were made."""

import random

import numpy as np

# Seeded from entropy as the module loads: each item must draw afresh, as
# a process of its own would.
FRESH_RNG = np.random.default_rng()
FRESH_STATE = np.random.RandomState()
FRESH_RANDOM = random.Random()
# The legacy interface over a newer bit generator made from entropy: it
# cannot be seeded again as numpy's own can (`seed()` is MT19937's alone).
FRESH_PCG_STATE = np.random.RandomState(np.random.PCG64())
# Made from entropy, then drawn from as the module loads (in the sandbox
# too: a method called on it travels with its definition): still its stream.
ADVANCED_RNG = np.random.default_rng()
ADVANCED_RNG.random()
# Made from entropy and drawn from as the module loads, of every kind whose
# state changes wholly as it draws (the legacy RandomState's MT19937 among
# them), and a stream jumped ahead: still entropy's, not a value's.
DRAWN_STATE = np.random.RandomState()
NOISE = DRAWN_STATE.randn(3000)
DRAWN_MT = np.random.Generator(np.random.MT19937())
DRAWN_MT.random(5)
DRAWN_SFC = np.random.Generator(np.random.SFC64())
DRAWN_SFC.integers(0, 9, 3, dtype=np.uint32)
JUMPED = np.random.Generator(np.random.PCG64().jumped())
# A bootstrap's data: the caller's numbers, which travel by value.
DATA = np.random.randn(50)


class Loaded:
    """Drawn from numpy's own generator as the module loads, in the
    sandbox too (a class travels as its source)."""

    FIRST = float(np.random.random())

# Seeded with a value: each item starts from that value's state.
SEEDED_RNG = np.random.default_rng(7)
SEEDED_STATE = np.random.RandomState(42)
SEEDED_RANDOM = random.Random(5)
# Made from entropy, then set by hand to a saved state: that state's.
RESTORED_STATE = np.random.RandomState()
RESTORED_STATE.set_state(np.random.RandomState(7).get_state())
RESTORED_SFC = np.random.SFC64()
RESTORED_SFC.state = np.random.SFC64(8).state


def draws_unseeded(i):
    assert Loaded.FIRST >= 0
    return [
        float(FRESH_RNG.normal()),
        float(FRESH_STATE.rand()),
        FRESH_RANDOM.random(),
        float(FRESH_PCG_STATE.rand()),
        float(ADVANCED_RNG.random()),
        float(DRAWN_STATE.rand()),
        float(DRAWN_MT.random()),
        float(DRAWN_SFC.random()),
        float(JUMPED.random()),
        float(np.random.choice(DATA) + np.random.random()),
        random.random(),
    ]


def draws_seeded(i):
    return [
        float(SEEDED_RNG.normal()),
        float(SEEDED_STATE.rand()),
        SEEDED_RANDOM.random(),
        float(RESTORED_STATE.rand()),
        int(RESTORED_SFC.random_raw()),
    ]
