import sys

import pynvml
import pytest

from gpuslice.gpu import GPUDiscoveryError, NoDriverError, discover, nvml_available
from gpuslice.model import MigMode
from tests.fakes import FAKE_NVML_ENV, fake_pynvml
from tests.fakes.fake_pynvml import FakeNVML, write_state

H100 = "NVIDIA H100 80GB HBM3"


def plain_gpu(i=0, **kw):
    d = {"uuid": f"GPU-aaaa-{i}", "name": H100, "memory_mib": 81559}
    d.update(kw)
    return d


def mig_gpu(**kw):
    return plain_gpu(
        mig_mode="enabled",
        max_mig_devices=7,
        mig_devices=[
            {"uuid": "MIG-3g", "gi_slices": 3, "memory_mib": 40192, "gi_id": 2, "ci_id": 0},
            None,  # a hole: NotFound
            "InvalidArgument",  # a hole the way some drivers report it
            {"uuid": "MIG-1g", "gi_slices": 1, "memory_mib": 9856, "gi_id": 9, "ci_id": 0},
            {"uuid": "MIG-1c", "gi_slices": 2, "ci_slices": 1, "memory_mib": 19968, "gi_id": 5},
        ],
        **kw,
    )


def test_plain_gpus():
    nvml = FakeNVML({"devices": [plain_gpu(0), plain_gpu(1, name="NVIDIA A100-SXM4-80GB")]})
    inv = discover("nvml", hostname="gpuhost", nvml=nvml)
    assert inv.backend == "nvml"
    (host,) = inv.hosts
    assert host.name == "gpuhost"
    assert host.cpu_milli >= 1000 and host.memory_mib > 0
    assert [(g.uuid, g.index, g.model, g.memory_mib) for g in host.gpus] == [
        ("GPU-aaaa-0", 0, H100, 81559),
        ("GPU-aaaa-1", 1, "NVIDIA A100-SXM4-80GB", 81559),
    ]
    assert all(g.mig_mode is MigMode.DISABLED for g in host.gpus)
    assert nvml.init_count == 0, "nvmlShutdown must balance nvmlInit"


def test_mig_enumeration_skips_holes():
    nvml = FakeNVML({"devices": [mig_gpu()]})
    (gpu,) = discover("nvml", nvml=nvml).gpus()
    assert gpu.mig_mode is MigMode.ENABLED
    assert [
        (m.uuid, m.profile, m.memory_mib, m.milli, m.gi_id, m.ci_id) for m in gpu.mig_instances
    ] == [
        ("MIG-3g", "3g.40gb", 40192, 428, 2, 0),
        ("MIG-1g", "1g.10gb", 9856, 142, 9, 0),
        ("MIG-1c", "1c.2g.20gb", 19968, 142, 5, 0),
    ]
    # all 7 indexes were asked about, holes included
    assert nvml.calls["nvmlDeviceGetMigDeviceHandleByIndex"] == 7
    assert nvml.init_count == 0


def test_a30_compute_slices_come_from_the_driver():
    dev = plain_gpu(
        name="NVIDIA A30",
        memory_mib=24576,
        mig_mode="enabled",
        compute_slices=4,
        mig_devices=[{"uuid": "MIG-a", "gi_slices": 1, "memory_mib": 5836, "gi_id": 3}],
    )
    (gpu,) = discover("nvml", nvml=FakeNVML({"devices": [dev]})).gpus()
    assert [(m.profile, m.milli) for m in gpu.mig_instances] == [("1g.6gb", 250)]


def test_mig_not_supported_is_unsupported_not_an_error():
    nvml = FakeNVML({"devices": [plain_gpu(name="Tesla T4", mig_mode="unsupported")]})
    (gpu,) = discover("nvml", nvml=nvml).gpus()
    assert gpu.mig_mode is MigMode.UNSUPPORTED
    assert gpu.mig_instances == ()


def test_mig_mode_function_missing_on_old_driver():
    nvml = FakeNVML(
        {"devices": [plain_gpu()], "errors": {"nvmlDeviceGetMigMode": "FunctionNotFound"}}
    )
    assert discover("nvml", nvml=nvml).gpus()[0].mig_mode is MigMode.UNSUPPORTED


def test_memory_info_falls_back_to_v1():
    nvml = FakeNVML({"devices": [plain_gpu(memory_v2=False, memory_mib=16160)]})
    (gpu,) = discover("nvml", nvml=nvml).gpus()
    assert gpu.memory_mib == 16160
    assert nvml.calls["nvmlDeviceGetMemoryInfo_v2"] == 1
    assert nvml.calls["nvmlDeviceGetMemoryInfo"] == 1


def test_memory_info_v2_used_when_present():
    nvml = FakeNVML({"devices": [plain_gpu()]})
    discover("nvml", nvml=nvml)
    assert nvml.calls["nvmlDeviceGetMemoryInfo_v2"] == 1
    assert nvml.calls["nvmlDeviceGetMemoryInfo"] == 0


