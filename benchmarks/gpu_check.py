"""Check NVML discovery and per-process attribution on a real NVIDIA GPU.

Everything in the test suite runs against the fake driver (tests/fakes/fake_pynvml.py),
because CI has no GPU. This script is the other half: on a machine with a GPU and the
real ``pynvml`` (nvidia-ml-py), it runs the product's own code and compares it with what
the driver and ``nvidia-smi`` say, and it records how the real driver behaves where the
fake imitates it (errors, timestamps, GPM), so the fake can be kept honest.

What it does, in one run of about a minute:

1. **Discovery**: ``discover_nvml()`` against ``nvidia-smi --query-gpu``: the same GPUs,
   uuids, names, memory and MIG mode.
2. **Attribution on a shared GPU**: this process plays the Jupyter server. It starts a
   "kernel" whose child (a DataLoader-like worker) takes GPU memory and runs matrix
   products for a while, then idles while holding the memory; two processes of the
   server's user that hold a little memory and compute nothing: one started from its
   "terminal" (a child) and one re-parented away ("nohup"); and a "foreign" process of
   another user (uid 65534), outside the server's tree, that keeps the GPU busy all
   along. The product's sampler (``ActivitySampler`` + ``NvmlActivitySource`` +
   ``Attributor``) ticks every 2 s and ``IdleTracker`` is fed as the server extension
   feeds it. Expected: the kernel busy then idle (while the GPU stays busy with the
   foreign work), the worker's memory counted for the kernel as nvidia-smi counts it,
   the terminal and nohup processes counted for the server, the foreign process never
   counted for anyone; the job runner's attributor (``count_same_user=False``) counts
   none of them as the job's.
3. **Driver facts** the fake imitates: ``nvmlDeviceGetProcessUtilization`` with no new
   samples, its timestamps' unit, GPM support, and the whole GPU's GPM utilization read by the
   function the MIG path reads an instance's with (``gpm_graphics_util``).
4. **Cost** of one real sampling tick (median, p95).

It never changes a GPU setting (MIG mode included). Needs ``torch`` with CUDA for the
load processes; the product code needs only ``psutil`` and ``pynvml``.

Run:  PYTHONPATH=server_ext python3 benchmarks/gpu_check.py [--json OUT.json]
Exit status: 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuslice.activity import ActivitySampler, Attributor, IdleTracker, NvmlActivitySource
from gpuslice.activity.nvml_source import gpm_graphics_util
from gpuslice.activity.samples import SourceTick
from gpuslice.gpu.nvml_discovery import as_str, default_nvml_module, discover_nvml

TICK = 2.0
BUSY = 20.0  # seconds the kernel's worker computes
IDLE = 20.0  # seconds it then holds its memory without computing
WORKER_MIB = 4096
NOBODY = 65534

# One program for every load process: take memory, then compute and/or idle on a
# timetable; writes "<phase> <time>" lines to its log so the checker knows when.
LOAD = r"""
import os, sys, time, torch
mib, busy, idle, log = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
def mark(p, value=None):
    with open(log, "a") as f:
        f.write(f"{p} {time.time() if value is None else value}\n")
mark("pid", os.getpid())
hold = torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda")
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
mark("ready")
while not open(log).read().count("go"):
    time.sleep(0.05)
mark("busy")
end = time.time() + busy
while time.time() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
mark("idle")
time.sleep(idle)
mark("done")
"""

# The kernel: a plain process whose child is the GPU process (as a DataLoader worker is).
KERNEL = r"""
import subprocess, sys
sys.exit(subprocess.call([sys.executable, "-c", sys.argv[1], *sys.argv[2:]]))
"""

# Starts a load in its own session and exits once it is ready (or with its status if it
# failed), so the load is re-parented away from this process's tree, as a process of
# another user, or one left behind by ``nohup … &``, is.
DETACH = r"""
import subprocess, sys, time
log = sys.argv[-1]
p = subprocess.Popen([sys.executable, "-c", *sys.argv[1:]], start_new_session=True)
while p.poll() is None and "ready" not in open(log).read():
    time.sleep(0.05)
