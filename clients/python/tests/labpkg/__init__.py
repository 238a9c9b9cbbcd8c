"""A package of the tests' own, beside them (not installed): it travels
with the functions that need it, its Python sources only."""
