"""tests/helpers/preloaded.py runs a script as ``subprocess.run([python, script, ...])`` would: same outcome."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from preloaded import run_script, start_script

SCRIPT = """
import atexit, os, sys
atexit.register(lambda: print("atexit ran", flush=True))
print("cwd", os.getcwd(), "var", os.environ.get("CT_PROBE"), "argv", sys.argv[1:], "path0", sys.path[0])
mode = sys.argv[1]
if mode == "message":
    sys.exit("error: a message")
if mode == "code":
    sys.exit(3)
if mode == "raise":
    raise ValueError("boom")
if mode == "sleep":
    import time
    time.sleep(60)
"""


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("script") / "probe.py"
    path.write_text(SCRIPT)
    return path


@pytest.mark.parametrize("mode", ["ok", "message", "code", "raise"])
def test_forked_run_ends_as_a_fresh_interpreter_does(script, mode, tmp_path):
    env = {**os.environ, "CT_PROBE": "seen"}
    fresh = subprocess.run([sys.executable, str(script), mode], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
    forked = run_script(script, [mode], cwd=tmp_path, env=env, timeout=120)
    assert forked.returncode == fresh.returncode
    assert forked.stdout == fresh.stdout, "argv, cwd, environment, sys.path[0] and the atexit handlers"
    last = lambda text: (text.strip().splitlines() or [""])[-1]
    assert last(forked.stderr) == last(fresh.stderr), "the exit message or the exception's last line"
    assert ("Traceback" in forked.stderr) == ("Traceback" in fresh.stderr)


def test_a_started_script_can_be_killed_and_reports_the_signal(script, tmp_path):
    started = start_script(script, ["sleep"], cwd=tmp_path)
    deadline = time.monotonic() + 60
    while "cwd" not in started.output() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.poll() is None
    os.kill(started.pid, signal.SIGKILL)
    assert started.wait(timeout=60).returncode == -signal.SIGKILL


def test_a_run_past_its_timeout_is_killed(script, tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        run_script(script, ["sleep"], cwd=tmp_path, timeout=1)
