import subprocess
import sys
import time

import pytest


class FakeProc:
    """A fake /proc: ``add(pid, ppid, uid, nspid)`` writes ``<root>/<pid>/status``."""

    def __init__(self, root):
        self.root = root

    def add(self, pid, ppid, uid=1000, nspid=None):
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        ns = "\t".join(str(p) for p in (nspid or (pid,)))
        (d / "status").write_text(
            f"Name:\tpython\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nNgid:\t0\n"
            f"Pid:\t{pid}\nPPid:\t{ppid}\nTracerPid:\t0\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
            f"Gid:\t{uid}\t{uid}\t{uid}\t{uid}\nNStgid:\t{ns}\nNSpid:\t{ns}\nVmRSS:\t1 kB\n"
        )
        return pid

    def remove(self, pid):
        d = self.root / str(pid)
        (d / "status").unlink()
        d.rmdir()


@pytest.fixture
def fake_proc(tmp_path):
    root = tmp_path / "proc"
    root.mkdir()
    return FakeProc(root)


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def clock():
    return Clock()


def wait_for(predicate, timeout=10.0, interval=0.05):
    """Poll *predicate* until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


# Spins until its parent goes away, so a killed test run leaves no busy loop behind.
BUSY = "import os\np = os.getppid()\nwhile os.getppid() == p: pass"

# A "kernel" that starts one child and prints the child's PID: the child busy-loops
# (busy) or sleeps (idle). The kernel itself only waits.
KERNEL_WITH_CHILD = r"""
import subprocess, sys
mode, BUSY = sys.argv[1], sys.argv[2]
code = BUSY if mode == "busy" else "import time; time.sleep(120)"
child = subprocess.Popen([sys.executable, "-c", code])
print(child.pid, flush=True)
sys.stdin.read()  # exit (and kill the child) when the test closes our stdin
child.kill()
"""


@pytest.fixture
def spawn_kernel():
    """Start a real kernel-like process tree; returns (kernel_pid, child_pid)."""
    procs = []

    def spawn(mode):
        p = subprocess.Popen(
            [sys.executable, "-c", KERNEL_WITH_CHILD, mode, BUSY],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(p)
        child = int(p.stdout.readline())
        return p.pid, child

    yield spawn
    for p in procs:
        p.stdin.close()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture
def spawn_plain():
    procs = []

    def spawn(code):
        p = subprocess.Popen([sys.executable, "-c", code])
        procs.append(p)
        return p.pid

    yield spawn
    for p in procs:
        p.kill()
        p.wait()
