"""A function's data globals travel by value: the module-level values it
uses that are not code — a table, an array, a frame, a fitted model, a
count — go as they are in the caller when the map (or run) begins,
pickled, as joblib, Dask and Ray send a script's globals (cloudpickle).

Why not as their source, as definitions (functions, classes, imports)
travel (`_travel`): the statement that made a value need not make it again
in the sandbox. `X = np.random.rand(100)` makes other numbers there — a
map's items then computed with another X than the caller's, silently;
`df = pd.read_csv("data.csv")` reads a file only the host has; a model
trained for an hour trains again; and a value bound under
`if __name__ == "__main__":` has no top-level statement to send at all
(NameError there).

What still travels as source:
* a value its statement makes again exactly — a literal (`N = 10`,
  `NAMES = ["a", "b"]`) whose value is still the literal's: the program
  stays readable and its snapshot's key stays the same from run to run;
* random generators, and values holding one: each item must draw afresh
  where the caller's generator was seeded from entropy (`_warm`), which a
  pickled state would undo;
* what does not pickle (an open file, a lock), and what pickles only as a
  reference to its own name (`typing`'s `TypeVar`): made again there, as
  before.

Where the pickles go: inside the program when small; else one file beside
the arguments' large arrays (`_arrays`, named by its content's hash), and
large arrays inside a value become files of their own there, as an
argument's do. Each global is bound where its statement stood (a class
body or decorator using it as the module loads sees it), each loaded
alone: one that does not load in the sandbox (its class's package is not
there) becomes a stand-in that raises why when used, as a failed import
does.
"""

import ast
import hashlib
import inspect
import pickle
import random

from . import _arguments

# Pickles up to this size in all go inside the program; larger, as a file.
INLINE_BYTES = 64 << 10
# Small values the program does not read as it loads may go with each item
# instead, up to this size in all (see `ByValue.split`).
WITH_EACH_ITEM_BYTES = 16 << 10


class ByValue:
    """The data globals of one program: `take` decides for each global the
    function needs and keeps its pickle; `split` chooses those that go
    with each item; `loader` is the code that makes the others ready in
    the program, `with_each_item` the bytes each item's input carries.
    `arrays`: where large arrays and a large bundle of pickles go (an
    `_arrays.Arrays`; None: all inside the program); `with_items`: whether
    any may go with each item (a map's; a run's program is its only one)."""

    def __init__(self, fn, arrays=None, with_items=False):
        self.home, self.arrays, self.with_items = fn.__module__, arrays, with_items
        self.values = {}  # name -> (its value's pickle, "set"/"frozenset"/None, whether it moved arrays)
        self.per_item = {}  # name -> (pickle, kind), of those `split` chose

    def take(self, name, value, statement):
        """The statement that binds `name` to `value` in the guest when it
        travels by value (see the module's doc), and the names of `fn`'s
        module its pickle refers to (its classes, its functions); None
        when its source travels instead. `statement`: the top-level
        statement that bound it as the module ran, or None (bound under
        the main guard, or otherwise out of sight)."""
        if not is_data(name, value) or _made_again(name, value, statement):
            return None
        kind = type(value).__name__ if type(value) in (set, frozenset) else None
        if kind:
            # Sorted, so that the same set pickles alike in every process
            # (a string's hash, and so a set's order, is per process).
            try:
                value = sorted(value)
            except TypeError:
                kind = None
        found, before = set(), self.arrays.moved_count if self.arrays is not None else 0
        try:
            data = _arguments.pickled(value, found, self.arrays)
        except Exception:  # noqa: BLE001 - whatever does not pickle is made again from its source
            return None
        # A lambda inside (a dict of them): its statement is made again
        # there instead, lambdas and all.
        if any(draws(t) or getattr(t, "__module__", None) == "typing" or _arguments.made_again(t) for t in found):
            return None
        moved = self.arrays is not None and self.arrays.moved_count > before
        self.values[name] = (data, kind, moved)
        refers = sorted(
            getattr(t, "__name__", "")
            for t in found
            if getattr(t, "__module__", None) == self.home and "." not in getattr(t, "__qualname__", ".")
        )
        return ast.parse(f"{name} = _pw_value({name!r}, {kind!r})").body[0], refers

    def split(self, read_as_loading):
        """The names that go with each item rather than in the program:
        small values (`WITH_EACH_ITEM_BYTES` in all, smallest first) the
        program does not read as it loads (`read_as_loading`: a class body,
        a decorator, a default value), and that hold no array moved as a
        file. The program — and so a map's snapshot, keyed by it — is then
        the same from run to run while they change (a time, a seed, a
        command line's options, a few random numbers), where a new
        snapshot would be made for each new value."""
        room = WITH_EACH_ITEM_BYTES if self.with_items else -1
        for name, (data, kind, moved) in sorted(self.values.items(), key=lambda kv: (len(kv[1][0]), kv[0])):
            if name in read_as_loading or moved or len(data) > room:
                continue
            room -= len(data)
            self.per_item[name] = (data, kind)
        return set(self.per_item)

    def loader(self):
        """The guest code that makes the pickles of the values in the
        program ready for `_pw_value` (`_program._DRIVER`): a dict of
        them, inside the program or read from their file."""
        # In the order of their names: the same globals make the same
        # program (and so start from the same snapshot) in every process.
        pickles = {name: data for name, (data, _, _) in sorted(self.values.items()) if name not in self.per_item}
        if self.arrays is None or sum(map(len, pickles.values())) <= INLINE_BYTES:
            return f"_pw_values = {pickles!r}"
        bundle = pickle.dumps(pickles, protocol=_arguments.PROTOCOL)
        name = self.arrays.add_file(hashlib.sha256(bundle).hexdigest()[:40] + ".pickle", bundle)
        return f"with open({self.arrays.guest_path(name)!r}, 'rb') as _pw_f:\n    _pw_values = _pw_pickle.load(_pw_f)"

    def with_each_item(self):
        """The bytes each item's input carries after its arguments' pickle
        (`_program._DRIVER`'s `_pw_main` binds them): empty when none."""
        if not self.per_item:
            return b""
        return pickle.dumps(dict(sorted(self.per_item.items())), protocol=_arguments.PROTOCOL)


