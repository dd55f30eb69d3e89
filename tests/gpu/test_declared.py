import pytest

from gpuslice.gpu import ConfigError, discover
from gpuslice.model import MigMode

A100 = "NVIDIA A100-SXM4-80GB"


def config():
    return [
        {
            "name": "node1",
            "cpu_milli": 64000,
            "memory_mib": 512000,
            "gpus": [
                {
                    "model": A100,
                    "memory_mib": 81920,
                    "count": 2,
                    "mig": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
                },
                {"model": A100, "memory_mib": 81920, "count": 2},
            ],
        },
        {"name": "cpu-only", "cpu_milli": 8000, "memory_mib": 16384},
    ]


def test_simulated_inventory():
    inv = discover("simulated", config())
    assert inv.simulated is True
    assert inv.backend == "simulated"
    node1, cpu_only = inv.hosts
    assert (node1.cpu_milli, node1.memory_mib) == (64000, 512000)
    assert cpu_only.gpus == ()
    assert [g.uuid for g in node1.gpus] == [f"GPU-sim-node1-{i}" for i in range(4)]
    assert [g.index for g in node1.gpus] == [0, 1, 2, 3]
    assert [g.mig_mode for g in node1.gpus] == [MigMode.ENABLED] * 2 + [MigMode.DISABLED] * 2
    mig = node1.gpus[1].mig_instances
    assert [m.uuid for m in mig] == [f"MIG-sim-node1-1-{j}" for j in range(4)]
    assert [m.profile for m in mig] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert [m.milli for m in mig] == [428, 285, 142, 142]
    assert [m.memory_mib for m in mig] == [40960, 20480, 10240, 10240]
    assert node1.gpus[3].mig_instances == ()


def test_uuids_are_deterministic_across_restarts():
    a = discover("simulated", config())
    b = discover("simulated", config())
    assert [g.uuid for g in a.gpus()] == [g.uuid for g in b.gpus()]
    assert a == b


def test_static_is_not_simulated_and_takes_real_uuids():
    cfg = [
        {
            "name": "gpu7",
            "cpu_milli": 32000,
            "memory_mib": 256000,
            "gpus": [{"model": A100, "memory_mib": 81920, "count": 2, "uuids": ["GPU-a", "GPU-b"]}],
        }
    ]
    inv = discover("static", cfg)
    assert inv.simulated is False
    assert [g.uuid for g in inv.gpus()] == ["GPU-a", "GPU-b"]
    cfg[0]["gpus"][0].pop("uuids")
    assert [g.uuid for g in discover("static", cfg).gpus()] == [
        "GPU-static-gpu7-0",
        "GPU-static-gpu7-1",
    ]


def test_a30_declared_with_four_slices():
    cfg = [
        {
            "name": "n",
            "cpu_milli": 1000,
            "memory_mib": 1024,
            "gpus": [
                {
                    "model": "NVIDIA A30",
                    "memory_mib": 24576,
                    "compute_slices": 4,
                    "mig": ["2g.12gb", "1g.6gb", "1g.6gb"],
                }
            ],
        }
    ]
    mig = discover("simulated", cfg).gpus()[0].mig_instances
    assert [m.milli for m in mig] == [500, 250, 250]


def _with(mutate):
    cfg = config()
    mutate(cfg)
    return cfg


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda c: c[0]["gpus"][0].update(count="two"),
            "hosts[0].gpus[0].count: must be a positive integer, got 'two'",
        ),
        (
            lambda c: c[0]["gpus"][1].update(count=True),
            "hosts[0].gpus[1].count: must be a positive integer, got True",
        ),
        (
            lambda c: c[1].update(
                gpus=[{"model": A100, "memory_mib": 81920, "mig": ["1g.10gb", "1g.10gb", "9g.5gb"]}]
            ),
            "hosts[1].gpus[0].mig[2]: '9g.5gb' is not a MIG profile name like '1g.10gb'",
        ),
        (
            lambda c: c[0]["gpus"][0].update(mig=["4g.40gb", "4g.40gb"]),
            "hosts[0].gpus[0].mig: the layout uses 8 compute slices, more than the GPU's 7",
        ),
        (
            lambda c: c[0]["gpus"][0].update(memory_mib=40960, mig=["3g.40gb", "1g.10gb"]),
            "hosts[0].gpus[0].mig: the layout needs 50 GB of memory, more than the GPU's 40 GB",
        ),
        (lambda c: c[0]["gpus"][0].update(mig="1g.10gb"), "hosts[0].gpus[0].mig: must be a list"),
        (lambda c: c[0]["gpus"][0].pop("model"), "hosts[0].gpus[0].model: is required"),
        (lambda c: c[0]["gpus"][0].update(memory_mib=-1), "hosts[0].gpus[0].memory_mib: must be"),
        (
            lambda c: c[0]["gpus"][0].update(gpu_count=1),
            "hosts[0].gpus[0]: unknown key 'gpu_count'",
        ),
        (lambda c: c[1].pop("cpu_milli"), "hosts[1].cpu_milli: is required"),
        (lambda c: c[1].update(name="bad name"), "hosts[1].name: must be a host name"),
        (lambda c: c[1].update(name="node1"), "hosts[1].name: 'node1' is declared twice"),
        (lambda c: c[1].update(gpus="A100"), "hosts[1].gpus: must be a list"),
        (lambda c: c.append("node3"), "hosts[2]: must be a dict"),
        (lambda c: c[0]["gpus"].append(7), "hosts[0].gpus[2]: must be a dict"),
        (
            lambda c: c[0]["gpus"][1].update(uuids=["GPU-x", "GPU-y"]),
            "hosts[0].gpus[1].uuids: only the static backend takes real uuids",
        ),
    ],
)
def test_validation_names_the_key(mutate, message):
    with pytest.raises(ConfigError) as e:
        discover("simulated", _with(mutate))
    assert message in str(e.value)
    assert e.value.key == message.split(": ")[0]  # the setting, for whoever reports it


def test_static_uuid_count_must_match():
    cfg = [
        {
            "name": "n",
            "cpu_milli": 1,
            "memory_mib": 1,
            "gpus": [{"model": A100, "memory_mib": 81920, "count": 2, "uuids": ["GPU-a"]}],
        }
    ]
    with pytest.raises(ConfigError, match=r"hosts\[0\]\.gpus\[0\]\.uuids: must be a list of 2"):
        discover("static", cfg)


@pytest.mark.parametrize("bad", [None, {"name": "x"}, "node1"])
def test_hosts_must_be_a_list(bad):
    with pytest.raises(ConfigError, match="hosts"):
        discover("simulated", bad)


def test_empty_mig_layout_means_mig_enabled_without_instances():
    cfg = [
        {
            "name": "n",
            "cpu_milli": 1,
            "memory_mib": 1,
            "gpus": [{"model": A100, "memory_mib": 81920, "mig": []}],
        }
    ]
    (gpu,) = discover("simulated", cfg).gpus()
    assert gpu.mig_mode is MigMode.ENABLED and gpu.mig_instances == ()


def test_eight_slice_profile_refused_on_a_seven_slice_gpu():
    cfg = [
        {
            "name": "n",
            "cpu_milli": 1,
            "memory_mib": 1,
            "gpus": [{"model": A100, "memory_mib": 81920, "mig": ["8g.80gb"]}],
        }
    ]
    with pytest.raises(ConfigError, match="uses 8 compute slices, more than the GPU's 7"):
        discover("simulated", cfg)
