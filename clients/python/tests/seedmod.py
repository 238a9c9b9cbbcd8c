"""A local module that seeds numpy's and random's own generators with a
value as it loads (it travels with fns_seeded, which imports it)."""

import random

import numpy as np

np.random.seed(3)
random.seed(5)


def draw():
    return float(np.random.rand()), random.random()