def is_data(name, value):
    """Whether `value`, bound to `name`, is data rather than code: not a
    module, class or function, nor a name of Python's own (`__file__`). A
    method bound to an object is data: the object and the method's name
    (`predict = model.predict`)."""
    if name.startswith("__") and name.endswith("__"):
        return False
    owner = getattr(value, "__self__", None)
    if (inspect.ismethod(value) or inspect.isbuiltin(value)) and owner is not None and not inspect.ismodule(owner):
        return True
    return not (inspect.ismodule(value) or isinstance(value, type) or inspect.isroutine(value))


def _made_again(name, value, statement):
    """Whether `statement` makes `value` again as it is: `name = <a
    literal>` whose value is still the literal's."""
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target, expression = statement.targets[0], statement.value
    elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
        target, expression = statement.target, statement.value
    else:
        return False
    if not (isinstance(target, ast.Name) and target.id == name):
        return False
    try:
        literal = ast.literal_eval(expression)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    try:
        return _canonical(literal) == _canonical(value)
    except Exception:  # noqa: BLE001 - a value that cannot be compared so is not the literal's
        return False


def _canonical(value):
    """`value` as a comparable form that tells types apart (`1` from `1.0`
    and `True`) and keeps a dict's order but not a set's (a set's order is
    per process: that of its strings' hashes)."""
    kind = type(value)
    if kind in (set, frozenset):
        return kind.__name__, sorted(repr(_canonical(v)) for v in value)
    if kind in (list, tuple):
        return kind.__name__, [_canonical(v) for v in value]
    if kind is dict:
        return "dict", [(_canonical(k), _canonical(v)) for k, v in value.items()]
    return kind.__name__, repr(value)


def draws(t):
    """Whether `t` is a random generator's class (`random.Random`, numpy's
    generators, bit generators and seed sequences)."""
    if not isinstance(t, type):
        return False
    if issubclass(t, random.Random):
        return True
    module = getattr(t, "__module__", "") or ""
    return module == "numpy.random" or module.startswith("numpy.random.")