@pytest.mark.parametrize("driver", ["library_not_found", "driver_not_loaded"])
def test_no_driver_is_a_clear_error(driver):
    nvml = FakeNVML({"driver": driver})
    with pytest.raises(NoDriverError) as e:
        discover("nvml", nvml=nvml)
    msg = str(e.value)
    assert "No NVIDIA driver was found" in msg
    assert "'simulated' backend explicitly" in msg
    assert nvml.calls["nvmlShutdown"] == 0  # init failed: nothing to shut down


@pytest.mark.parametrize("driver", ["library_not_found", "driver_not_loaded"])
def test_auto_never_picks_simulated(driver):
    with pytest.raises(GPUDiscoveryError) as e:
        discover("auto", nvml=FakeNVML({"driver": driver}))
    assert "never falls back to simulated" in str(e.value)
    assert "'simulated'" in str(e.value)


def test_auto_uses_nvml_when_driver_present():
    inv = discover("auto", nvml=FakeNVML({"devices": [plain_gpu()]}))
    assert inv.backend == "nvml" and inv.simulated is True  # fake driver is labelled
    assert [g.uuid for g in inv.gpus()] == ["GPU-aaaa-0"]


def test_shutdown_after_failure_midway():
    nvml = FakeNVML(
        {"devices": [plain_gpu(0), plain_gpu(1)], "errors": {"nvmlDeviceGetName@1": "Unknown"}}
    )
    with pytest.raises(GPUDiscoveryError, match="NVML failed while reading GPUs"):
        discover("nvml", nvml=nvml)
    assert nvml.calls["nvmlShutdown"] == 1 and nvml.init_count == 0


def test_lost_gpu_is_left_out():
    nvml = FakeNVML(
        {"devices": [plain_gpu(0), plain_gpu(1)], "errors": {"nvmlDeviceGetUUID@1": "GpuIsLost"}}
    )
    assert [g.uuid for g in discover("nvml", nvml=nvml).gpus()] == ["GPU-aaaa-0"]


def test_error_on_one_mig_device_is_not_swallowed():
    nvml = FakeNVML({"devices": [mig_gpu()], "errors": {"nvmlDeviceGetUUID@0/3": "Unknown"}})
    with pytest.raises(GPUDiscoveryError):
        discover("nvml", nvml=nvml)
    assert nvml.init_count == 0


def test_nvml_available():
    assert nvml_available(FakeNVML({"devices": []})) is True
    assert nvml_available(FakeNVML({"driver": "library_not_found"})) is False
    nvml = FakeNVML({})
    nvml_available(nvml)
    assert nvml.init_count == 0


def test_nvml_refuses_a_hosts_list_and_unknown_backends():
    with pytest.raises(GPUDiscoveryError, match="takes no hosts list"):
        discover("nvml", [{"name": "x"}], nvml=FakeNVML({}))
    with pytest.raises(GPUDiscoveryError, match="unknown GPU discovery backend 'nvidia'"):
        discover("nvidia")


def test_a_fake_driver_in_place_of_pynvml_is_marked_simulated(tmp_path, monkeypatch):
    """What tests/fakes/site/sitecustomize.py does in the processes tests start."""
    path = tmp_path / "state.json"
    write_state(path, {"devices": [plain_gpu(0)]})
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML.from_file(str(path)))
    inv = discover("nvml", hostname="h")
    assert inv.simulated is True
    assert [g.uuid for g in inv.gpus()] == ["GPU-aaaa-0"]


def test_real_pynvml_without_driver_is_a_clear_error(monkeypatch):
    # This machine has no NVIDIA driver; the real pynvml must map that to our error.
    monkeypatch.delenv(FAKE_NVML_ENV, raising=False)
    if nvml_available():
        pytest.skip("a real NVIDIA driver is present")
    with pytest.raises(NoDriverError, match="No NVIDIA driver was found"):
        discover("nvml")


# ---- the fake itself behaves like pynvml ------------------------------------------------


def test_fake_exceptions_are_pynvmls():
    nvml = FakeNVML({})
    assert nvml.NVMLError_NotFound is pynvml.NVMLError_NotFound
    err = nvml.NVMLError(nvml.NVML_ERROR_NOT_FOUND)
    assert type(err) is pynvml.NVMLError_NotFound
    assert isinstance(err, pynvml.NVMLError)
    assert str(err) == "Not Found"


def test_fake_raises_catchable_by_real_classes():
    nvml = FakeNVML({"devices": [mig_gpu()]})
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 2)
    nvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


def test_module_level_fake():
    fake_pynvml.reset({"devices": [plain_gpu()]})
    try:
        inv = discover("nvml", nvml=fake_pynvml)
        assert [g.uuid for g in inv.gpus()] == ["GPU-aaaa-0"]
        assert fake_pynvml.DEFAULT.init_count == 0
    finally:
        fake_pynvml.reset()


def test_fake_file_is_reread_when_rewritten(tmp_path):
    path = tmp_path / "s.json"
    write_state(path, {"devices": [plain_gpu(0)]})
    nvml = FakeNVML.from_file(path)
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 1
    write_state(path, {"devices": [plain_gpu(0), plain_gpu(1)]})
    assert nvml.nvmlDeviceGetCount() == 2
    nvml.nvmlShutdown()
