"""Run a script (a recipe, a test helper) in a real process forked from an interpreter that has already imported the heavy libraries.

A fresh ``python recipes/X.py`` spends 5-15 s of CPU importing torch, Lightning, MLflow, pandas and
scikit-learn before it reads its first option; tests that start recipes and helper scripts dozens of times spent most of the
suite's time there. ``run_script`` forks each run from a multiprocessing fork server that imported those
libraries once (per pytest process), then runs the script as ``__main__`` with its own argv, working folder,
environment, stdout/stderr files and exit code, as the interpreter would: ``SystemExit`` gives the exit code,
an uncaught exception prints its traceback and exits with 1, and the ``atexit`` handlers (MLflow ends its
active run there) run before the process exits. Start-up itself (imports, entry points) stays covered by the
tests that still start a fresh interpreter.
"""

from __future__ import annotations

import atexit
import gc
import io
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

PRELOAD = ["torch", "lightning", "mlflow", "mlflow.tracking", "pandas", "sklearn", "ct_lightning",
           "ct_lightning.experiment.runner"]
_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


def _exit_code(code) -> int:
    """The exit status the interpreter gives ``SystemExit(code)``, printing a non-integer code as it does."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _child_main(script: str, argv: list[str], cwd: str, env: dict[str, str], out_path: str, err_path: str) -> None:
    gc.freeze()  # a collection would otherwise walk (and copy, page by page) every object the server imported
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), line_buffering=True, errors="backslashreplace")
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    warnings.resetwarnings()
    if env.get("PYTHONWARNINGS"):
        warnings._processoptions(env["PYTHONWARNINGS"].split(","))
    sys.argv = [script, *argv]
    sys.path[0] = os.path.dirname(script)
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


class Started:
    """A script forked by ``start_script``: ``pid``, ``poll()``, ``kill()``, ``output()`` and ``wait()``."""

    def __init__(self, script: str | Path, argv: list[str], cwd: str | Path, env: dict[str, str] | None):
        self.args = [sys.executable, str(script), *map(str, argv)]
        self._folder = tempfile.TemporaryDirectory()
        self._out, self._err = (os.path.join(self._folder.name, name) for name in ("out", "err"))
        self._process = _context().Process(target=_child_main, args=(
            str(Path(script).resolve()), self.args[2:], str(cwd), dict(os.environ if env is None else env),
            self._out, self._err))
        self._process.start()
        self.pid = self._process.pid

    def poll(self) -> int | None:
        """The exit code, or None while it runs (negative: killed by that signal)."""
        return None if self._process.is_alive() else self._process.exitcode

    def kill(self) -> None:
        """SIGKILL, as ``Popen.kill``."""
        self._process.kill()

    def output(self) -> str:
        """What it has printed so far, stdout then stderr."""
        return "".join(Path(path).read_text(errors="backslashreplace") for path in (self._out, self._err)
                       if os.path.exists(path))

    def wait(self, timeout: float | None = 600) -> subprocess.CompletedProcess:
        """Wait for the exit (killing it after ``timeout`` s, then raising ``TimeoutExpired``); stdout and stderr."""
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
            raise subprocess.TimeoutExpired(self.args, timeout)
        read = lambda path: Path(path).read_text(errors="backslashreplace") if os.path.exists(path) else ""
        done = subprocess.CompletedProcess(self.args, self._process.exitcode, read(self._out), read(self._err))
        self._folder.cleanup()
        return done


def start_script(script: str | Path, argv: list[str], *, cwd: str | Path, env: dict[str, str] | None = None) -> Started:
    """``subprocess.Popen([python, script, *argv], cwd=cwd, env=env)`` with its output kept, forked."""
    return Started(script, argv, cwd, env)


def run_script(script: str | Path, argv: list[str], *, cwd: str | Path, env: dict[str, str] | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """``subprocess.run([python, script, *argv], cwd=cwd, env=env, capture_output=True, text=True)``, forked.

    ``env=None`` passes this process's environment, as ``subprocess.run`` does."""
    return start_script(script, argv, cwd=cwd, env=env).wait(timeout)
