import os

import pytest

from gpuslice.activity import ActivitySampler, Attributor, SimulatedActivitySource, make_source

from .conftest import BUSY, wait_for

IDLE = "import time; time.sleep(120)"


def sampler(**kw):
    source = SimulatedActivitySource(server_pid=os.getpid(), device="GPU-sim-h-0", **kw)
    return ActivitySampler(source, Attributor(server_pid=os.getpid()))


def test_busy_kernel_looks_busy_and_idle_kernel_idle(spawn_plain):
    busy, idle = spawn_plain(BUSY), spawn_plain(IDLE)
    s = sampler()
    kernels = {"busy": busy, "idle": idle}

    def settled():
        # The first tick after start-up still sees the interpreter's start-up CPU in the
        # idle process; poll until both have a per-tick figure that tells them apart.
        r = s.tick(kernels)
        return r if r.kernels["busy"].util > 50 and r.kernels["idle"].util < 1 else None

    r = wait_for(settled)
    assert r.simulated is True
    assert r.kernels["busy"].devices == ("GPU-sim-h-0",)
    assert r.kernels["idle"].memory_bytes == 0  # no fake memory configured


def test_busy_child_counts_for_its_kernel(spawn_kernel):
    kernel, child = spawn_kernel("busy")
    s = sampler()

    def busy():
        r = s.tick({"k": kernel})
        return r if r.kernels["k"].util > 50 else None

    r = wait_for(busy)
    assert child in r.kernels["k"].pids
    assert r.server.util < 50  # the busy loop is the kernel's, not the server's


def test_fake_memory_is_held_after_being_busy(spawn_plain):
    busy = spawn_plain(BUSY)
    s = sampler(memory_mib=256)

    def holds():
        r = s.tick({"k": busy})
        return r if r.kernels["k"].memory_bytes == 256 * 1024 * 1024 else None

    wait_for(holds)


def test_busy_process_outside_kernels_is_server_activity(spawn_plain):
    spawn_plain(BUSY)  # e.g. a script started from a terminal
    s = sampler()
    wait_for(lambda: s.tick({}).server.util > 50)


def test_make_source_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown activity source"):
        make_source("cuda")
