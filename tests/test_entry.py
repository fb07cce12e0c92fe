"""The process's entry (`python -m fedload`, the console script): its exit without the interpreter's teardown, which
must still deliver every byte written and the status, and must not cut short what a normal exit waits for."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

_BIG = 1 << 20  # more than a pipe holds: the child blocks in its flush until the test has read the rest


def _python(code: str) -> subprocess.CompletedProcess[bytes]:
    """`code` in a new interpreter with buffered standard streams, as a process under systemd or ssh has them
    (PYTHONUNBUFFERED, set in some shells and CI images, would hide an unflushed buffer)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    argv = [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(argv, capture_output=True, env=env, timeout=60, check=False)


def test_the_fast_exit_delivers_buffered_output_and_the_status(tmp_path: Path) -> None:
    """Output still in Python's buffers reaches its reader: stdout's tail after a write larger than the pipe, stderr
    without a newline, a logging handler that holds its records until it is closed; the status is the one given,
    and nothing that runs at a normal exit (an atexit handler) runs."""
    log = tmp_path / "held.log"
    done = _python(f"""
        import atexit, logging, logging.handlers, sys
        from fedload.feeder.main import exit_now
        atexit.register(lambda: print("TEARDOWN", file=sys.stderr))
        target = logging.FileHandler({str(log)!r})
        logging.getLogger().addHandler(logging.handlers.MemoryHandler(100, logging.CRITICAL, target))
        logging.getLogger("t").warning("logged")
        sys.stdout.write("x" * {_BIG})
        sys.stdout.write("end")
        sys.stderr.write("last words")
        exit_now(3)
    """)
    assert done.returncode == 3
    assert done.stdout == b"x" * _BIG + b"end"
    assert done.stderr == b"last words"
    assert log.read_text() == "logged\n"


def test_with_another_thread_alive_the_exit_is_a_normal_one() -> None:
    """A thread still running is waited for, as a normal exit does: its last output is not lost."""
    done = _python("""
        import sys, threading, time
        from fedload.feeder.main import exit_now
        def late():
            time.sleep(0.3)
            print("thread done", flush=True)
        threading.Thread(target=late).start()
        exit_now(4)
    """)
    assert (done.returncode, done.stdout) == (4, b"thread done\n")


def test_under_a_profiler_the_exit_is_a_normal_one(tmp_path: Path) -> None:
    """`python -m cProfile -o OUT -m fedload ...` (bench/profile_sync.py) still gets its report written at exit,
    after a command that returns (`transform` of an empty dump) rather than raises SystemExit."""
    report = tmp_path / "fedload.prof"
    done = subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", str(report), "-m", "fedload", "transform"],
        input=b"",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert report.stat().st_size > 0


def test_the_console_script_and_python_m_exit_with_the_commands_status() -> None:
    """`python -m fedload` ends through the entry with the command's status: 2 for a usage error, 0 for --version."""
    usage = _fedload("no-such-command")
    version = _fedload("--version")
    assert usage.returncode == 2
    assert (version.returncode, version.stdout.startswith(b"fedload ")) == (0, True)


def _fedload(*words: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "fedload", *words], capture_output=True, timeout=60, check=False)


def test_python_m_fedload_runs_beside_a_directory_named_fedload(tmp_path: Path) -> None:
    """`python -m fedload` where the current directory holds a `fedload` directory with no package in it (a
    checkout cloned as ~/fedload, and sshd starting the agent in ~): the installed fedload runs, not that
    directory as a namespace package (the editable install is a path, not an import hook after the path's)."""
    (tmp_path / "fedload").mkdir()
    (tmp_path / "fedload" / "README.md").write_text("a checkout's directory\n")
    done = subprocess.run(
        [sys.executable, "-m", "fedload", "--version"], cwd=tmp_path, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-1000:]
    assert done.stdout.startswith(b"fedload ")
