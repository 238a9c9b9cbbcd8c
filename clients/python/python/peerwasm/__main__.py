"""The `peerwasm` command (and `python -m peerwasm`): peerwasm's whole
command line — `run`, `map`, `worker`, `adapt`, ... — from the package,
as the binary built from the repository has it (`src/command.rs`)."""

import signal
import sys


def main():
    from . import _peerwasm

    # Ctrl-C as for the binary: the command handles it where it means
    # something (a map, a worker draining); elsewhere it ends the process.
    # (A slot process starts with it ignored: its worker decides.)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    # Started again the same way — a slot process, a compile apart, a
    # worker `adapt` submits — by this environment's Python, not the one
    # its executable links to.
    program = [sys.executable, "-m", "peerwasm"]
    sys.exit(_peerwasm.command(program, ["peerwasm", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
