"""A function whose module's local module seeds the global generators."""

import seedmod


def draws_from_the_seeded_globals(i):
    return seedmod.draw()
