"""The local backend signals a run only while its pid is still the process it started,
recognized by its start time: a second's difference (the boot time Linux reports moves
while NTP steers the clock) is the same process, a pid reused much later is not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from gpuslice_hub.jobs.backends.local import LocalBackend
from tests.harness.hub import wait_for


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("shift", [-1.0, 0.0, 1.0])
def test_a_start_time_a_second_off_is_the_same_process(sleeper, shift: float):
    started = psutil.Process(sleeper.pid).create_time()
    ref = {"pid": sleeper.pid, "create_time": started + shift}
    LocalBackend().signal_preempt(ref)
    wait_for(lambda: sleeper.poll() is not None, 10, "the signalled process to end")
    assert sleeper.returncode == -15


CHILD = """
import signal, sys, time
def say(word):
    return lambda *_: (sys.stdout.write(word + "\\n"), sys.stdout.flush())
signal.signal(signal.SIGTERM, say("term"))
signal.signal(signal.SIGWINCH, say("winch"))
print("ready", flush=True)
time.sleep(60)
"""


def test_a_pid_whose_start_time_differs_by_more_is_another_process():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        started = psutil.Process(proc.pid).create_time()
        LocalBackend().signal_preempt({"pid": proc.pid, "create_time": started - 30})
        LocalBackend().signal_preempt({"pid": proc.pid, "create_time": None})
        # Python runs pending handlers in signal-number order: a SIGTERM (15) sent before
        # this SIGWINCH (28) would have been said before it
        os.kill(proc.pid, signal.SIGWINCH)
        assert proc.stdout.readline() == "winch\n"
    finally:
        proc.kill()
        proc.wait()
