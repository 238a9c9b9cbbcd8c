"""Large numpy arrays in a function's arguments, moved as files by content
hash rather than inside each item's pickle.

Which ones: an array several items share (one bound to every item, a
partial's, a bound method's instance's) is a file, sent once; one that
only its own item has stays inside that item's pickle on a pool — where
it then goes only to the worker that runs the item, while a directory of
them would go whole to every worker before its first item — unless that
would be over what an input may be; embedded, every large array is a file
(read in place, not held in this process: `_arguments.inputs`).

Why: an item's arguments are its job's input — at most 64 MiB, embedded
as on a pool — and each item carries its own. An array over that could not
be passed at all, and one bound to every item (`partial(fit, X)`, a bound
method's `self.X`) was pickled once per item: 1,000 items of a 10 MiB
matrix were 10 GB in the caller and on the wire. Now an array of
`ARRAY_AS_FILE` or more is written once, as `<sha256 of it>.npy`, into a
directory the jobs are given read-only at `GUEST` — read in place by the
embedded worker, sent to a pool by content hash once per worker, as
`files=` are — and the pickle carries its name; the guest loads it as it
unpickles (`_program._DRIVER`), once per object the input names, so two
references to one array are still one array there.

The directory is named by what it holds (`<cache>/arrays/<hash of its
files' names>`), and is left out of what keys a warm snapshot (only items
read it): a map over new arrays starts warm, as one without them does. It
lives while a map uses it — each user holds a shared lock on it — and the
last to let it go removes it: arrays can be large, and the cache is not
the place to keep a copy of every one ever passed.
"""

import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
import time

from . import _peerwasm

# Arrays this large or larger travel as files.
ARRAY_AS_FILE = 1 << 20
# Where the jobs see them: a directory only items read, so not part of
# what keys a warm snapshot (`proto::TURN_ONLY_DIR`) — a map over new
# arrays starts from the snapshot the last one made.
GUEST = _peerwasm.TURN_ONLY_DIR
# The persistent id's tag in a pickle.
TAG = "pw-array"


