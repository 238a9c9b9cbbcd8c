"""Keeps the script Python reads from a pipe, so that peerwasm can send the
functions it defines into the sandbox (`peerwasm._sources`).

Imported at start-up by `peerwasm-stdin.pth`, only in a Python whose
script is stdin (`python -` or `python` with nothing after it) and never
at the prompt; it does something only when stdin is a pipe. Python reads
a script from stdin whole before running any of it, so reading it here
first changes nothing that the script can see: the same bytes are given
back to Python on stdin, from a file of this process's own (memfd), and
stdin is at its end after the script has run, as it would have been.
"""

import os
import stat
import sys

# The script's bytes, when it came through a pipe; else None.
script = None


def _keep():
    global script
    try:
        if sys.flags.interactive or not stat.S_ISFIFO(os.fstat(0).st_mode):
            return
    except OSError:
        return
    chunks = []
    while True:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    data = b"".join(chunks)
    fd = _file_of_own()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    os.dup2(fd, 0)
    os.close(fd)
    script = data


def _file_of_own():
    if hasattr(os, "memfd_create"):
        try:
            return os.memfd_create("python-stdin-script", os.MFD_CLOEXEC)
        except OSError:
            pass
    import tempfile

    f = tempfile.TemporaryFile()
    fd = os.dup(f.fileno())
    f.close()
    return fd


try:
    _keep()
except Exception as e:  # never stop the user's Python from starting
    sys.stderr.write(f"peerwasm: could not keep the script read from stdin ({e})\n")
