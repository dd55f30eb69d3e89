"""Fixture: a real Slurm with several nodes on one machine (``slurm_nodes``, session).

Debian's slurmd is not built for several daemons per host (``--enable-multiple-slurmd``),
so each node's slurmd runs in a UTS namespace of its own (``unshare --uts``) whose host
name is the node's: slurmd finds its node by host name, listens on the ``Port=`` of its
``NodeName`` line, and keeps its spool, pid and log apart (``%n`` in slurm.conf). All nodes
share this machine's CPUs and memory (each declares all of it) and have their own fake GPU
devices. Everything else is as in ``slurm.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.markers import require
from tests.harness.ports import free_ports
from tests.harness.slurm import (
    A100,
    START_TIMEOUT,
    FakeGPU,
    Node,
    Partition,
    SlurmCluster,
    _make_device,
    _node_hardware,
    _spawn,
    _start_munge,
    _wait_for,
    base_conf,
    client_env,
    gres_lines,
    parse_scontrol_line,
    running_cluster,
)

NODE_NAMES = ("gsn1", "gsn2")  # Slurm writes a job on both as "gsn[1-2]"


def _node_gpus(devdir: Path, node: str, first_minor: int) -> list[FakeGPU]:
    """Per node: one MIG-like 1g.10gb instance and one whole A100, also sharded 8 ways (a
    job holding the A100 leaves no shard of it, and the other way round)."""
    gpus = []
    for i, (gtype, extra) in enumerate((("1g.10gb", ()), ("a100", (("shard", 8),)))):
        path = devdir / f"{node}-nvidia{i}"
        _make_device(path, first_minor + i)
        gpus.append(FakeGPU("gpu", gtype, path, extra))
    return gpus


def node_hosts(names: tuple[str, ...] = NODE_NAMES) -> list[dict[str, Any]]:
    """The nodes as the service's inventory, named after them."""
    return [
        {
            "name": name,
            "cpu_milli": 32000,
            "memory_mib": 256000,
            "gpus": [
                {"model": A100, "memory_mib": 81920, "mig": ["1g.10gb"]},
                {"model": A100, "memory_mib": 81920, "count": 1},
            ],
        }
        for name in names
    ]


def start_nodes(
    root: Path,
    names: tuple[str, ...] = NODE_NAMES,
    partitions: dict[str, tuple[str, ...]] | None = None,
) -> SlurmCluster:
    """The cluster of ``names``; ``partitions``: name -> its nodes, the first the default
    (default: one partition ``batch`` of every node)."""
    require("slurm", "starts a Slurm cluster")
    partitions = partitions or {"batch": names}
    host, hw = _node_hardware()
    hardware = " ".join(f"{k}={v}" for k, v in hw.items())
    for sub in ("state", "spool", "log", "run", "jobs", "dev"):
        (root / sub).mkdir()
    ctld_port, *node_ports = free_ports(1 + len(names))
    nodes, gres = [], ["AutoDetect=off"]
    all_gpus: list[FakeGPU] = []
    for i, name in enumerate(names):
        gpus = _node_gpus(root / "dev", name, 2 * i)
        all_gpus += gpus
        gres += gres_lines(name, gpus)
        (root / "spool" / name).mkdir()
        nodes.append(
            Node(
                name,
                int(hw["CPUs"]),
                int(hw["RealMemory"]),
                hardware,
                "gpu:1g.10gb:1,gpu:a100:1,shard:8",
            )
        )
    node_lines = "\n".join(
        f"NodeName={n.name} NodeHostname={n.name} NodeAddr=127.0.0.1 Port={port} "
        f"{n.hardware} Gres={n.gres} State=UNKNOWN"
        for n, port in zip(nodes, node_ports, strict=True)
    )
    partition_lines = "".join(
        f"PartitionName={name} Nodes={','.join(members)} Default={'YES' if i == 0 else 'NO'} "
        "MaxTime=INFINITE State=UP\n"
        for i, (name, members) in enumerate(partitions.items())
    )
    (root / "slurm.conf").write_text(
        base_conf(root, host, ctld_port, None) + node_lines + "\n" + partition_lines
    )
    (root / "gres.conf").write_text("\n".join(gres) + "\n")

    env = client_env(root)
    cluster = SlurmCluster(
        root=root,
        env=env,
        node=nodes[0],
        partitions={
            name: Partition(name, priority_tier=1, default=i == 0)
            for i, name in enumerate(partitions)
        },
        gpus=all_gpus,
        ports=(ctld_port, *node_ports),
        nodes=nodes,
    )
    cluster._procs.append(_start_munge(root, env))
    _wait_for(
        lambda: (root / "munge" / "run" / "munge.socket").exists(), 20, "munged socket", cluster
    )
    cluster._procs.append(_spawn(["slurmctld", "-D", "-c"], env, root / "log" / "slurmctld.out"))
    for node in nodes:
        argv = ["unshare", "--uts", "sh", "-c", f"hostname {node.name} && exec slurmd -D"]
        cluster._procs.append(_spawn(argv, env, root / "log" / f"slurmd.{node.name}.out"))

    def all_idle() -> bool:
        proc = cluster.run("scontrol", "show", "node", "-o", check=False)
        states = [parse_scontrol_line(line).get("State", "") for line in proc.stdout.splitlines()]
        return len(states) == len(nodes) and all(
            s.startswith("IDLE") and "NOT_RESPONDING" not in s for s in states
        )

    _wait_for(all_idle, START_TIMEOUT, f"nodes {', '.join(names)} IDLE", cluster)
    return cluster


@pytest.fixture(scope="session")
def slurm_nodes_cluster() -> Iterator[SlurmCluster]:
    with running_cluster(start_nodes, "gpuslice-slurm-nodes-", ("unshare",)) as cluster:
        yield cluster


BURST_NODES = ("gsb1", "gsb2")
# gsb1 is this site's partition, gsb2 the burst partition (in production, a cloud's nodes)
BURST_PARTITIONS = {"batch": ("gsb1",), "cloud": ("gsb2",)}


def _start_burst(root: Path) -> SlurmCluster:
    return start_nodes(root, BURST_NODES, BURST_PARTITIONS)


@pytest.fixture(scope="session")
def slurm_burst_cluster() -> Iterator[SlurmCluster]:
    """Two nodes in two partitions: ``batch`` (gsb1) and ``cloud`` (gsb2)."""
    with running_cluster(_start_burst, "gpuslice-slurm-burst-", ("unshare",)) as cluster:
        yield cluster


@pytest.fixture
def slurm_burst(slurm_burst_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    slurm_burst_cluster.cancel_all()
    yield slurm_burst_cluster
    slurm_burst_cluster.cancel_all()


@pytest.fixture
def slurm_nodes(slurm_nodes_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The multi-node cluster, with every job cancelled before and after the test."""
    slurm_nodes_cluster.cancel_all()
    yield slurm_nodes_cluster
    slurm_nodes_cluster.cancel_all()
