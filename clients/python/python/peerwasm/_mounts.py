"""What a function is given besides its arguments: data directories
(`files=`) and packages (`packages=`), as read-only directories of the
sandbox.

Each is a directory of the host granted to the jobs read-only: on the
embedded worker the jobs read it in place; on a pool it is sent by content
hash, once per worker, as any job's tree is. Nothing else of the host is
visible to the function.

* `files=`: directories, seen by the function at the same path as here —
  an absolute path at itself, a relative one under `/` (the sandbox's
  working directory), so `open("data/x.csv")` and
  `open("/home/me/data/x.csv")` both work unchanged; `"."` (or a directory
  above this one) at its own absolute path, and the function then starts
  in this directory, so `open("x.csv")` works too. A dict
  `{guest_path: host_dir}` places them explicitly.
* `outputs=`: directories the function may write into (made if
  missing), seen at the same path as here: what it writes there is in them
  when its item is done — written in place on the embedded worker, sent
  back from a pool. A map whose function has outputs starts each item cold
  (a snapshot cannot know what the first item's start left there).
* `packages=`: pure-Python code the function imports: a wheel (`.whl`,
  unpacked here first; one of compiled code is refused, since the sandbox
  runs WebAssembly, not this machine's code), a package's directory (one
  holding `__init__.py`), a directory of packages (a `site-packages`) or a
  single module (`.py`). Each goes on the guest's `sys.path`, ahead of the
  sandbox's own packages.

What a package is staged as (an unpacked wheel, a package's directory
copied to be listable, a module in a directory of its own) is kept in the
cache (`<cache>/packages/<hash of its content>`), not in a new temporary
directory per call: the embedded worker's warm starts are keyed by what
their jobs see, host paths included, so the next map of the same function
with the same packages starts from its snapshot instead of cold. A kept
copy is checked against its hash when it is found again, and one unused
for 14 days is removed when another is made.
"""

import hashlib
import os
import posixpath
import shutil
import tempfile
import zipfile

from . import _arrays, _peerwasm

# Where the sandbox already has something: never a data directory's place.
_RESERVED = ("/script", "/usr", "/packages", _arrays.GUEST)
_PACKAGES = "/packages"
# How long a kept package copy stays unused before it is removed.
_KEPT_UNUSED_S = 14 * 24 * 3600


