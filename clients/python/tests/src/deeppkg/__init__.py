"""A package of the tests' own in a `src/` directory, found through
sys.path (as a project's src layout, or an editable install, is)."""


def twice(x):
    return 2 * x
