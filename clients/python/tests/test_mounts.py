"""What a function is given besides its arguments: data directories
(`files=`) and pure-Python packages (`packages=`: a directory, a wheel, a
module), embedded and on a pool; what cannot be given is refused, saying
why."""

import pathlib
import sys
import zipfile

import pytest

import peerwasm

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import fns  # noqa: E402
from test_peerwasm import pool  # noqa: E402,F401  (the two-worker pool fixture)

TINYPKG = "def triple(x):\n    return 3 * x\n"


def _data(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("alpha")
    (data / "sub").mkdir()
    (data / "sub" / "b.txt").write_text("beta")
    return data


def test_files_are_seen_where_the_host_has_them(tmp_path, monkeypatch):
    data = _data(tmp_path)
    # An absolute path: at itself.
    assert peerwasm.map(fns.reads, [str(data / "a.txt"), str(data / "sub" / "b.txt")], files=[data]) == [
        "alpha",
        "beta",
    ]
    # A relative one: under the sandbox's working directory, as here.
    monkeypatch.chdir(tmp_path)
    assert peerwasm.run(fns.reads, "data/sub/b.txt", files="data") == "beta"
    # Placed explicitly.
    assert peerwasm.run(fns.reads, "/inputs/a.txt", files={"/inputs": data}) == "alpha"
    # This directory, or one above it: at its own path, and the function
    # starts here, so a path relative to here means the same there.
    monkeypatch.chdir(data)
    assert peerwasm.run(fns.reads, "a.txt", files=".") == "alpha"
    monkeypatch.chdir(data / "sub")
    assert peerwasm.map(fns.reads, ["b.txt", "../a.txt"], files="..") == ["beta", "alpha"]


def test_a_file_the_functions_module_reads_as_it_loads_is_named_with_what_to_do():
    import fns_loads

    # The constant is the caller's, by value; the class body runs again.
    assert peerwasm.map(fns_loads.first_line, [0]) == [fns_loads.LINES[0]]
    with pytest.raises(peerwasm.JobError, match="opened '.*localmod.py' as it loaded.*files="):
        peerwasm.map(fns_loads.first_table_line, [0])
    here = str(pathlib.Path(__file__).parent)
    assert peerwasm.map(fns_loads.first_table_line, [0], files=[here]) == [fns_loads.LINES[0]]


def test_without_files_the_host_is_not_there(tmp_path):
    data = _data(tmp_path)
    with pytest.raises(peerwasm.RemoteError) as e:
        peerwasm.run(fns.reads, str(data / "a.txt"))
    assert e.value.type_name in ("FileNotFoundError", "PermissionError", "OSError"), e.value
    # Said with what to do: a bare "No such file" of a file the caller sees
    # leaves a scientist nowhere.
    assert "files=[the directory]" in e.value.message and "outputs=" in e.value.message, e.value.message
    with pytest.raises(peerwasm.RemoteError, match=r"out.txt.*outputs=\[the directory\]"):
        peerwasm.run(fns.writes, str(tmp_path / "out.txt"))


def test_files_are_read_only(tmp_path):
    data = _data(tmp_path)
    with pytest.raises(peerwasm.RemoteError) as e:
        peerwasm.run(fns.writes, str(data / "new.txt"), files=[data])
    assert "OSError" in e.value.type_name or "Error" in e.value.type_name, e.value
    assert not (data / "new.txt").exists()


def test_a_package_directory_a_wheel_and_a_module_are_importable(tmp_path):
    pkg = tmp_path / "src" / "tinypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(TINYPKG)
    assert peerwasm.map(fns.uses_tinypkg, [1, 2], packages=[pkg]) == [(3, "tinypkg"), (6, "tinypkg")]
    # A directory of packages (a site-packages).
    assert peerwasm.run(fns.uses_tinypkg, 5, packages=str(tmp_path / "src")) == (15, "tinypkg")
    # A pure-Python wheel.
    wheel = tmp_path / "tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("tinypkg/__init__.py", TINYPKG)
        z.writestr("tinypkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n")
    assert peerwasm.run(fns.uses_tinypkg, 7, packages=[wheel]) == (21, "tinypkg")
    # A single module.
    module = tmp_path / "tinypkg.py"
    module.write_text(TINYPKG)
    assert peerwasm.run(fns.uses_tinypkg, 1, packages=module) == (3, "tinypkg")


def test_a_package_goes_to_a_pool_by_content(pool, tmp_path):  # noqa: F811
    pkg = tmp_path / "tinypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(TINYPKG)
    data = _data(tmp_path)
    assert peerwasm.map(fns.uses_tinypkg, range(4), packages=[pkg], peers=pool) == [(3 * i, "tinypkg") for i in range(4)]
    assert peerwasm.map(fns.reads, [str(data / "a.txt")] * 3, files=[data], peers=pool) == ["alpha"] * 3


def test_what_cannot_be_given_is_refused_saying_why(tmp_path):
    native = tmp_path / "fast-1.0-cp312-cp312-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(native, "w") as z:
        z.writestr("fast/__init__.py", "")
    with pytest.raises(ValueError, match="pure-Python wheels only"):
        peerwasm.run(fns.square, 2, packages=[native])
    with pytest.raises(ValueError, match="not a directory"):
        peerwasm.run(fns.square, 2, files=[tmp_path / "missing"])
    with pytest.raises(ValueError, match="sandbox's own"):
        peerwasm.run(fns.square, 2, files={"/usr/lib": tmp_path})
    with pytest.raises(ValueError, match="paths are absolute"):
        peerwasm.run(fns.square, 2, files={"inputs": tmp_path})
    (tmp_path / "sub").mkdir()
    with pytest.raises(ValueError, match="would be seen at"):
        peerwasm.run(fns.square, 2, files=[tmp_path, tmp_path / "sub"])


PNG = b"\x89PNG\r\n\x1a\n"


def test_matplotlib_draws_and_a_figure_written_to_outputs_comes_back(tmp_path, capfd):
    [png] = peerwasm.map(fns.plots, [5])
    assert png.startswith(PNG)
    figs = tmp_path / "figs"
    paths = [str(figs / f"fig{i}.png") for i in range(2)]
    assert peerwasm.map(fns.saves_figure, paths, outputs=[figs]) == paths
    assert all(pathlib.Path(p).read_bytes().startswith(PNG) for p in paths)
    # Its cache has a place: no warning about one on the caller's stderr.
    assert "MPLCONFIGDIR" not in capfd.readouterr().err


def test_a_link_pointing_out_of_outputs_is_never_planted_on_the_host(tmp_path):
    # The directory is written in place (embedded): a link the guest made
    # there would be followed by this process's own programs later.
    out = tmp_path / "out"
    out.mkdir()
    assert peerwasm.run(fns.plants_links, str(out), outputs=[out]) == ["down"]
    assert sorted(p.name for p in out.iterdir()) == ["down"]
    assert (out / "down").is_symlink() and str((out / "down").readlink()) == "sub/x.txt"


def test_a_figure_written_on_a_pool_comes_back(pool, tmp_path):  # noqa: F811
    figs = tmp_path / "figs"
    path = str(figs / "pool.png")
    assert peerwasm.run(fns.saves_figure, path, outputs=[figs], peers=pool) == path
    assert pathlib.Path(path).read_bytes().startswith(PNG)
    paths = [str(figs / f"m{i}.png") for i in range(3)]
    assert peerwasm.map(fns.saves_figure, paths, outputs=[figs], peers=pool) == paths
    assert all(pathlib.Path(p).read_bytes().startswith(PNG) for p in paths)


def test_a_package_that_plots_gets_matplotlibs_data_too(tmp_path):
    pkg = tmp_path / "plotpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import io\n"
        "def png(n):\n"
        "    import matplotlib\n"
        "    matplotlib.use('Agg')\n"
        "    import matplotlib.pyplot as plt\n"
        "    fig, ax = plt.subplots(figsize=(1, 1), dpi=40)\n"
        "    ax.plot(range(n))\n"
        "    buf = io.BytesIO()\n"
        "    fig.savefig(buf, format='png')\n"
        "    return buf.getvalue()\n"
    )
    [png] = peerwasm.map(fns.draws_with_a_package, [3], packages=[pkg])
    assert png.startswith(PNG)


