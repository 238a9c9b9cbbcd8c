"""Functions defined where Python keeps no file: a script piped on stdin (a
batch script's here-document), one redirected from a file, `python -c`,
and the interactive prompt. Each runs as a user would run it: a fresh
Python of the venv the package is installed in (its start-up hook
included), whole."""

import os
import pty
import select
import subprocess
import sys
import time

import pytest

# A script whose function uses a helper and a constant of its own, and an
# import, as a script on a cluster would.
SCRIPT = """\
import math
import peerwasm

SCALE = 10

def helper(x):
    return math.floor(x * SCALE)

def f(x):
    return helper(x) + 1

print("RESULT", peerwasm.map(f, [0.25, 1.5]), peerwasm.run(f, 2))
"""
EXPECTED = "RESULT [3, 16] 21"


def _python(args, **kwargs):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, **kwargs)


def _result(p):
    assert p.returncode == 0, p.stderr[-3000:]
    return [line for line in p.stdout.splitlines() if line.startswith("RESULT")]


@pytest.mark.parametrize("args", [[], ["-"]], ids=["python", "python -"])
def test_a_function_of_a_script_piped_on_stdin_runs(args):
    assert _result(_python(args, input=SCRIPT)) == [EXPECTED]


def test_a_function_of_a_script_redirected_from_a_file_runs(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    with open(script) as stdin:
        assert _result(_python(["-"], stdin=stdin)) == [EXPECTED]


def test_a_function_of_python_dash_c_runs():
    assert _result(_python(["-c", SCRIPT])) == [EXPECTED]


NESTED = """\
import peerwasm

def main():
    k = 4
    def f(x):
        return x * k
    print("RESULT", peerwasm.map(f, [1, 2]), peerwasm.map(lambda x: x - k, [10]))

main()
"""


@pytest.mark.parametrize("how", ["piped", "-c"])
def test_a_closure_and_a_lambda_of_a_script_without_a_file_run(how):
    p = _python([], input=NESTED) if how == "piped" else _python(["-c", NESTED])
    assert _result(p) == ["RESULT [4, 8] [6]"]


def test_what_the_piped_script_reads_from_stdin_is_unchanged():
    # Python reads the whole script before running it: stdin is at its end
    # for the script, with the hook as without it.
    script = "import sys\nprint('RESULT', repr(sys.stdin.read()), sys.stdin.isatty())\n"
    assert _result(_python([], input=script)) == ["RESULT '' False"]


def test_code_made_at_run_time_is_refused_not_sent_in_another_functions_place():
    # `exec` names its code "<string>", as `-c` does; the -c text holds a
    # `g` too, but not this one: refused, never the wrong source.
    script = (
        "import peerwasm\n"
        "def g(x):\n    return 'the -c one'\n"
        "exec('def g(x):\\n    return x * 2')\n"
        "try:\n    peerwasm.run(g, 1)\nexcept TypeError as e:\n    print('RESULT', e)\n"
    )
    [line] = _result(_python(["-c", script]))
    assert "the source of g cannot be read" in line and "define it in a file" in line, line


def _prompt(lines, env):
    """Types `lines` at Python's interactive prompt (a terminal of its own)
    and returns what the terminal showed."""
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-q"], stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = b""
    try:
        for line in lines:
            os.write(master, (line + "\n").encode())
            time.sleep(0.05)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and b"DONE" not in out.replace(b"'DONE'", b""):
            if select.select([master], [], [], 1)[0]:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    break
    finally:
        p.kill()
        p.wait()
        os.close(master)
    return out.decode(errors="replace")


def test_a_function_typed_at_the_prompt_runs_and_its_last_definition_is_the_one_sent(tmp_path):
    env = dict(os.environ, HOME=str(tmp_path), TERM="dumb")
    shown = _prompt(
        [
            "import peerwasm",
            "OFFSET = 5",
            "def g(x):",
            "    return x - OFFSET",
            "",
            "def g(x):",
            "    return x + OFFSET",
            "",
            "def h(x):",
            "    y = g(x)",
            "    return y * 2",
            "",
            "print('RESULT', peerwasm.map(h, [1, 2]))",
            "print('LAMBDA', peerwasm.map(lambda x: x * OFFSET, [3]))",
            "print('DONE')",
        ],
        env,
    )
    assert "RESULT [12, 14]" in shown, shown[-3000:]
    assert "LAMBDA [15]" in shown, shown[-3000:]


def test_a_helper_only_an_earlier_sessions_history_defines_is_not_sent(tmp_path):
    # The prompt loads ~/.python_history, so what was typed in an earlier
    # session is in the history this one reads: its helper must not travel
    # (here the function would fail with NameError, and so must it there).
    (tmp_path / ".python_history").write_text("def helper(x):\n    return x * 100\n")
    env = dict(os.environ, HOME=str(tmp_path), TERM="dumb")
    shown = _prompt(
        [
            "import peerwasm",
            "def h(x):",
            "    return helper(x) + 1",
            "",
            "try:",
            "    print('RESULT', peerwasm.map(h, [1, 2]))",
            "except Exception as e:",
            "    print('FAIL' + 'ED', type(e).__name__, str(e)[-300:])",
            "",
            "print('DONE')",
        ],
        env,
    )
    assert "RESULT [" not in shown, shown[-3000:]
    failed = shown[shown.index("FAILED") :] if "FAILED" in shown else ""
    assert "NameError" in failed and "helper" in failed, shown[-3000:]


def test_a_helper_whose_file_changed_since_it_was_imported_is_refused_not_sent(tmp_path):
    (tmp_path / "analysis.py").write_text("def helper(x):\n    return x + 1\n\ndef f(x):\n    return helper(x)\n")
    script = (
        "import pathlib, sys, peerwasm\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import analysis\n"
        "pathlib.Path(sys.argv[1], 'analysis.py').write_text("
        "'def helper(x):\\n    return x * 1000\\n\\ndef f(x):\\n    return helper(x)\\n')\n"
        "try:\n"
        "    print('RESULT', peerwasm.map(analysis.f, [1]))\n"
        "except TypeError as e:\n"
        "    print('REFUSED', e)\n"
    )
    p = _python(["-c", script, str(tmp_path)])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "RESULT" not in p.stdout, p.stdout
    assert "REFUSED" in p.stdout and "helper" in p.stdout, p.stdout


def test_a_piped_function_calling_an_imported_modules_function_is_found():
    # Python 3.11 compiles `math.floor(x)` otherwise when `math` is imported
    # in the same text: the definition is checked in its script's context.
    script = "import math\nimport peerwasm\n\ndef f(x):\n    return math.floor(x * 2)\n\nprint('RESULT', peerwasm.map(f, [1.3, 2.6]))\n"
    assert _result(_python([], input=script)) == ["RESULT [2, 5]"]


def test_a_function_whose_file_changed_since_it_was_imported_is_refused_not_sent(tmp_path):
    (tmp_path / "analysis.py").write_text("import math\n\ndef f(x):\n    return math.floor(x) + 1\n")
    script = (
        "import pathlib, sys, peerwasm\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import analysis\n"
        "print('BEFORE', peerwasm.map(analysis.f, [1.5]))\n"
        "pathlib.Path(sys.argv[1], 'analysis.py').write_text("
        "'import math\\n\\ndef f(x):\\n    return math.floor(x) * 1000\\n')\n"
        "try:\n"
        "    print('RESULT', peerwasm.map(analysis.f, [1.5]))\n"
        "except TypeError as e:\n"
        "    print('REFUSED', e)\n"
    )
    p = _python(["-c", script, str(tmp_path)])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "BEFORE [2]" in p.stdout and "RESULT" not in p.stdout, p.stdout
    assert "REFUSED" in p.stdout and "importlib.reload" in p.stdout, p.stdout
