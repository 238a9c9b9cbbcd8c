"""Functions given large numpy arrays (moved as files: peerwasm/_arrays.py)."""


def summary(a, again=None):
    """What arrived: its sum, shape, dtype, whether a second reference to it
    is the same array, and whether it may be written."""
    return float(a.sum()), list(a.shape), str(a.dtype), again is a, bool(a.flags.writeable)


def row_sum(row, X):
    return float(X[row].sum())
