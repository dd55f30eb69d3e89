"""``gpu_backend = "slurm"``: the hosts and GPUs come from Slurm's nodes and gres.

Units on recorded ``sinfo --json`` nodes (Slurm 22.05's fields), and the real single-node
test cluster read by ``sinfo``: its inventory is what the tests otherwise write by hand."""

from __future__ import annotations

import pytest

from gpuslice.gpu import discover
from gpuslice_hub.errors import ConfigError
from gpuslice_hub.slurminventory import hosts_from_nodes, model_memory_mib, read_slurm_hosts
from gpuslice_spawner.launchers.slurm import SlurmGres
from tests.harness.slurm import A100, SlurmCluster, slurm_hosts

H100 = "NVIDIA H100 80GB HBM3"
GRES = SlurmGres(gpu_types={A100: "a100", H100: "h100"})


def node(name: str, gres: str, cpus: int = 64, memory: int = 512000) -> dict:
    return {"name": name, "cpus": cpus, "real_memory": memory, "gres": gres}


def test_typed_gpus_mig_instances_and_shards_become_hosts():
    nodes = [
        node("gpu02", "gpu:h100:4(S:0-1),shard:h100:32(S:0-1)"),
        # three GPUs in MIG mode next to two whole ones: the instances need three GPUs
        node("gpu01", "gpu:a100:2(S:0),gpu:3g.40gb:2(S:0),gpu:2g.20gb:3(S:1),gpu:1g.10gb:4(S:1)"),
        node("login", "(null)"),  # no GPUs: not a host of the ledger
    ]
    hosts = hosts_from_nodes(nodes, GRES, {})
    assert [h["name"] for h in hosts] == ["gpu01", "gpu02"]
    a100 = {"model": A100, "memory_mib": 81920}
    assert hosts[0] == {
        "name": "gpu01",
        "cpu_milli": 64000,
        "memory_mib": 512000,
        "gpus": [
            {**a100, "count": 2},
            {**a100, "mig": ["3g.40gb", "3g.40gb"]},
            {**a100, "mig": ["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"]},
            {**a100, "mig": ["1g.10gb", "1g.10gb", "1g.10gb"]},
        ],
    }
    assert hosts[1]["gpus"] == [{"model": H100, "memory_mib": 81920, "count": 4}]
    # what the static backend makes of it: the counts Slurm has
    inventory = discover("static", hosts)
    instances = [m.profile for g in inventory.hosts[0].gpus for m in g.mig_instances]
    assert sorted(instances) == ["1g.10gb"] * 4 + ["2g.20gb"] * 3 + ["3g.40gb"] * 2


@pytest.mark.parametrize(
    ("gres", "words"),
    [
        ("gpu:2(S:0)", "untyped GPUs (gpu:2)"),
        ("gpu:v100:2(S:0)", "gres type 'v100' is no model's"),
    ],
)
def test_gpus_the_ledger_could_not_describe_are_refused_naming_the_node(gres, words):
    with pytest.raises(ConfigError) as e:
        hosts_from_nodes([node("gpu07", gres)], GRES, {})
    assert e.value.key == "gpu_backend" and "gpu07" in str(e.value) and words in str(e.value)


def test_mig_instances_need_a_model_to_sit_on():
    with pytest.raises(ConfigError, match="MIG instances but its GPUs' model"):
        hosts_from_nodes([node("gpu03", "gpu:1g.10gb:7")], GRES, {})
    one = SlurmGres(gpu_types={A100: "a100"})
    (host,) = hosts_from_nodes([node("gpu03", "gpu:1g.10gb:7")], one, {})
    assert host["gpus"] == [{"model": A100, "memory_mib": 81920, "mig": ["1g.10gb"] * 7}]


def test_a_models_memory_comes_from_its_name_or_the_setting():
    assert model_memory_mib("NVIDIA A100-PCIE-40GB", {}) == 40960
    assert model_memory_mib("NVIDIA L40S", {"NVIDIA L40S": 46068}) == 46068
    with pytest.raises(ConfigError, match="gpu_memory_mib"):
        model_memory_mib("NVIDIA L40S", {})


@pytest.mark.slurm
def test_the_test_clusters_inventory_read_from_slurm_is_the_hand_written_one(
    slurm: SlurmCluster,
):
    (host,) = read_slurm_hosts(SlurmGres(gpu_types={A100: "a100"}), {}, env=slurm.env)
    (written,) = slurm_hosts(slurm.node.name)
    assert host["name"] == written["name"] == slurm.node.name
    assert (host["cpu_milli"], host["memory_mib"]) == (
        slurm.node.cpus * 1000,
        slurm.node.real_memory,
    )
    key = lambda g: (g["model"], g.get("count", 1), g.get("mig", []))  # noqa: E731
    assert sorted(host["gpus"], key=key) == sorted(written["gpus"], key=key)


@pytest.mark.slurm
def test_the_service_reads_its_hosts_from_slurm_and_refuses_hand_written_ones(
    slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch
):
    from traitlets.config import Config

    from gpuslice_hub.app import GPUSliceService

    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    config = Config()
    config.GPUSliceService.gpu_backend = "slurm"
    config.SlurmGresConfig.gpu_gres_types = {A100: "a100"}
    inventory = GPUSliceService(config=config).discover()
    (host,) = inventory.hosts
    assert host.name == slurm.node.name and len(host.gpus) == 3
    # named for where it came from (the start line, /api/health and the admin panel say it)
    assert inventory.backend == "slurm" and not inventory.simulated
    config.GPUSliceService.hosts = slurm_hosts(slurm.node.name)
    with pytest.raises(ConfigError) as e:
        GPUSliceService(config=config).discover()
    assert e.value.key == "hosts" and "read from Slurm" in str(e.value)


def test_a_node_whose_gpus_are_split_alike_is_packed_on_as_few_gpus():
    """First-fit made three GPUs of two A100s each split 3g.40gb + 2g.20gb + 1g.10gb x 2 (the
    two 3g instances filled the first one's memory), and the node's fourth, whole, GPU was
    lost; Slurm's inventory now packs as Kubernetes' does (migpack)."""
    from collections import Counter

    from gpuslice_hub.slurminventory import _mig_gpus

    model = "NVIDIA A100-SXM4-80GB"
    instances = Counter({"3g.40gb": 2, "2g.20gb": 2, "1g.10gb": 4})
    gpus = _mig_gpus("gsn1", instances, [{"model": model}], {}, {})
    assert len(gpus) == 2
    assert sorted(Counter(p for g in gpus for p in g["mig"]).items()) == sorted(instances.items())