sys.exit(p.returncode or 0)
"""


def nvidia_smi() -> list[dict[str, str]]:
    fields = "index,uuid,name,memory.total,mig.mode.current,driver_version"
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    keys = fields.split(",")
    return [
        dict(zip(keys, (v.strip() for v in line.split(",")), strict=True))
        for line in out.splitlines()
        if line.strip()
    ]


class Checks:
    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def check(self, name: str, ok: bool, detail: Any = "") -> bool:
        self.results.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}", flush=True)
        return bool(ok)

    @property
    def ok(self) -> bool:
        return all(r["ok"] for r in self.results)


def check_discovery(c: Checks, report: dict[str, Any]) -> None:
    smi = nvidia_smi()
    inv = discover_nvml()
    gpus = [g for h in inv.hosts for g in h.gpus]
    report["nvidia_smi"] = smi
    report["discovered"] = [
        {
            "index": g.index,
            "uuid": g.uuid,
            "model": g.model,
            "memory_mib": g.memory_mib,
            "mig_mode": g.mig_mode.value,
            "mig_instances": [i.profile for i in g.mig_instances],
        }
        for g in gpus
    ]
    c.check("discovery: GPU count", len(gpus) == len(smi), f"{len(gpus)} vs nvidia-smi {len(smi)}")
    c.check("discovery: not simulated", not inv.simulated)
    for g, s in zip(sorted(gpus, key=lambda g: g.index), smi, strict=False):
        c.check(f"discovery: GPU {g.index} uuid", g.uuid == s["uuid"], g.uuid)
        c.check(f"discovery: GPU {g.index} name", g.model == s["name"], g.model)
        c.check(
            f"discovery: GPU {g.index} memory (MiB)",
            g.memory_mib == int(s["memory.total"]),
            f"{g.memory_mib} vs nvidia-smi {s['memory.total']}",
        )
        smi_mig = s["mig.mode.current"].lower()
        want = {"enabled": "enabled", "disabled": "disabled"}.get(smi_mig, "unsupported")
        c.check(
            f"discovery: GPU {g.index} MIG mode",
            g.mig_mode.value == want,
            f"{g.mig_mode.value} vs nvidia-smi {s['mig.mode.current']!r}",
        )


def driver_facts(c: Checks, report: dict[str, Any]) -> None:
    nvml = default_nvml_module()
    nvml.nvmlInit()
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(0)
        facts: dict[str, Any] = {
            "driver": as_str(nvml.nvmlSystemGetDriverVersion()),
            "nvml": as_str(nvml.nvmlSystemGetNVMLVersion()),
            "pynvml_file": getattr(nvml, "__file__", "?"),
        }
        try:
            from importlib.metadata import version

            facts["nvidia_ml_py"] = version("nvidia-ml-py")
        except Exception as e:  # the check must go on without the version
            facts["nvidia_ml_py"] = repr(e)
        # Asking for samples newer than "now" must give none: the fake raises NotFound.
        now_us = int(time.time() * 1e6)
        try:
            got = nvml.nvmlDeviceGetProcessUtilization(h, now_us + 60_000_000)
            facts["process_util_future"] = f"returned {len(got)} samples"
        except nvml.NVMLError as e:
            facts["process_util_future"] = f"{type(e).__name__}: {e}"
        try:
            sup = nvml.nvmlGpmQueryDeviceSupport(h)
            facts["gpm_supported"] = bool(sup.isSupportedDevice)
        except Exception as e:
            facts["gpm_supported"] = repr(e)
        report["driver"] = facts
        print("driver facts:", json.dumps(facts), flush=True)
    finally:
        nvml.nvmlShutdown()


def gpm_full_gpu(nvml: Any, handle: Any, seconds: float) -> float | None:
    """Full-GPU GPM utilization over *seconds*, read by the MIG path's own function
    (``gpm_graphics_util``), so its use of pynvml's structures runs on the real driver."""
    s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    try:
        nvml.nvmlGpmSampleGet(handle, s1)
        time.sleep(seconds)
        nvml.nvmlGpmSampleGet(handle, s2)
        return gpm_graphics_util(nvml, s1, s2)
    finally:
        nvml.nvmlGpmSampleFree(s1)
        nvml.nvmlGpmSampleFree(s2)


