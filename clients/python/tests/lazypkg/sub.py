"""Loaded by `lazypkg` on first use."""

VALUE = 40
