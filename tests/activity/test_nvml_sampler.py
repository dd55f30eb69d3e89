import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuslice.activity import (
    ActivitySampler,
    Attribution,
    Attributor,
    IdleTrackers,
    NvmlActivitySource,
    ProcReader,
    make_source,
)
from tests.fakes import FAKE_NVML_ENV
from tests.fakes.fake_pynvml import FakeNVML, write_state

MiB = 1024 * 1024
SRV = 100
KERNELS = {"A": 200, "B": 300}


@pytest.fixture
def procs(fake_proc):
    p = fake_proc.add
    p(1, 0, uid=0)
    p(SRV, 1)
    p(200, SRV)
    p(201, 200)  # A's DataLoader worker
    p(300, SRV)
    p(400, SRV)  # a terminal script
    p(600, 1, uid=1001)  # another user's job on the same GPU
    return fake_proc


def gpu(processes, **kw):
    d = {
        "uuid": "GPU-0",
        "name": "NVIDIA A100-SXM4-80GB",
        "memory_mib": 81920,
        "processes": processes,
    }
    d.update(kw)
    return d


def make_sampler(procs, state, **source_kw):
    nvml = FakeNVML(state)
    source = NvmlActivitySource(nvml=nvml, clock=lambda: 1000.0, **source_kw)
    att = Attributor(ProcReader(str(procs.root)), server_pid=SRV, server_uid=1000)
    return nvml, ActivitySampler(source, att)


def test_busy_idle_and_memory_held_while_idle(procs):
    state = {
        "devices": [
            gpu(
                [
                    {"pid": 200, "used_memory_mib": 1000, "sm_util": 30},
                    {"pid": 201, "used_memory_mib": 500, "sm_util": 45},
                    {"pid": 300, "used_memory_mib": 2048},  # holds memory, no utilization samples
                ]
            )
        ]
    }
    nvml, sampler = make_sampler(procs, state)
    r = sampler.tick(KERNELS)
    a, b = r.kernels["A"], r.kernels["B"]
    assert (a.util, a.memory_bytes, a.pids) == (75.0, 1500 * MiB, (200, 201))
    assert a.attribution is Attribution.PER_PROCESS
    assert (b.util, b.memory_bytes, b.holds_memory) == (0.0, 2048 * MiB, True)
    assert r.server.util == 0.0 and r.server.pids == ()
    assert r.devices[0].util == 75.0
    sampler.close()
    assert nvml.init_count == 0


def test_no_samples_at_all_is_idle_not_an_error(procs):
    # nvmlDeviceGetProcessUtilization raises NotFound when nothing ran since lastSeen.
    nvml, sampler = make_sampler(procs, {"devices": [gpu([{"pid": 200, "used_memory_mib": 10}])]})
    r = sampler.tick(KERNELS)
    assert r.kernels["A"].util == 0.0
    assert r.devices[0].error is None
    assert nvml.calls["nvmlDeviceGetProcessUtilization"] == 1


def test_last_seen_timestamp_is_passed_back(procs):
    nvml, sampler = make_sampler(procs, {"devices": [gpu([{"pid": 200, "sm_util": 5}])]})
    sampler.tick(KERNELS)
    t1 = sampler.source._gpus[0].last_seen_ts
    sampler.tick(KERNELS)
    # the second call asks only for samples newer than those the first one returned
    assert nvml.util_timestamps_asked == [0, t1]
    assert sampler.source._gpus[0].last_seen_ts > t1 > 0


def test_kernel_without_gpu_process_and_server_and_foreign(procs):
    state = {
        "devices": [
            gpu(
                [
                    {"pid": 400, "used_memory_mib": 300, "sm_util": 60},
                    {"pid": 600, "used_memory_mib": 9000, "sm_util": 99},
                ]
            )
        ]
    }
    _, sampler = make_sampler(procs, state)
    r = sampler.tick(KERNELS)
    assert r.kernels["A"].util == 0.0 and r.kernels["A"].memory_bytes == 0
    assert (r.server.util, r.server.memory_bytes, r.server.pids) == (60.0, 300 * MiB, (400,))
    assert r.foreign_pids == (600,)


def test_process_utilization_not_supported_uses_device_figure(procs):
    state = {
        "devices": [
            gpu([{"pid": 200, "used_memory_mib": 10}], process_utilization=False, gpu_util=40)
        ]
    }
    nvml, sampler = make_sampler(procs, state)
    r = sampler.tick(KERNELS)
    assert r.kernels["A"].attribution is Attribution.PER_INSTANCE
    assert r.kernels["A"].util == 40.0
    sampler.tick(KERNELS)
    # NotSupported is remembered: not asked again every tick
    assert nvml.calls["nvmlDeviceGetProcessUtilization"] == 1


