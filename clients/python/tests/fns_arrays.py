"""Functions given large numpy arrays (moved as files: peerwasm/_arrays.py)."""


def summary(a, again=None):
    """What arrived: its sum, shape, dtype, whether a second reference to it
    is the same array, and whether it may be written."""
    return float(a.sum()), list(a.shape), str(a.dtype), again is a, bool(a.flags.writeable)


def row_sum(row, X):
    return float(X[row].sum())


def same_values(a, first):
    """Its dtype, shape, and whether its first values are those given."""
    return [str(a.dtype), list(a.shape), a.tolist()[:5] == first]


def dot_with_row(item, X):
    """An array of the item's own against a row of one all items share."""
    index, a = item
    return float(a @ X[index])
