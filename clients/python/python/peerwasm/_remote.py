"""What a function's exception in the sandbox becomes in the caller:
`RemoteError`, carrying the guest's type name, message and traceback —
and, when that type is one the caller has too and can catch safely, an
instance of it as well, so that `except ValueError:` (or `except
MyModelError:`) around a map catches what the function raised, as with a
process pool (Ray's task errors do the same).

Which types: the class the guest names (its module and qualified name,
the guest program's own as the caller's module: `_wire.class_name`) is
looked up among the modules this process has loaded, never imported
(`_wire.loaded_class`); it must be an `Exception` of a plain metaclass
whose Python-level classes define no `__init__`, `__new__` or
`__init_subclass__` — so that making the combined class and its instance
runs none of the caller's code on the guest's words — and not one whose
constructor needs more than a message (`UnicodeError`'s, exception
groups). Anything else stays a plain `RemoteError`.
"""

import builtins
import functools

from . import _wire


class RemoteError(Exception):
    """An exception raised by a function inside the sandbox.

    `type_name` and `message` are the guest exception's; `traceback` is its
    traceback as the guest printed it; `result` is the job's `Result`
    (peak memory, peer, ...); `index` the item's position in a map (None
    for `run`), which the error's text starts with. When the guest's
    exception is of a type this process has and may catch (`ValueError`,
    a `class MyError(Exception): pass` of the function's module), the
    error is an instance of that type too.
    """

    def __init__(self, type_name, message, traceback, result):
        self.index = getattr(result, "index", None)
        where = "" if self.index is None else f"item {self.index} of the map: "
        super().__init__(f"{where}{type_name}: {message}\n\nTraceback in the sandbox:\n{traceback}")
        self.type_name = type_name
        self.message = message
        self.traceback = traceback
        self.result = result

    # The text as said above, whatever the guest's type prints (a KeyError
    # would quote it).
    __str__ = Exception.__str__


def remote_error(type_name, message, traceback, result, kind=None):
    """The `RemoteError` for a guest's exception; `kind`: its class as
    `"module:qualname"` (see the module docs)."""
    module, _, qualname = (kind or "").partition(":")
    cls = _wire.loaded_class(module, qualname) if qualname else None
    # A plain metaclass before anything else: the cache below hashes the
    # class, and another metaclass's `__hash__` would be code of its own.
    combined = _catchable(cls) if type(cls) is type else None
    return (combined or RemoteError)(type_name, message, traceback, result)


# What needs more than a message to be made (exception groups: 3.11+).
_NOT_BY_MESSAGE = tuple(c for c in (UnicodeError, getattr(builtins, "BaseExceptionGroup", None)) if c)


@functools.lru_cache(maxsize=256)
def _catchable(cls):
    """`RemoteError` and `cls` in one class, or None when `cls` may not be
    (see the module docs)."""
    if not issubclass(cls, Exception) or issubclass(cls, (RemoteError, *_NOT_BY_MESSAGE)):
        return None
    for c in cls.__mro__:
        if c.__module__ != "builtins" and {"__init__", "__new__", "__init_subclass__"} & set(vars(c)):
            return None
    try:
        return type(f"RemoteError({cls.__name__})", (RemoteError, cls), {"__module__": __name__})
    except TypeError:  # layouts that cannot be combined (`__slots__`)
        return None