class Arrays:
    """The large arrays of one map's (or run's) arguments: `persistent_id`
    for the pickler (`_arguments.ClassFinder`); `finish` once every input
    is pickled, then `dir` is the host directory to grant at `GUEST` (None
    if no array was moved); `close` after the jobs are done."""

    def __init__(self):
        self._ids = {}  # id(array) -> (its index, the array: kept, so its id stays its own)
        self._names = []  # file name per index
        self._files = []  # the names of other files (`add_file`)
        self._staging = None
        self._staging_fd = None
        self._held = None  # the directory's descriptor, locked shared
        self.dir = None

    def persistent_id(self, obj):
        if not large(obj):
            return None
        numpy = sys.modules["numpy"]
        found = self._ids.get(id(obj))
        if found is None:
            found = self._ids[id(obj)] = (len(self._names), obj)
            self._names.append(self._write(numpy, obj))
        index = found[0]
        return (TAG, self._names[index], index)

    @property
    def moved(self):
        """Whether any array was moved as a file."""
        return self.moved_count > 0

    @property
    def moved_count(self):
        """How many arrays were moved as files so far."""
        return len(self._names)

    def add_file(self, name, data):
        """`data` as the file `name` (named by its content's hash) in the
        directory, beside the arrays; its name."""
        path = self._staged(name)
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(data)
        self._files.append(name)
        return name

    @staticmethod
    def guest_path(name):
        """Where the jobs see the file `name` of the directory."""
        return f"{GUEST}/{name}"

    def _write(self, numpy, array):
        """`array` written into the staging directory (once per content);
        its file's name."""
        data = numpy.ascontiguousarray(array)
        h = hashlib.sha256(repr((data.dtype.str, data.shape)).encode())
        h.update(data.reshape(-1).view(numpy.uint8).data)  # any dtype's bytes (a buffer cannot hold datetime64's)
        name = h.hexdigest()[:40] + ".npy"
        path = self._staged(name)
        if not os.path.exists(path):
            with open(path, "wb") as f:
                numpy.lib.format.write_array(f, data, allow_pickle=False)
        return name

    def _staged(self, name):
        """The path of `name` in the staging directory, made (and held)
        with the first file."""
        if self._staging is None:
            self._staging = tempfile.mkdtemp(prefix=".partial-", dir=_root())
            # Held while it is written: not another map's to sweep away.
            self._staging_fd = os.open(self._staging, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(self._staging_fd, fcntl.LOCK_SH)
        return os.path.join(self._staging, name)

    def finish(self):
        """Puts the staged files where their content names them and holds
        that directory; `dir` then names it."""
        if self._staging is None:
            return
        names = [*self._names, *self._files]
        key = hashlib.sha256("\0".join(sorted(set(names))).encode()).hexdigest()[:32]
        final = os.path.join(os.path.dirname(self._staging), key)
        _sweep(os.path.dirname(final))
        for _ in range(3):
            if self._staging is not None:
                try:
                    os.rename(self._staging, final)
                    self._staging = None
                except OSError:
                    pass  # there already: another map's, of the same arrays
            held = _hold(final, names)
            if held is not None:
                self._held, self.dir = held, final
                self._drop_staging()
                return
        raise RuntimeError(f"the arrays of the arguments could not be put in {final}")

    def _drop_staging(self):
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
        if self._staging_fd is not None:
            os.close(self._staging_fd)
            self._staging_fd = None

    def close(self):
        """Lets the directory go: removed if no other map holds it."""
        self._drop_staging()
        held, self._held = self._held, None
        if held is None:
            return
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(self.dir, ignore_errors=True)
        except OSError:
            pass  # another map holds it: the last one removes it
        finally:
            os.close(held)
        self._ids.clear()


class Only:
    """`arrays`' `persistent_id` for the arrays of `ids` alone: the others
    stay inside the pickle."""

    def __init__(self, arrays, ids):
        self.arrays, self.ids = arrays, ids

    def persistent_id(self, obj):
        return self.arrays.persistent_id(obj) if id(obj) in self.ids else None


class Census:
    """Which large arrays each call's arguments hold, found by a first
    pickling that moves nothing (each array a stand-in there): `shared`,
    those of more than one call. `begin` before each call's pickling."""

    def __init__(self):
        self.per_call = []  # the ids of the large arrays of each call
        self._held = {}  # id -> array: kept, so that its id stays its own

    def begin(self):
        self.per_call.append(set())

    def persistent_id(self, obj):
        if not large(obj):
            return None
        self._held[id(obj)] = obj
        self.per_call[-1].add(id(obj))
        return ("census", id(obj))

    def shared(self):
        seen, shared = set(), set()
        for ids in self.per_call:
            shared |= seen & ids
            seen |= ids
        return shared


def large(obj):
    """Whether `obj` is a numpy array that may travel as a file: an exact
    ndarray of a plain dtype, `ARRAY_AS_FILE` or more."""
    numpy = sys.modules.get("numpy")
    return (
        numpy is not None
        and type(obj) is numpy.ndarray
        and not obj.dtype.hasobject
        and obj.nbytes >= ARRAY_AS_FILE
    )


def _root():
    """`<cache>/arrays`, private to this user (a temporary directory's
    parent without a cache)."""
    cache = _peerwasm._cache_dir()
    root = os.path.join(cache, "arrays") if cache else os.path.join(tempfile.gettempdir(), f"peerwasm-arrays-{os.getuid()}")
    os.makedirs(root, mode=0o700, exist_ok=True)
    return root


def _hold(path, names):
    """A shared lock on the directory at `path`, as a descriptor, if it is
    (still) there with every file of `names`; None if it is not — another
    map's, removed as its last user let it go."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.path.samestat(os.fstat(fd), os.stat(path)) and all(
            os.path.isfile(os.path.join(path, n)) for n in names
        ):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


# How old a directory nobody holds must be before another map removes it:
# one just made is held a moment after it is renamed into place.
_ORPHAN_AGE_S = 60


def _sweep(root):
    """Removes what maps that died left: staging directories, and
    directories nobody holds, older than `_ORPHAN_AGE_S`."""
    for path in old_directories(root, _ORPHAN_AGE_S):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass  # held: in use
        finally:
            os.close(fd)


def old_directories(root, age_s):
    """The directories in `root` not changed for `age_s` seconds."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    now, old = time.time(), []
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False) and now - entry.stat(follow_symlinks=False).st_mtime > age_s:
                old.append(entry.path)
        except OSError:
            continue
    return old