class Mounts:
    """The directories a map's or a run's jobs are given: `grants`
    (`(host_dir, guest_dir, read_only)`), `sys_path` (guest paths put first
    on `sys.path`; `own_path`: those of the caller's own packages). Holds the staged copies (unpacked wheels, packages)
    and the arguments' large arrays (`arrays`, an `_arrays.Arrays`, granted
    at its `GUEST` by `finish`, once the program's data globals have joined
    them: `_globals`) until `close`, which must come after the jobs are
    done."""

    def __init__(self, files=None, packages=None, outputs=None, arrays=None, local=()):
        self.grants, self.sys_path, self._staged = [], [], []
        # Those of `sys_path` holding the caller's own packages (`local`).
        self.own_path = []
        self.arrays = arrays
        try:
            for guest, host in _data_dirs(files, "files"):
                self._grant(host, guest)
            outputs = _as_list(outputs, "outputs")
            for out in outputs:
                os.makedirs(out, exist_ok=True)
            for guest, host in _data_dirs(outputs, "outputs"):
                self._grant(host, guest, read_only=False)
            given = _as_list(packages, "packages")
            for i, package in enumerate(given):
                self._package(os.fspath(package), f"{_PACKAGES}/{i}")
            # The caller's own packages the function needs, found for it
            # (`_travel.local_packages`): their Python sources, not their data.
            mine = [p for p in local if p not in {os.path.abspath(g) for g in given}]
            for i, package in enumerate(mine, start=len(given)):
                self._package(package, f"{_PACKAGES}/{i}", sources_only=True)
                self.own_path.append(f"{_PACKAGES}/{i}")
        except BaseException:
            self.close()
            raise

    def finish(self):
        """Puts the arrays (and the data globals' files) where the jobs will
        find them, and grants that directory: after the program is made,
        before the jobs start."""
        if self.arrays is not None:
            self.arrays.finish()
            if self.arrays.dir is not None:
                self.grants.insert(0, (os.path.abspath(self.arrays.dir), _arrays.GUEST, True))

    @property
    def workdir(self):
        """This process's working directory when the jobs see it at the
        same path (it, or a directory above it, given as `files=` or
        `outputs=` by an absolute path or as "."): the function starts
        there, so that `open("results.csv")` means what it means here.
        None otherwise (it starts at `/`, where `files=["data"]` is)."""
        here = os.getcwd()
        for host, guest, _ in self.grants:
            if guest == host and (here == guest or here.startswith(guest.rstrip("/") + "/")):
                return here
        return None

    def _grant(self, host, guest, read_only=True):
        for _, taken, _ in self.grants:
            if guest == taken or guest.startswith(taken + "/") or taken.startswith(guest + "/"):
                raise ValueError(f"two directories would be seen at {guest} and {taken} in the sandbox: give each its own place")
        self.grants.append((os.path.abspath(host), guest, read_only))

    def _stage(self):
        """A new directory to stage a package in: in the cache's
        `packages/` (so that `_keep` can rename it into place), else a
        temporary one."""
        root = _kept_root()
        d = None
        if root is not None:
            try:
                d = tempfile.mkdtemp(prefix=".partial-", dir=root)
            except OSError:
                d = None
        if d is None:
            d = tempfile.mkdtemp(prefix="peerwasm-package-")
        self._staged.append(d)
        return d

    def _keep(self, staged):
        """Where the staged copy is granted from: the kept copy of the same
        content in the cache (this one then goes), or this one itself when
        it cannot be kept (no cache, another filesystem, a full disk); the
        latter is removed at `close`."""
        root = _kept_root()
        if root is None or os.path.dirname(staged) != root:
            return staged
        key = _tree_digest(staged)
        kept = os.path.join(root, key)
        if os.path.isdir(kept):
            if _tree_digest(kept) == key:
                shutil.rmtree(staged, ignore_errors=True)
                self._staged.remove(staged)
                os.utime(kept)
                return kept
            # Not what its name says (changed in place): made anew. Only
            # then removed: one that was absent a moment ago may be another
            # process's, just renamed into place and in use.
            shutil.rmtree(kept, ignore_errors=True)
        try:
            os.rename(staged, kept)
        except OSError:
            if not os.path.isdir(kept):
                return staged
            # Made by another process meanwhile, of the same content.
            shutil.rmtree(staged, ignore_errors=True)
        self._staged.remove(staged)
        _remove_unused(root)
        return kept

    def _package(self, path, guest, sources_only=False):
        if path.endswith(".whl"):
            if not os.path.isfile(path):
                raise ValueError(f"packages: no wheel at {path}")
            tag = os.path.basename(path)[: -len(".whl")].split("-")[-3:]
            if len(tag) != 3 or tag[1:] != ["none", "any"]:
                raise ValueError(
                    f"packages: {os.path.basename(path)} is built for one kind of machine "
                    f"(tag {'-'.join(tag)}); the sandbox runs WebAssembly and takes pure-Python "
                    "wheels only (…-none-any.whl)"
                )
            staged = self._stage()
            with zipfile.ZipFile(path) as whl:
                # extractall keeps every name inside `staged` (no `..`, no root).
                whl.extractall(staged)
            self._grant(self._keep(staged), guest)
            self.sys_path.append(guest)
        elif os.path.isfile(path) and path.endswith(".py"):
            staged = self._stage()
            shutil.copy(path, staged)
            self._grant(self._keep(staged), guest)
            self.sys_path.append(guest)
        elif os.path.isdir(path):
            path = os.path.abspath(path)
            if os.path.isfile(os.path.join(path, "__init__.py")):
                # A package: importable by its name from a directory above
                # it, which the sandbox must be able to list: a copy in one
                # of its own (the host's own bytecode caches left out).
                staged = self._stage()
                shutil.copytree(
                    path,
                    os.path.join(staged, os.path.basename(path)),
                    ignore=_python_sources if sources_only else shutil.ignore_patterns("__pycache__"),
                )
                self._grant(self._keep(staged), guest)
            else:
                self._grant(path, guest)
            self.sys_path.append(guest)
        else:
            raise ValueError(
                f"packages: {path} is neither a wheel, a package's directory, a directory of packages nor a .py module"
            )

    def may_plot(self):
        """Whether code given as packages names matplotlib (or a library
        drawn on it): the jobs then get matplotlib's data too, as a program
        that names it does (`peerwasm::client::python::may_plot`). Reads
        the packages' `.py` files once per map (or run)."""
        for guest_root in self.sys_path:
            for host, guest, _ in self.grants:
                if guest != guest_root and not guest.startswith(guest_root + "/"):
                    continue
                for base, _, names in os.walk(host):
                    for name in names:
                        if name.endswith(".py"):
                            try:
                                with open(os.path.join(base, name), "rb") as f:
                                    text = f.read()
                            except OSError:
                                continue
                            if any(w in text for w in (b"matplotlib", b"seaborn", b"pylab", b"plotnine")):
                                return True
        return False

    def close(self):
        for d in self._staged:
            shutil.rmtree(d, ignore_errors=True)
        self._staged = []
        if self.arrays is not None:
            self.arrays.close()