def mig_state(gpm):
    return {
        "devices": [
            {
                "uuid": "GPU-0",
                "name": "NVIDIA H100 80GB HBM3",
                "memory_mib": 81559,
                "mig_mode": "enabled",
                "gpm": gpm,
                "mig_devices": [
                    {
                        "uuid": "MIG-a",
                        "gi_slices": 3,
                        "memory_mib": 40192,
                        "gi_id": 1,
                        "gpm_util": 63.0,
                        "processes": [{"pid": 201, "used_memory_mib": 700}],
                    },
                    None,
                    {
                        "uuid": "MIG-b",
                        "gi_slices": 1,
                        "memory_mib": 9856,
                        "gi_id": 9,
                        "gpm_util": 0.0,
                        "processes": [{"pid": 300, "used_memory_mib": 100}],
                    },
                ],
            }
        ]
    }


def test_mig_without_gpm_says_unavailable(procs):
    _, sampler = make_sampler(procs, mig_state(gpm=False))
    r = sampler.tick(KERNELS)
    a = r.kernels["A"]
    assert a.attribution is Attribution.UNAVAILABLE
    assert a.util is None
    assert a.memory_bytes == 700 * MiB  # memory is still per process
    assert a.devices == ("MIG-a",)
    assert {d.uuid: d.attribution for d in r.devices} == {
        "MIG-a": Attribution.UNAVAILABLE,
        "MIG-b": Attribution.UNAVAILABLE,
    }
    assert all(d.parent_uuid == "GPU-0" for d in r.devices)


def test_mig_with_gpm_is_per_instance(procs):
    nvml, sampler = make_sampler(procs, mig_state(gpm=True))
    r = sampler.tick(KERNELS)
    assert r.kernels["A"].util is None  # first GPM sample: nothing to diff against yet
    assert r.kernels["A"].attribution is Attribution.PER_INSTANCE
    r = sampler.tick(KERNELS)
    assert r.kernels["A"].util == 63.0
    assert r.kernels["B"].util == 0.0
    sampler.close()
    assert nvml.calls["nvmlGpmSampleAlloc"] == nvml.calls["nvmlGpmSampleFree"] == 4


def test_device_filter_keeps_only_the_servers_slice(procs):
    _, sampler = make_sampler(procs, mig_state(gpm=False), devices=["MIG-b"])
    r = sampler.tick(KERNELS)
    assert [d.uuid for d in r.devices] == ["MIG-b"]
    assert r.kernels["A"].pids == ()


def test_device_error_makes_everything_unknown_then_recovers(procs):
    state = {
        "devices": [gpu([{"pid": 200, "sm_util": 10}])],
        "errors": {"nvmlDeviceGetComputeRunningProcesses@0": "GpuIsLost"},
    }
    nvml, sampler = make_sampler(procs, state)
    r = sampler.tick(KERNELS)
    assert r.devices[0].error and "GpuIsLost" in r.devices[0].error
    assert r.kernels["B"].util is None  # no process seen, but the device was not read
    assert r.kernels["B"].attribution is Attribution.UNAVAILABLE
    del nvml.state["errors"]
    r = sampler.tick(KERNELS)
    assert r.kernels["A"].util == 10.0
    assert nvml.calls["nvmlDeviceGetCount"] == 2  # handles were enumerated afresh


def test_old_driver_without_v3_process_list(procs):
    state = {
        "devices": [gpu([{"pid": 200, "used_memory_mib": 64, "sm_util": 3}])],
        "errors": {"nvmlDeviceGetComputeRunningProcesses": "LibraryMismatch"},
    }
    nvml, sampler = make_sampler(procs, state)
    assert sampler.tick(KERNELS).kernels["A"].memory_bytes == 64 * MiB
    sampler.tick(KERNELS)
    assert nvml.calls["nvmlDeviceGetComputeRunningProcesses"] == 1
    assert nvml.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 2


def test_unavailable_memory_is_none_not_zero(procs):
    _, sampler = make_sampler(procs, {"devices": [gpu([{"pid": 200, "used_memory_mib": None}])]})
    assert sampler.tick(KERNELS).kernels["A"].memory_bytes is None


def test_container_host_pids(fake_proc):
    fake_proc.add(1, 0, uid=0)
    fake_proc.add(5000, 1, nspid=(5000, 7))
    fake_proc.add(5001, 5000, nspid=(5001, 42))
    fake_proc.add(5002, 5001, nspid=(5002, 43))
    nvml = FakeNVML({"devices": [gpu([{"pid": 5002, "used_memory_mib": 1, "sm_util": 20}])]})
    sampler = ActivitySampler(
        NvmlActivitySource(nvml=nvml),
        Attributor(ProcReader(str(fake_proc.root)), server_pid=7, server_uid=1000),
    )
    a = sampler.tick({"k": 42}).kernels["k"]
    assert (a.util, a.pids) == (20.0, (43,))


