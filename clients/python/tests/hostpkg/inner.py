from pluggy import HookimplMarker  # noqa: F401  (host only, unused here)


def twice(x):
    return 2 * x