def _kept_root():
    """`<cache>/packages`, made private to this user, or None without a
    cache."""
    cache = _peerwasm._cache_dir()
    if cache is None:
        return None
    root = os.path.join(cache, "packages")
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return root


def _tree_digest(root):
    """A hash of the tree under `root`: each file's path, size and bytes,
    each directory's path, in a fixed order."""
    h = hashlib.sha256()
    for base, dirs, names in os.walk(root):
        dirs.sort()
        rel = os.path.relpath(base, root)
        h.update(b"d" + rel.encode("utf-8", "surrogateescape") + b"\0")
        for name in sorted(names):
            path = os.path.join(base, name)
            h.update(b"f" + name.encode("utf-8", "surrogateescape") + b"\0")
            if os.path.islink(path):
                h.update(b"l" + os.fsencode(os.readlink(path)) + b"\0")
                continue
            h.update(os.path.getsize(path).to_bytes(8, "little"))
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()[:32]


def _remove_unused(root):
    """Removes kept copies unused for `_KEPT_UNUSED_S` (and partial ones as
    old, left by a process that died)."""
    for path in _arrays.old_directories(root, _KEPT_UNUSED_S):
        shutil.rmtree(path, ignore_errors=True)


def _python_sources(directory, names):
    """What a copy of a package's Python sources leaves out: its bytecode
    caches and every file but `.py` ones."""
    return [n for n in names if n == "__pycache__" or (not n.endswith(".py") and not os.path.isdir(os.path.join(directory, n)))]


def _as_list(value, name):
    if value is None:
        return []
    if isinstance(value, (str, bytes, os.PathLike)):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise TypeError(f"{name}= takes a path or a list of paths, not {type(value).__name__}")


def _data_dirs(files, name):
    """`(guest, host)` for each directory of `files=` (or `outputs=`)."""
    if isinstance(files, dict):
        pairs = [(str(guest), os.fspath(host)) for guest, host in files.items()]
        for guest, _ in pairs:
            if not guest.startswith("/"):
                raise ValueError(f"{name}: the sandbox's paths are absolute: {guest!r}")
    else:
        pairs = []
        for host in _as_list(files, name):
            host = os.fspath(host)
            if os.path.isabs(host):
                guest = host
            else:
                rel = os.path.normpath(host)
                # This directory or one above it: at its own path, where
                # the function also starts (`Mounts.workdir`), so that
                # relative paths mean there what they mean here.
                guest = os.path.abspath(host) if rel == "." or rel.startswith("..") else "/" + rel
            pairs.append((guest.replace(os.sep, "/"), host))
    out = []
    for guest, host in pairs:
        guest = posixpath.normpath(guest)
        if not os.path.isdir(host):
            raise ValueError(
                f"{name}: {host} is not a directory (give the directory that holds the files: "
                "the function sees all of it)"
            )
        if guest == "/" or any(guest == r or guest.startswith(r + "/") for r in _RESERVED):
            raise ValueError(f"{name}: {guest} is the sandbox's own: place the directory elsewhere")
        out.append((guest, host))
    return out
