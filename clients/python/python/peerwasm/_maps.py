"""Reading a map as it goes: the iterator behind `map`, `imap` and
`imap_unordered` (for .wasm modules and Python functions alike), the
progress bar, and what Ctrl-C leaves the caller (`Interrupted`).

A map runs as a task in the extension (`_peerwasm.MapStream`) and goes on
submitting while Python reads; each result comes here as soon as it is
in (in input order, or as it arrives), with what its job printed written
to stderr then, not at the end.
"""

import sys
import time

from ._peerwasm import JobError


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during `peerwasm.map`: the map stopped (nothing more was
    submitted, what was under way was cancelled) and this carries what was
    done. `done` maps each finished input's index to its value (its
    `Result` for a .wasm module); `total` is the number of inputs.
    A `KeyboardInterrupt`, so an unhandled one still ends the program."""

    def __init__(self, done, total):
        super().__init__(f"interrupted: {len(done)} of {total} items were done (their values are `.done`)")
        self.done = done
        self.total = total


class _Bar:
    """A progress bar: tqdm's (a terminal bar, or a widget in a notebook)
    when tqdm is installed, else one line on stderr, redrawn in a terminal
    and written every 10 s elsewhere. Off: does nothing."""

    def __init__(self, total, enabled):
        self._tqdm = self._line = None
        self._shown = (0, 0, 0)
        if not enabled:
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            tqdm = None
        if tqdm is not None:
            self._tqdm = tqdm(total=total, unit="item", desc="peerwasm", dynamic_ncols=True)
        else:
            self._line = (total, time.monotonic(), sys.stderr.isatty())
            self._last = 0.0

    def update(self, progress, handed_over):
        done, failed, retried, _in_flight = progress
        # The map counts an item done just after handing it over.
        done = max(done, handed_over)
        if self._tqdm is not None:
            if done > self._tqdm.n:
                self._tqdm.update(done - self._tqdm.n)
            if (failed, retried) != self._shown[1:]:
                self._tqdm.set_postfix(failed=failed, retried=retried)
            self._shown = (done, failed, retried)
        elif self._line is not None:
            total, started, tty = self._line
            now = time.monotonic()
            if done < total and now - self._last < (0.2 if tty else 10.0):
                return
            self._last = now
            width = 30
            filled = width * done // max(total, 1)
            text = (
                f"peerwasm [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
                f" · {failed} failed · {retried} retried · {now - started:.0f} s"
            )
            sys.stderr.write(("\r" + text) if tty else text + "\n")
            sys.stderr.flush()

    def close(self):
        if self._tqdm is not None:
            self._tqdm.close()
        elif self._line is not None and self._line[2]:
            sys.stderr.write("\n")


def forward(result):
    """What a job wrote on stderr (a Python function's prints are sent
    there), written to this process's stderr, as a local call's would be."""
    text = getattr(result, "stderr", None)
    if text:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")


def iterate(stream, total, progress, decode, failure):
    """`(index, decode(result))` for each result of `stream` as it comes,
    forwarding what each job printed. A failed job (the stream raises
    JobError for it when the map does not keep going) raises
    `failure(error)`. Closing the generator (a loop broken out of, or it
    being dropped) stops the map and cancels what is under way."""
    bar = _Bar(total, progress)
    handed_over = 0
    try:
        while True:
            try:
                result = next(stream)
            except StopIteration:
                return
            except JobError as e:
                bar.update(stream.progress, handed_over + 1)
                forward(e.result)
                raise failure(e) from None
            handed_over += 1
            forward(result)
            bar.update(stream.progress, handed_over)
            yield result.index, decode(result)
    finally:
        bar.close()
        stream.close()


def collect(stream, total, progress, decode, failure):
    """Every value in input order, as `map` returns them; on Ctrl-C,
    `Interrupted` carrying those done (what was in when it came too)."""
    done = {}
    try:
        for index, value in iterate(stream, total, progress, decode, failure):
            done[index] = value
    except KeyboardInterrupt:
        for result in stream.rest():
            forward(result)
            done[result.index] = decode(result)
        raise Interrupted(done, total) from None
    return [done[i] for i in range(total)]