def test_a_staged_package_is_kept_by_its_content_and_checked_when_found(tmp_path):
    from peerwasm import _mounts, _peerwasm

    kept = pathlib.Path(_peerwasm._cache_dir()) / "packages"
    pkg = tmp_path / "tinypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(TINYPKG)

    def staged():
        m = _mounts.Mounts(packages=[str(pkg)])
        try:
            return m.grants[0][0]
        finally:
            m.close()

    first = staged()
    assert pathlib.Path(first).parent == kept, first
    assert (pathlib.Path(first) / "tinypkg" / "__init__.py").read_text() == TINYPKG, "kept after close"
    assert staged() == first, "the same content, the same directory: the next map finds its snapshot"
    # A kept copy changed behind its name is made again.
    (pathlib.Path(first) / "tinypkg" / "__init__.py").write_text("oops = 1\n")
    assert staged() == first
    assert (pathlib.Path(first) / "tinypkg" / "__init__.py").read_text() == TINYPKG
    # Other content, another directory; no partial copy left behind.
    (pkg / "__init__.py").write_text(TINYPKG + "X = 2\n")
    assert staged() != first
    left = [p.name for p in kept.iterdir() if p.name.startswith(".partial")]
    assert left == []
    # The function imports it from the kept copy, as from a fresh one.
    assert peerwasm.map(fns.uses_tinypkg, [1, 2], packages=[pkg]) == [(3, "tinypkg"), (6, "tinypkg")]