def test_state_file_rewritten_by_another_process_drives_idleness(procs, tmp_path, monkeypatch):
    path = tmp_path / "nvml.json"
    write_state(path, {"devices": [gpu([{"pid": 200, "used_memory_mib": 512, "sm_util": 80}])]})
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML.from_file(str(path)))
    source = make_source("nvml", devices=None)
    sampler = ActivitySampler(
        source, Attributor(ProcReader(str(procs.root)), server_pid=SRV, server_uid=1000)
    )
    trackers = IdleTrackers(window=30)
    r = sampler.tick(KERNELS)
    assert r.simulated is True and r.kernels["A"].util == 80.0
    assert trackers.update(r, now=0)["A"].idle_seconds == 0
    # Another process makes the kernel idle while it keeps its memory.
    idle = {"devices": [gpu([{"pid": 200, "used_memory_mib": 512}])]}
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys; from tests.fakes.fake_pynvml import write_state; "
            "write_state(sys.argv[1], json.loads(sys.argv[2]))",
            str(path),
            __import__("json").dumps(idle),
        ],
        check=True,
    )
    for t in (30, 45, 60):
        states = trackers.update(sampler.tick(KERNELS), now=t)
    assert states["A"].idle_seconds == 30 and states["A"].holds_memory
    sampler.close()


def test_gpm_refused_for_mig_degrades_to_unavailable(procs):
    state = mig_state(gpm=True)
    state["errors"] = {"nvmlGpmMigSampleGet": "NotSupported"}
    nvml, sampler = make_sampler(procs, state)
    for _ in range(2):
        r = sampler.tick(KERNELS)
        assert r.kernels["A"].attribution is Attribution.UNAVAILABLE
        assert r.devices[0].error is None
    assert nvml.calls["nvmlGpmMigSampleGet"] == 1  # not retried every tick
    sampler.close()
    assert nvml.calls["nvmlGpmSampleAlloc"] == nvml.calls["nvmlGpmSampleFree"]


def test_real_pynvml_without_driver(monkeypatch):
    from gpuslice.gpu import NoDriverError, nvml_available

    monkeypatch.delenv(FAKE_NVML_ENV, raising=False)
    if nvml_available():
        pytest.skip("a real NVIDIA driver is present")
    source = make_source("nvml")
    with pytest.raises(NoDriverError, match="simulated"):
        source.sample()
    source.close()


def test_visible_device_that_matches_nothing_is_not_read_as_idle(procs):
    _, sampler = make_sampler(procs, {"devices": [gpu([])]}, devices=["GPU-elsewhere"])
    r = sampler.tick(KERNELS)
    assert [(d.uuid, d.error) for d in r.devices] == [("GPU-elsewhere", "no such NVML device")]
    assert r.kernels["A"].util is None


def test_legacy_mig_names_and_indexes_select_devices(procs):
    _, sampler = make_sampler(procs, mig_state(gpm=False), devices=["MIG-GPU-0/9/0"])
    assert [d.uuid for d in sampler.tick(KERNELS).devices] == ["MIG-b"]
    _, sampler = make_sampler(procs, {"devices": [gpu([]), gpu([], uuid="GPU-1")]}, devices=["1"])
    assert [d.uuid for d in sampler.tick(KERNELS).devices] == ["GPU-1"]


def test_visible_devices_from_environment():
    from gpuslice.activity import visible_devices

    assert visible_devices({}) is None
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "MIG-a, 1"}) == ["MIG-a", "1"]


def test_the_fake_behaves_as_the_real_driver_was_recorded_to(procs):
    """benchmarks/gpu_check.py recorded the real driver on an H200 (the JSON in
    benchmarks/results): asked for samples newer than now, per-process utilization raises
    NotFound; its timestamps are microseconds since the epoch. The fake must do the same,
    or the sampler's tests would pass against a driver that does not exist."""
    recorded = json.loads(
        (Path(__file__).parents[2] / "benchmarks/results/gpu_check_h200.json").read_text()
    )
    assert recorded["driver"]["process_util_future"].startswith("NVMLError_NotFound")
    assert -60 < recorded["last_sample_ts_minus_now_us_s"] <= 0
    assert all(c["ok"] for c in recorded["checks"])

    nvml = FakeNVML({"devices": [gpu([{"pid": 200, "sm_util": 5}])]})
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    now_us = time.time() * 1e6
    (sample,) = nvml.nvmlDeviceGetProcessUtilization(handle, 0)
    assert abs(sample.timeStamp - now_us) < 60e6
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetProcessUtilization(handle, int(now_us + 60e6))