class _Recording:
    """The real source, keeping its last raw tick so a second attributor can read it."""

    def __init__(self, source: NvmlActivitySource) -> None:
        self.source = source
        self.last: SourceTick | None = None
        self.costs: list[float] = []

    def open(self) -> None:
        self.source.open()

    def close(self) -> None:
        self.source.close()

    def sample(self) -> SourceTick:
        t0 = time.perf_counter()
        self.last = self.source.sample()
        self.costs.append(time.perf_counter() - t0)
        return self.last


def phases(log: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            name, _, ts = line.partition(" ")
            if ts:
                out.setdefault(name, float(ts))
    return out


def wait_for(pred: Any, deadline_s: float, what: str, procs: list[Any]) -> None:
    end = time.time() + deadline_s
    while not pred():
        dead = [(p.args[-1], p.returncode) for p in procs if p.poll()]
        if dead:
            raise RuntimeError(f"a load process exited while waiting for {what}: {dead}")
        if time.time() > end:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.1)


def smi_apps() -> dict[int, int]:
    """PID -> MiB used, as nvidia-smi reports the compute apps."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
    ).stdout
    apps = {}
    for line in out.splitlines():
        pid, _, mib = line.partition(",")
        if mib.strip().isdigit():
            apps[int(pid)] = int(mib)
    return apps


def pid_in(log: Path) -> int:
    return int(phases(log)["pid"])


def check_attribution(c: Checks, report: dict[str, Any]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpuslice-gpucheck-"))
    os.chmod(tmp, 0o777)
    logs = {n: tmp / f"{n}.log" for n in ("worker", "terminal", "nohup", "foreign")}
    for lg in logs.values():
        lg.touch()
    py = sys.executable
    env = dict(os.environ, HOME=str(tmp))
    total = BUSY + IDLE
    # The kernel's worker computes, then idles holding its memory.
    kernel = subprocess.Popen(
        [py, "-c", KERNEL, LOAD, str(WORKER_MIB), str(BUSY), str(IDLE), str(logs["worker"])],
        env=env,
    )
    # A process started from the server's terminal, and one of the server's user that
    # was re-parented away (nohup): both hold memory and compute nothing.
    idle_args = ["256", "0", str(total + 10)]
    terminal = subprocess.Popen([py, "-c", LOAD, *idle_args, str(logs["terminal"])], env=env)
    nohup = subprocess.Popen([py, "-c", DETACH, LOAD, *idle_args, str(logs["nohup"])], env=env)
    starters = [kernel, terminal, nohup]
    # Another user's process outside the server's tree keeps the GPU busy throughout.
    if os.getuid() == 0:
        os.chown(logs["foreign"], NOBODY, NOBODY)
        try:
            starters.append(
                subprocess.Popen(
                    [py, "-c", DETACH, LOAD, "512", str(total + 10), "0", str(logs["foreign"])],
                    env=env,
                    user=NOBODY,
                    group=NOBODY,
                )
            )
        except OSError as e:  # the interpreter may not be readable by another user
            c.check("attribution: a process of another user started", False, repr(e))
    else:
        del logs["foreign"]
    detached: list[int] = []
    try:
        wait_for(
            lambda: all("ready" in phases(lg) for lg in logs.values()),
            120,
            "the load processes",
            starters,
        )
        pids = {n: pid_in(lg) for n, lg in logs.items()}
        detached = [pids[n] for n in ("nohup", "foreign") if n in pids]
        source = _Recording(NvmlActivitySource())
        sampler = ActivitySampler(source, Attributor(server_pid=os.getpid()))
        # The job runner is its kernel's parent and counts nothing of its user outside that
        # tree; the kernel process stands in for the runner here.
        job_attributor = Attributor(server_pid=kernel.pid, count_same_user=False)
        tracker = IdleTracker(window=2 * TICK)
        for lg in logs.values():
            with open(lg, "a") as f:
                f.write("go 0\n")
        ticks: list[dict[str, Any]] = []
        end = time.time() + total + 2 * TICK
        next_tick = time.time()
        while time.time() < end:
            rep = sampler.tick({"k1": kernel.pid})
            k = rep.kernels["k1"]
            assert source.last is not None
            job_owners = job_attributor.resolve(
                [p.pid for p in source.last.processes], {"job": kernel.pid}
            )
            state = tracker.observe(rep.time, k.util, memory_bytes=k.memory_bytes)
            ticks.append(
                {
                    "t": rep.time,
                    "kernel_util": k.util,
                    "kernel_mib": None if k.memory_bytes is None else k.memory_bytes // 2**20,
                    "kernel_pids": list(k.pids),
                    "kernel_attribution": k.attribution.value,
                    "server_util": rep.server.util,
                    "server_pids": list(rep.server.pids),
                    "foreign_pids": list(rep.foreign_pids),
                    "device_util": [d.util for d in rep.devices],
                    "job_owners": {
                        n: job_owners[pid].kind for n, pid in pids.items() if pid in job_owners
                    },
                    "idle_seconds": state.idle_seconds,
                    "nvidia_smi_mib": smi_apps(),
                }
            )
            print("tick", json.dumps(ticks[-1]), flush=True)
            next_tick += TICK
            time.sleep(max(0.0, next_tick - time.time()))
        # The unit of NVML's sample timestamps (the fake uses microseconds since the epoch).
        seen_ts = max(g.last_seen_ts for g in source.source._gpus or ())
        report["last_sample_ts_minus_now_us_s"] = (seen_ts - time.time() * 1e6) / 1e6
        sampler.close()
        w = phases(logs["worker"])
        report["phases"] = w
        report["ticks"] = ticks
        worker_pid = next((pid for t in ticks for pid in t["kernel_pids"]), None)
        # Ticks well inside each phase: NVML's per-process samples trail by up to a second.
        busy = [t for t in ticks if w["busy"] + TICK <= t["t"] <= w["idle"] - 0.5]
        idle = [t for t in ticks if w["idle"] + 2 * TICK <= t["t"] <= w.get("done", end)]
        c.check("attribution: busy ticks", len(busy) >= 5, len(busy))
        c.check("attribution: idle ticks", len(idle) >= 5, len(idle))
        c.check(
            "attribution: the worker (kernel's child) is the kernel's GPU process",
            worker_pid is not None and worker_pid != kernel.pid,
            f"worker pid {worker_pid}, kernel pid {kernel.pid}",
        )
        c.check(
            "attribution: per-process figures on a full GPU",
            all(t["kernel_attribution"] == "per-process" for t in busy + idle),
        )
        bu = [t["kernel_util"] or 0 for t in busy]
        iu = [t["kernel_util"] for t in idle]
        c.check(
            "attribution: kernel busy while computing (min util > 20 %)",
            min(bu, default=0) > 20,
            bu,
        )
        c.check(
            "attribution: kernel idle while only holding memory (util 0)",
            all(u == 0 for u in iu),
            iu,
        )
        c.check(
            "attribution: the kernel's memory includes the worker's allocation",
            all((t["kernel_mib"] or 0) >= WORKER_MIB for t in busy + idle),
            sorted({t["kernel_mib"] for t in busy + idle}),
        )
        c.check(
            "attribution: the kernel's memory is what nvidia-smi gives its processes",
            all(
                t["kernel_mib"]
                == sum(t["nvidia_smi_mib"].get(p, -(2**40)) for p in t["kernel_pids"])
                for t in busy + idle
            ),
            [(t["kernel_mib"], t["nvidia_smi_mib"]) for t in busy[:1]],
        )
        both = busy + idle
        c.check(
            "attribution: a process started from the server's terminal counts for the server",
            all(pids["terminal"] in t["server_pids"] for t in both),
        )
        c.check(
            "attribution: a process of the server's user re-parented away counts for the server",
            all(pids["nohup"] in t["server_pids"] for t in both),
        )
        c.check(
            "attribution: the job runner's attributor counts neither as the job's",
            all(t["job_owners"].get(n) == "foreign" for t in both for n in ("terminal", "nohup")),
        )
        if "foreign" in pids:
            c.check(
                "attribution: another user's process is foreign, for the server and the runner",
                all(
                    pids["foreign"] in t["foreign_pids"]
                    and pids["foreign"] not in t["kernel_pids"] + t["server_pids"]
                    and t["job_owners"].get("foreign") == "foreign"
                    for t in both
                ),
            )
            c.check(
                "attribution: the GPU stays busy (foreign work) while the kernel idles",
                all((t["device_util"][0] or 0) > 0 for t in idle),
                [t["device_util"][0] for t in idle],
            )
        c.check(
            "idle: idle time accrues in the idle phase and not in the busy one",
            all(t["idle_seconds"] == 0 for t in busy) and idle[-1]["idle_seconds"] >= IDLE / 2,
            [t["idle_seconds"] for t in ticks],
        )
        costs = sorted(source.costs)
        report["tick_cost_ms"] = {
            "median": statistics.median(costs) * 1e3,
            "p95": costs[int(0.95 * (len(costs) - 1))] * 1e3,
            "n": len(costs),
        }
        print("tick cost (ms):", report["tick_cost_ms"], flush=True)
    finally:
        for p in starters:
            if p.poll() is None:
                p.kill()
            p.wait()
        for pid in detached:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        report["logs"] = {n: lg.read_text() for n, lg in logs.items()}


def check_gpm(c: Checks, report: dict[str, Any]) -> None:
    """GPM on the whole GPU with a load running, read by the MIG path's own function."""
    nvml = default_nvml_module()
    nvml.nvmlInit()
    tmp = Path(tempfile.mkdtemp(prefix="gpuslice-gpm-"))
    log = tmp / "load.log"
    load = subprocess.Popen([sys.executable, "-c", LOAD, "64", "8", "0", str(log)])
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(0)
        if not nvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
            c.check("gpm: supported on this GPU", False, "not supported")
            return
        idle_util = gpm_full_gpu(nvml, h, 1.0)
        wait_for(lambda: "ready" in phases(log), 120, "the GPM load", [load])
        with open(log, "a") as f:
            f.write("go 0\n")
        wait_for(lambda: "busy" in phases(log), 30, "the GPM load to start", [load])
        busy_util = gpm_full_gpu(nvml, h, 2.0)
        report["gpm"] = {"idle": idle_util, "busy": busy_util}
        c.check(
            "gpm: graphics util read by the MIG path's function",
            busy_util is not None,
            report["gpm"],
        )
        c.check(
            "gpm: busy GPU reads higher than idle",
            (busy_util or 0) > (idle_util or 0) + 10,
            report["gpm"],
        )
    finally:
        if load.poll() is None:
            load.kill()
        load.wait()
        nvml.nvmlShutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the full report (ticks, facts) here")
    args = ap.parse_args()
    report: dict[str, Any] = {"machine": platform.platform(), "python": sys.version.split()[0]}
    c = Checks()
    for step in (check_discovery, driver_facts, check_attribution, check_gpm):
        try:
            step(c, report)
        except Exception as e:  # one broken step must not hide the others' results
            c.check(f"{step.__name__} ran", False, repr(e))
    report["checks"] = c.results
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    print(f"{sum(r['ok'] for r in c.results)}/{len(c.results)} checks passed", flush=True)
    return 0 if c.ok else 1


if __name__ == "__main__":
    sys.exit(main())
