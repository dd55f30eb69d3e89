"""Fixture: a real single-node Slurm (slurmctld + slurmd + munged) in a temp dir.

``slurm_cluster`` (session) starts it once; ``slurm`` (function) hands out the same
cluster and cancels every job the test left behind, so one test's requeued or still
running job cannot hold the only ``1g.10gb`` device while the next test runs.

Why the configuration looks the way it does (Debian 12's slurm-wlm 22.05, run as root
inside a container/VM without systemd):

* Everything (munge socket and key, state, spool, logs, pid files, slurm.conf,
  gres.conf) lives in one temp dir, ports are picked at random and the config is passed
  with ``SLURM_CONF``: several test sessions (other engineers, CI retries) can run a
  cluster on the same machine at once without touching /etc/slurm or /run/munge.
* ``munged --force``: munged refuses to run as root or with a key under a
  world-writable tree (/tmp) unless forced. Slurm finds our munged through
  ``AuthInfo=socket=...``, which both auth/munge and cred/munge read.
* ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none``: the cgroup plugins
  need a cgroup hierarchy slurmd may write to (and a cgroup.conf matching the host's v1/v2
  layout); CI containers usually mount /sys/fs/cgroup read-only or delegate nothing, so
  we track job processes through /proc parentage instead. Consequence: devices are
  *not* fenced -- a job can open a fake device it was not given; only the environment
  (``CUDA_VISIBLE_DEVICES``, ``SLURM_JOB_GPUS``) and the scheduler's bookkeeping say
  which device a job holds, which is exactly what the tests check.
* No slurmdbd: 22.05 refuses to start (fatal) when ``AccountingStorageTRES`` lists
  ``gres/gpu`` without slurmdbd, so a job's ``TRES=`` line shows only cpu/mem/node;
  the gres a job holds is visible in ``TresPerNode``, ``JOB_GRES`` and ``GRES=...(IDX:n)``
  of ``scontrol show job -d``.
* ``DefMemPerCPU``: with ``CR_Core_Memory`` and no default, every job asks for all of the
  node's memory and jobs serialise on memory instead of on the resource under test.
* GPUs are fake: character devices made with mknod (major 195, like /dev/nvidiaN) in
  the temp dir, or plain files where mknod is not permitted. With task/none slurmd only
  needs the paths to exist.
* ``KillWait=5``: cancel/preempt escalates from SIGTERM to SIGKILL quickly so teardown
  and requeue tests are fast. A requeued job is held back ~2 minutes (``BeginTime``) by
  slurmctld before it may start again; tests must not wait for the restart.
* What 22.05 tells a job about its device (observed here): ``gpu`` jobs get
  ``CUDA_VISIBLE_DEVICES`` and ``SLURM_JOB_GPUS``; ``shard`` jobs only
  ``GPU_DEVICE_ORDINAL`` and ``SLURM_SHARDS_ON_NODE`` (no ``CUDA_VISIBLE_DEVICES``);
  ``mps`` jobs get ``CUDA_VISIBLE_DEVICES`` but ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=0``
  whatever they asked for, so tests only check that MPS is *allocated*.
* The ``mpi/pmix`` errors in the logs are harmless: Debian builds the plugin but the
  PMIx library is not installed; ``MpiDefault=none``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.harness.engines import need
from tests.harness.markers import require
from tests.harness.ports import free_ports

SLURM_BINARIES = ("slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "munged")
# A marker in every daemon's (and therefore every job's) environment, so teardown can
# find exactly the processes this cluster started, whatever they daemonised into.
MARKER_ENV = "GPUSLICE_SLURM_HARNESS"
START_TIMEOUT = 60.0


@dataclass(frozen=True)
class FakeGPU:
    """A gres.conf line backed by a fake device file."""

    name: str  # gres name: gpu
    type: str  # gres type: a100, 1g.10gb
    file: Path
    extra: tuple[tuple[str, int], ...] = ()  # (gres name, count) sharing this device


@dataclass(frozen=True)
class Partition:
    name: str
    priority_tier: int
    default: bool = False


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    real_memory: int
    hardware: str  # the slurmd -C fields of the NodeName line
    gres: str  # the Gres= of slurm.conf, e.g. "gpu:a100:2,gpu:1g.10gb:1,shard:8,mps:100"


@dataclass
class SlurmCluster:
    root: Path
    env: dict[str, str]
    node: Node
    partitions: dict[str, Partition]
    gpus: list[FakeGPU]
    ports: tuple[int, ...]
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    # every node (several for the multi-node cluster of slurm_nodes.py; ``node`` is the first)
    nodes: list[Node] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def run(
        self, *argv: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster (``input``: its stdin)."""
        return subprocess.run(
            argv,
            env=self.env,
            check=check,
            capture_output=True,
            text=True,
            timeout=30,
            input=input,
        )

    def sbatch(self, script: str, *args: str) -> str:
        """Submit ``script`` (a shebang is added when missing); return the job id.

        Output goes to ``output_path(job_id)`` unless ``args`` say otherwise (sbatch lets
        a later option override an earlier one).
        """
        if not script.startswith("#!"):
            script = "#!/bin/bash\n" + script
        jobs = self.root / "jobs"
        fd, path = tempfile.mkstemp(dir=jobs, suffix=".sh")
        with os.fdopen(fd, "w") as fh:
            fh.write(script)
        argv = [
            "sbatch",
            "--parsable",
            f"--chdir={jobs}",
            f"--output={jobs}/%j.out",
            *args,
            path,
        ]
        proc = self.run(*argv, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)} failed: {proc.stderr.strip()}")
        # --parsable prints "jobid" or "jobid;cluster"
        return proc.stdout.strip().split(";")[0]

    def output_path(self, job_id: str) -> Path:
        return self.root / "jobs" / f"{job_id}.out"

    def job_info(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o -d`` as a dict (detail keys like GRES= included)."""
        proc = self.run("scontrol", "show", "job", "-o", "-d", str(job_id))
        return parse_scontrol_line(proc.stdout.strip())

    def wait_state(
        self, job_id: str, states: str | Iterable[str], timeout: float = 30.0
    ) -> dict[str, str]:
        """Poll until the job's state is one of ``states``; return its info."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job_info(job_id)
            if info.get("JobState") in wanted:
                return info
            time.sleep(0.2)
        raise TimeoutError(
            f"job {job_id} not in {sorted(wanted)} after {timeout}s: "
            f"JobState={info.get('JobState')} Reason={info.get('Reason')}\n" + self.log_tail()
        )

    def active_jobs(self) -> list[str]:
        proc = self.run("squeue", "--noheader", "--format=%i")
        return proc.stdout.split()

    def cancel_all(self, timeout: float = 30.0) -> None:
        """Cancel every job and wait until none is left in the queue."""
        deadline = time.monotonic() + timeout
        while jobs := self.active_jobs():
            self.run("scancel", *jobs, check=False)
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs {jobs} survived scancel for {timeout}s")
            time.sleep(0.2)

    def log_tail(self, lines: int = 30) -> str:
        out = []
        logs = self.root / "log"
        for path in [*sorted(logs.glob("slurm*.log")), *sorted(logs.glob("*.out"))]:
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(out)


_PAIR = re.compile(r"(\S+?)=(.*?)(?=\s+[^\s=]+=|\s*$)")


def parse_scontrol_line(line: str) -> dict[str, str]:
    """Parse one ``scontrol -o`` record; values may contain '=' and (Command) spaces."""
    return {key: value for key, value in _PAIR.findall(line)}


def _node_hardware() -> tuple[str, dict[str, str]]:
    """This host's short name and hardware, as ``slurmd -C`` reports it (CPUs, layout,
    RealMemory): declaring anything else makes slurmd register with a mismatch."""
    host = socket.gethostname().split(".")[0]
    out = subprocess.run(
        ["slurmd", "-C"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    fields = parse_scontrol_line(out.splitlines()[0])
    keep = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    return host, {k: fields[k] for k in keep if k in fields}


def _make_device(path: Path, minor: int) -> None:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
    except PermissionError:
        # unprivileged containers forbid mknod; with task/none a plain file does as well
        path.write_bytes(b"")


def _fake_gpus(devdir: Path) -> list[FakeGPU]:
    """Three fake devices: a whole GPU that can also be sharded, one MIG-like slice (only
    one, so two jobs asking for it must serialise) and a whole GPU that also offers MPS."""
    devdir.mkdir()
    layout = [
        ("a100", (("shard", 8),)),
        ("1g.10gb", ()),
        ("a100", (("mps", 100),)),
    ]
    gpus = []
    for minor, (gtype, extra) in enumerate(layout):
        path = devdir / f"nvidia{minor}"
        _make_device(path, minor)
        gpus.append(FakeGPU("gpu", gtype, path, extra))
    return gpus


def _node_gres(gpus: list[FakeGPU]) -> str:
    counts: dict[str, int] = {}
    for gpu in gpus:
        key = f"{gpu.name}:{gpu.type}"
        counts[key] = counts.get(key, 0) + 1
        for name, count in gpu.extra:
            counts[name] = counts.get(name, 0) + count
    return ",".join(f"{key}:{n}" for key, n in counts.items())


def base_conf(root: Path, controller: str, ctld_port: int, slurmd_port: int | None) -> str:
    """slurm.conf without nodes and partitions. ``slurmd_port`` None: several slurmd on
    this machine, each with its node's ``Port=`` and its own spool, pid and log (``%n``)."""
    one = slurmd_port is not None
    spool = f"{root}/spool" if one else f"{root}/spool/%n"
    suffix = "" if one else ".%n"
    return f"""\
ClusterName=gpuslicetest
SlurmctldHost={controller}(127.0.0.1)
SlurmctldPort={ctld_port}
{f"SlurmdPort={slurmd_port}" if one else ""}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/run/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={spool}
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd{suffix}.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd{suffix}.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=256
ReturnToService=2
KillWait=5
MinJobAge=600
SchedulerParameters=bf_interval=1
GresTypes=gpu,shard,mps
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
"""


def gres_lines(node: str, gpus: list[FakeGPU]) -> list[str]:
    lines = []
    for gpu in gpus:
        lines.append(f"NodeName={node} Name={gpu.name} Type={gpu.type} File={gpu.file}")
        for name, count in gpu.extra:
            lines.append(f"NodeName={node} Name={name} Count={count} File={gpu.file}")
    return lines


def _write_configs(
    root: Path, node: Node, partitions: list[Partition], gpus: list[FakeGPU], ports: tuple[int, int]
) -> None:
    ctld_port, slurmd_port = ports
    part_lines = "\n".join(
        f"PartitionName={p.name} Nodes={node.name} PriorityTier={p.priority_tier} "
        f"Default={'YES' if p.default else 'NO'} MaxTime=INFINITE State=UP"
        for p in partitions
    )
    (root / "slurm.conf").write_text(
        base_conf(root, node.name, ctld_port, slurmd_port)
        + f"NodeName={node.name} NodeAddr=127.0.0.1 {node.hardware} Gres={node.gres} "
        + f"State=UNKNOWN\n{part_lines}\n"
    )
    lines = ["AutoDetect=off", *gres_lines(node.name, gpus)]
    (root / "gres.conf").write_text("\n".join(lines) + "\n")


def _start_munge(root: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    etc, run = root / "munge" / "etc", root / "munge" / "run"
    etc.mkdir(parents=True, mode=0o700)
    run.mkdir(parents=True, mode=0o755)  # clients need to reach the socket
    key = etc / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    return _spawn(
        [
            "munged",
            "--foreground",
            "--force",
            f"--socket={run}/munge.socket",
            f"--key-file={key}",
            f"--pid-file={run}/munged.pid",
            f"--seed-file={etc}/munged.seed",
            f"--log-file={root}/log/munged.log",
        ],
        env,
        root / "log" / "munged.out",
    )


def _spawn(argv: list[str], env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    # own session: a Ctrl-C in the terminal reaches pytest, which then tears down in order
    with open(out, "wb") as fh:
        return subprocess.Popen(
            argv, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )


def _wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, cluster: SlurmCluster
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in cluster._procs:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{proc.args!r} exited ({proc.returncode}) while waiting for {what}\n"
                    + cluster.log_tail()
                )
        if predicate():
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what} not reached after {timeout}s\n" + cluster.log_tail())


def start_cluster(root: Path) -> SlurmCluster:
    require("slurm", "starts a Slurm cluster")
    host, hw = _node_hardware()
    for sub in ("state", "spool", "log", "run", "jobs"):
        (root / sub).mkdir()
    gpus = _fake_gpus(root / "dev")
    node = Node(
        name=host,
        cpus=int(hw["CPUs"]),
        real_memory=int(hw["RealMemory"]),
        hardware=" ".join(f"{k}={v}" for k, v in hw.items()),
        gres=_node_gres(gpus),
    )
    partitions = [
        Partition("interactive", priority_tier=10, default=True),
        Partition("preemptible", priority_tier=1),
    ]
    ports = tuple(free_ports(2))
    _write_configs(root, node, partitions, gpus, ports)

    env = client_env(root)
    cluster = SlurmCluster(
        root=root,
        env=env,
        node=node,
        partitions={p.name: p for p in partitions},
        gpus=gpus,
        ports=ports,
    )
    log = root / "log"
    cluster._procs.append(_start_munge(root, env))
    _wait_for(
        lambda: (root / "munge" / "run" / "munge.socket").exists(), 20, "munged socket", cluster
    )
    for argv, name in (
        (["slurmctld", "-D", "-c"], "slurmctld.out"),  # -c: no state to recover
        (["slurmd", "-D", "-N", node.name], "slurmd.out"),
    ):
        cluster._procs.append(_spawn(argv, env, log / name))

    def node_idle() -> bool:
        proc = cluster.run("scontrol", "show", "node", "-o", node.name, check=False)
        if proc.returncode != 0:
            return False
        state = parse_scontrol_line(proc.stdout.strip()).get("State", "")
        return state.startswith("IDLE") and "NOT_RESPONDING" not in state

    _wait_for(node_idle, START_TIMEOUT, f"node {node.name} IDLE", cluster)
    return cluster


def _harness_processes(root: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARKER_ENV) == str(root):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def stop_cluster(cluster: SlurmCluster) -> None:
    # teardown goes on to kill whatever is left even if slurmctld is unresponsive
    with contextlib.suppress(Exception):
        cluster.cancel_all(timeout=15)
    # slurmd first: it talks to slurmctld on the way down; munged last
    for proc in reversed(cluster._procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
    # slurmstepd and job scripts daemonise away from our children: find them by marker
    leftovers = _harness_processes(cluster.root)
    for proc in leftovers:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(leftovers, timeout=5)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    with running_cluster(start_cluster, "gpuslice-slurm-") as cluster:
        yield cluster


@contextlib.contextmanager
def running_cluster(
    start: Callable[[Path], SlurmCluster], prefix: str, binaries: Iterable[str] = ()
) -> Iterator[SlurmCluster]:
    """A cluster started by ``start`` in a fresh temp dir, stopped and removed after."""
    missing = [b for b in (*SLURM_BINARIES, *binaries) if shutil.which(b) is None]
    need(not missing, f"Slurm (slurmctld/slurmd) [missing: {', '.join(missing)}]")
    need(os.geteuid() == 0, "root (slurmd must run as root to launch jobs)")
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    cluster = None
    try:
        cluster = start(root)
        yield cluster
    finally:
        if cluster is not None:
            stop_cluster(cluster)
        else:  # half started: whatever did start carries the marker
            for proc in _harness_processes(root):
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
        shutil.rmtree(root, ignore_errors=True)


def client_env(root: Path) -> dict[str, str]:
    """The environment of this cluster's commands and daemons. Slurm variables of the
    caller (pytest run inside a job, or a developer's SBATCH_* defaults) would steer our
    client commands and leak into jobs (--export=ALL)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_"))
    }
    env.update({"SLURM_CONF": str(root / "slurm.conf"), MARKER_ENV: str(root)})
    return env


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session cluster, with every job cancelled after the test."""
    slurm_cluster.cancel_all()
    yield slurm_cluster
    slurm_cluster.cancel_all()


A100 = "NVIDIA A100-SXM4-80GB"


def slurm_hosts(node: str) -> list[dict[str, Any]]:
    """The fixture's node as gpuslice inventory: its one 1g.10gb instance and two A100s.
    The host is named after the Slurm node: servers and jobs are pinned to it."""
    return [
        {
            "name": node,
            "cpu_milli": 32000,
            "memory_mib": 256000,
            "gpus": [
                {"model": A100, "memory_mib": 81920, "mig": ["1g.10gb"]},
                {"model": A100, "memory_mib": 81920, "count": 2},
            ],
        }
    ]


# Profiles the fixture's gres can hold: a MIG instance and a shard-backed share.
PROFILES = [
    {"name": "mig-1g.10gb", "kind": "mig", "mig_profile": "1g.10gb", "idle_timeout": 600},
    {"name": "share-250", "kind": "share", "gpu_milli": 250, "gpu_memory_mib": 20480},
]
