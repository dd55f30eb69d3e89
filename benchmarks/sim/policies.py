"""The policies a simulation compares, and the cluster and profiles they run on.

A policy is a choice a site makes, never new decision code: which profiles researchers may
ask for, how idle sessions are reclaimed (none; jupyterhub-idle-culler's inactivity rule;
gpuslice's GPU-aware reclaim with its warning), and whether batch jobs are preemptible.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .workload import BatchJob

GPU: dict[str, Any] = {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920}

# The slice profiles (what a gpuslice site offers); whole-GPU policies map every request
# to ``gpu-N``. MIG profiles only fit the hosts whose GPUs are in MIG mode.
PROFILES: list[dict[str, Any]] = [
    {"name": "mig-1g.10gb", "kind": "mig", "mig_profile": "1g.10gb"},
    {"name": "share-250", "kind": "share", "gpu_milli": 250, "gpu_memory_mib": 20480},
    {"name": "share-500", "kind": "share", "gpu_milli": 500, "gpu_memory_mib": 40960},
    {"name": "gpu-1", "kind": "gpu", "count": 1},
    {"name": "gpu-2", "kind": "gpu", "count": 2},
    {"name": "gpu-4", "kind": "gpu", "count": 4},
    {"name": "gpu-8", "kind": "gpu", "count": 8},
]
# one GPU's share each profile holds (a 1g.10gb instance is 1/7 of an A100)
PROFILE_MILLI = {"mig-1g.10gb": 142, "share-250": 250, "share-500": 500, "gpu-1": 1000}
PROFILE_MILLI.update({f"gpu-{n}": 1000 * n for n in (2, 4, 8)})
CATALOG_SHARES = sorted(p["gpu_milli"] for p in PROFILES if p["kind"] == "share")


def profile_milli(name: str) -> int:
    """One GPU's share a profile holds: the catalog's, a share menu's or a site's
    ``share-N``, a site's ``gpu-N`` (N whole GPUs) or ``mig-<instance>`` (its compute
    slices out of an A100's or H100's seven)."""
    if name in PROFILE_MILLI:
        return PROFILE_MILLI[name]
    kind, _, rest = name.partition("-")
    if kind == "share" and rest.isdigit():
        return int(rest)
    if kind == "gpu" and rest.isdigit():
        return 1000 * int(rest)
    slices = rest.partition("g")[0]
    if kind == "mig" and slices.isdigit():
        return min(1000, 1000 * int(slices) // 7)
    raise KeyError(name)


RECLAIMS = ("none", "inactivity", "gpu")
VARIABLE = (
    "shares",
    "idle_timeout",
    "warning_lead",
    "placement",
    "slices",
    "batch_window",
    "reserved",
    "defrag",
    "overcommit",
    "burst",
    "quotas",
)
BATCH_CLASSES = ("normal", "preemptible")


@dataclass(frozen=True)
class Policy:
    name: str
    title: str
    slices: bool  # sessions and jobs get the slice they ask for; else whole GPUs
    reclaim: str  # "none", "inactivity" (jupyterhub-idle-culler), "gpu" (gpuslice)
    batch: str  # the priority class batch jobs are submitted with
    idle_timeout: float = 3600.0
    warning_lead: float = 300.0
    placement: str = "default"
    # a batch time window every batch job runs in (JobManager.class_time_windows), as
    # spans separated by ";" ("mon-fri 19:00-07:00;sat,sun 00:00-24:00"), in UTC; "": none
    batch_window: str = ""
    # split pools (JobManager.reserved_pools): the first N hosts (the MIG hosts first)
    # reserved for interactive sessions, optionally with a borrowing window for preemptible
    # jobs, as "N" or "N@spans" (spans as for batch_window, in UTC); "": no split
    reserved: str = ""
    # defragmentation: preemptible jobs moved per hour at most
    # (JobManager.defragment_moves_per_hour); 0: off
    defrag: int = 0
    # overcommit of shares from history (GPUSliceService.share_overcommit_ratio), as "RATIO"
    # or "RATIO@HOURS" (share_overcommit_min_hours, default 24); "": off
    overcommit: str = ""
    # burst (JobManager.burst_after_wait, burst_when_allocated_above): every batch job is
    # burstable, as "AFTER" or "AFTER@ALLOCATED"; "": off
    burst: str = ""
    # quota suggestions: on this day of the run, every suggested quota (users' and groups',
    # the admin panel's rule over the days so far) is applied as an admin's Apply would;
    # 0: none
    quotas: float = 0.0
    # the profile set's shares, as the step of a menu: 100 offers batch jobs shares of
    # 100, 200, ... 900 milli-GPU besides the catalog's, and a job asking less than a GPU
    # gets the smallest that holds its request; 0: the catalog's shares only (250, 500)
    shares: int = 0
    # settings an admin may change, as (key, value) pairs, for a policy-5 variant's name
    changed: tuple[tuple[str, Any], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.reclaim not in RECLAIMS:
            raise ValueError(f"reclaim must be one of {RECLAIMS}, got {self.reclaim!r}")
        if self.batch not in BATCH_CLASSES:
            raise ValueError(f"batch must be one of {BATCH_CLASSES}, got {self.batch!r}")
        if self.reclaim != "none" and not 0 < self.warning_lead < self.idle_timeout:
            raise ValueError("need 0 < warning_lead < idle_timeout")
        if self.overcommit:
            try:
                ratio, hours = self.overcommit_settings() or (1.0, 24.0)
            except ValueError:
                ratio, hours = 0.0, 0.0
            if not (1.0 < ratio <= 2.0 and hours >= 1):
                raise ValueError(
                    f"overcommit must be 'RATIO' or 'RATIO@HOURS' with 1 < RATIO <= 2 and "
                    f"HOURS >= 1, got {self.overcommit!r}"
                )
        if self.burst:
            try:
                after, above = self.burst_settings() or (0.0, 0.0)
            except ValueError:
                after, above = 0.0, -1.0
            if not (0.01 <= after <= 10 and 0 <= above < 1):
                raise ValueError(
                    "burst must be 'AFTER' or 'AFTER@ALLOCATED' with 0.01 <= AFTER <= 10 and "
                    f"0 <= ALLOCATED < 1, got {self.burst!r}"
                )
        if self.quotas < 0:
            raise ValueError(f"quotas must be a day of the run (0: off), got {self.quotas!r}")
        if self.shares and not 10 <= self.shares <= 500:
            raise ValueError(f"shares must be a step of 10 to 500 milli-GPU, got {self.shares!r}")
        if self.defrag < 0:
            raise ValueError(f"defrag must be jobs moved per hour, 0 or more, got {self.defrag!r}")
        if self.idle_timeout <= 0 or self.warning_lead <= 0:
            raise ValueError("idle_timeout and warning_lead must be seconds above 0")
        count, _, _spans = self.reserved.partition("@")
        if self.reserved and not (count.isdigit() and int(count) > 0):
            raise ValueError(f"reserved must be 'N' or 'N@spans' with N > 0, got {self.reserved!r}")

    def burst_settings(self) -> tuple[float, float] | None:
        """(burst_after_wait, burst_when_allocated_above) of ``burst``, None when off."""
        if not self.burst:
            return None
        after, _, above = self.burst.partition("@")
        return float(after), float(above) if above else 0.0

    def overcommit_settings(self) -> tuple[float, float] | None:
        """(ratio, min_hours) of ``overcommit``, None when off."""
        if not self.overcommit:
            return None
        ratio, _, hours = self.overcommit.partition("@")
        return float(ratio), float(hours) if hours else 24.0

    def reserved_pool(self) -> tuple[int, list[str]]:
        """(hosts reserved, borrowing window spans) of ``reserved``."""
        count, _, spans = self.reserved.partition("@")
        return (int(count) if count else 0), [x for x in spans.split(";") if x]

    def profile(self, asked: str) -> str:
        """What a request for ``asked`` gets under this policy."""
        if self.slices or asked.startswith("gpu-"):
            return asked
        return "gpu-1"

    def share_profiles(self) -> list[dict[str, Any]]:
        """The share menu's profiles the catalog lacks (a memory cap in proportion)."""
        if not self.shares or not self.slices:
            return []
        catalog = {p["name"] for p in PROFILES}
        return [
            {
                "name": f"share-{m}",
                "kind": "share",
                "gpu_milli": m,
                "gpu_memory_mib": GPU["memory_mib"] * m // 1000,
            }
            for m in range(self.shares, 1000, self.shares)
            if f"share-{m}" not in catalog
        ]

    def batch_profile(self, job: BatchJob) -> str:
        """What a batch job gets: with a share menu, the smallest share of the menu and
        the catalog together that holds its request; else what it asked for, as
        :meth:`profile` maps it."""
        if self.shares and self.slices and job.request_milli and job.slices == 1:
            step = self.shares
            menu = -(-job.request_milli // step) * step  # rounded up to the menu
            catalog = [m for m in CATALOG_SHARES if m >= job.request_milli]
            milli = min([menu, *catalog])
            return f"share-{milli}" if milli < 1000 else "gpu-1"
        return self.profile(job.profile)

    def vary(self, key: str, value: Any) -> Policy:
        """Policy 5: this policy with one admin setting changed."""
        if key not in VARIABLE:
            raise ValueError(f"cannot vary {key!r}: one of {', '.join(VARIABLE)}")
        name = f"{self.name}[{key}={value}]"
        changed = (*self.changed, (key, value))
        # titled by what it changes: the base's title may name the very setting changed
        # (policy 2's "1 h inactivity")
        base = name.partition("[")[0]
        title = f"policy {base} with " + ", ".join(f"{k}={v}" for k, v in changed)
        return replace(self, name=name, title=title, **{key: value}, changed=changed)


POLICIES = {
    p.name: p
    for p in (
        Policy("1", "whole GPU per server, nothing reclaimed", False, "none", "normal"),
        Policy(
            "2",
            "whole GPU + jupyterhub-idle-culler (1 h inactivity)",
            False,
            "inactivity",
            "normal",
        ),
        Policy("3", "gpuslice slices + GPU-aware reclaim with warning", True, "gpu", "normal"),
        Policy("4", "3 + preemptible batch backfill with checkpoints", True, "gpu", "preemptible"),
    )
}


def hosts(n_hosts: int, mig_hosts: int) -> list[dict[str, Any]]:
    """``n_hosts`` x 8 A100-80GB; the first ``mig_hosts`` have every GPU in MIG mode
    (seven 1g.10gb instances each)."""
    out = []
    for i in range(n_hosts):
        if i < mig_hosts:
            gpus = [{**GPU, "mig": ["1g.10gb"] * 7} for _ in range(8)]
        else:
            gpus = [{**GPU, "count": 8}]
        out.append(
            {"name": f"gpu{i:03d}", "cpu_milli": 256000, "memory_mib": 2048000, "gpus": gpus}
        )
    return out


def whole_gpus(cluster: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same hosts with every MIG-mode GPU whole: a site handing out whole GPUs does not
    partition them."""
    out = []
    for host in cluster:
        gpus = [{k: v for k, v in g.items() if k != "mig"} for g in host["gpus"]]
        out.append({**host, "gpus": gpus})
    return out
