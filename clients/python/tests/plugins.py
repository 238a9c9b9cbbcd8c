"""A module whose imports bring importlib.metadata in, as scikit-learn's
do: a map of its functions has the entry points read into its snapshot."""

import importlib.metadata
import os
import sys
import tempfile


def seen(x):
    """Entry points of group `pw.test` before and after a distribution
    declaring one is put on sys.path; and whether the lookups were served
    by the reading the snapshot holds."""
    before = [e.name for e in importlib.metadata.entry_points(group="pw.test")]
    d = tempfile.mkdtemp()
    info = os.path.join(d, f"pwtest{x}-1.0.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: pwtest{x}\nVersion: 1.0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write(f"[pw.test]\nitem{x} = json:dumps\n")
    sys.path.append(d)
    after = [e.name for e in importlib.metadata.entry_points(group="pw.test")]
    return before, after, "_pw_entry_points" in importlib.metadata.entry_points.__qualname__
