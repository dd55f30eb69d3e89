"""The job service: submission, cancel, preemption and the queries behind the REST API.

The scheduling loop itself is in :mod:`.scheduler`; both write jobs only inside
``Database.writing()`` and never while the ledger holds its own transaction (the ledger
is called between job transactions), so SQLite's single writer never waits on itself.
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, insert, select
from sqlalchemy.orm import selectinload
from traitlets import Bool, Dict, Float, Integer, List, Unicode
from traitlets.config import LoggingConfigurable

from gpuslice.isotime import iso
from gpuslice.run.jobdir import JobDir
from gpuslice.run.params import parameter_warnings

from ..db.engine import Database
from ..db.jobs_models import JobRow
from ..db.lean import Lean
from ..db.models import utcnow
from ..errors import ConfigError, Refused
from ..ledger import Caller, Ledger
from ..overrides import record_admin_event
from ..pools import check_borrowers_can_borrow, parse_pools
from ..profiles import Profile
from .accounts import DEFAULT_KEEP, Account, AccountError
from .backends.base import Backend, QueueingBackend, current_ref
from .backends.slurm import job_name as slurm_job_name
from .folders import (
    RootSize,
    Swept,
    UserUsage,
    disk_bytes,
    due_for_removal,
    is_job_folder,
    record_removed,
    remove_folder,
    size_text,
    user_folders,
)
from .job_writes import record_transition, write_job
from .jobdirs import create_job_dir, folder_mismatch, read_notebook, set_aside_stale
from .ordering import queue_order
from .params import validate_parameters
from .priority_access import DEFAULT as PRIORITY_ACCESS
from .priority_access import allowed_classes, check_class, parse_priority_access
from .serialize import job_json
from .states import ACTIVE, PRIORITY_CLASSES, TERMINAL, transition
from .victims import pick_victim
from .wakeup import Wakeup
from .windows import TimeWindow, parse_windows

_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass
class Reservation:
    """A slice being freed for an interactive server: no batch job may take it meanwhile."""

    job_id: int
    profile: str
    expires: datetime


# A job's whole row, without its history (JobManager.current)
CURRENT_ROW = Lean(
    select(*cast(Table, JobRow.__table__).c).where(JobRow.id == bindparam("job_id")), named=True
)
# A submission's statements (see job_writes.py)
_UNFINISHED = Lean(
    select(func.count())
    .select_from(JobRow)
    .where(JobRow.user == bindparam("user"), JobRow.state.not_in(TERMINAL))
)
_INSERT_JOB = Lean(insert(cast(Table, JobRow.__table__)).returning(JobRow.id))
# What run order reads of every listed job (the full row only for the page shown).
RUN_ORDER_COLUMNS = (JobRow.id, JobRow.state, JobRow.priority_class, JobRow.submitted_at)


# The spawn form asks, for each profile none of which is free, whether a spawn would take a
# preemptible job's slice: it looks at this many candidates (in the order a spawn does).
FORM_VICTIMS = 16
# What choosing a victim reads of a job (pick_victim, _too_long)
VICTIM_COLUMNS = (
    JobRow.id,
    JobRow.user,  # (whose job: the preemption's reason names no other user)
    JobRow.state,
    JobRow.priority_class,
    JobRow.attempt_started_at,
    JobRow.allocation_ids,
    JobRow.last_checkpoint_at,  # (among equal waste, the one with least work at stake)
)
# the preemptible jobs that hold (or are giving back) slices, in those columns: a spawn
# that finds no room asks, in a statement built once
_CANDIDATES = Lean(
    select(*VICTIM_COLUMNS).where(JobRow.state.in_(ACTIVE), JobRow.priority_class == "preemptible"),
    named=True,
)


class JobManager(LoggingConfigurable):
    schedule_interval = Float(
        1.0, help="Seconds between scheduler passes (a submission or a finished run wakes it)."
    ).tag(config=True)
    preempt_grace = Float(
        60.0,
        help="Seconds a preempted job has to checkpoint and exit before it is killed.",
    ).tag(config=True)
    max_restarts = Integer(
        3,
        help="How often a job whose runner died (not preempted, not failed) is requeued "
        "before it is marked failed.",
    ).tag(config=True)
    restart_backoff = Float(
        5.0, help="Seconds before the first requeue of a crashed job; doubles each time."
    ).tag(config=True)
    restart_backoff_max = Float(300.0, help="Upper bound of the requeue backoff (s).").tag(
        config=True
    )
    aging_seconds = Float(
        3600.0,
        help="Waiting this long lifts a queued job one priority class in the queue order "
        "(0: no aging). Local backend only: on Slurm and Kubernetes the engine orders the "
        "queue (set here, it is refused at start).",
    ).tag(config=True)
    hold_for_after = Float(
        7200.0,
        help="Seconds the first queued job that fits nowhere, not even once every running "
        "batch job has ended (it waits for people's servers to give slices back), may wait "
        "while later jobs take the capacity that frees up; past this, later jobs that would "
        "use its pools are held for it, so that it starts as soon as the room is there (no "
        "job waits for ever behind a stream of smaller ones). A first job that will fit when "
        "running jobs end always gets a reservation: later ones start only where they end "
        "before it or leave it its room (EASY backfill). Local backend only.",
    ).tag(config=True)
    default_checkpoint_interval = Float(
        600.0, help="Checkpoint interval (s) of a job that does not ask for one."
    ).tag(config=True)
    default_max_runtime = Float(
        86400.0, help="Max runtime (s, summed over attempts) of a job that does not ask."
    ).tag(config=True)
    max_runtime_limit = Float(
        7 * 86400.0, help="The largest max_runtime (s) a job may ask for."
    ).tag(config=True)
    max_slices_per_job = Integer(8, help="The most slices one job may ask for.").tag(config=True)
    usage_interval = Float(
        30.0,
        help="Seconds between the GPU utilization figures a running job's runner writes for "
        "the admin panel (0: none).",
    ).tag(config=True)
    max_jobs_per_user = Integer(
        200, help="How many unfinished (queued or running) jobs a user may have."
    ).tag(config=True)
    job_folder_retention_days = Float(
        7.0,
        help="""Days an ended job's folder (its notebook, checkpoints, output and log, in
        ``jobs_root``) is kept once the owner's JupyterLab server has copied its outputs
        into their ``gpu-jobs/<name>-<id>/`` folder; it is removed then (0: at the first
        sweep after the copy; sweeps run every 10 minutes). A folder whose outputs were never
        copied stays until the job ended longer ago than
        ``GPUSliceService.history_retention_days`` (when that is set); a job cancelled
        before it started loses its folder at once.""",
    ).tag(config=True)
    max_job_folder_bytes_per_user = Integer(
        10 * 1024**3,
        help="""The most disk a user's job folders in ``jobs_root`` may take, in bytes
        (default 10 GiB): once they take that much, a submission is refused (413) with what
        they use and how to free it. Measured as the folders' allocated blocks, at most every
        30 seconds per user. 0: no limit.""",
    ).tag(config=True)
    priority_access = Dict(
        PRIORITY_ACCESS,
        help="""Who may submit each priority class besides the gpuslice admins (who may
        submit every class): class -> ``{"users": [...], "groups": [...]}``, e.g.
        ``{"high": {"groups": ["oncall"]}, "normal": {"groups": ["staff", "students"]}}``.
        A class not named here is everyone's. Default: ``high`` (which takes the reserved
        pools and preempts other users' preemptible jobs) for the admins only; ``{}``:
        every class for everyone. Anyone else is refused with a 403 that names this
        setting, and the submit dialog offers only the classes the user may submit.""",
    ).tag(config=True)
    slurm_partitions = Dict(
        {"preemptible": "", "normal": "", "high": ""},
        help="Slurm partition of each priority class (``job_backend = 'slurm'``, where "
        "Slurm queues and places the jobs); a preemptible class in a low PriorityTier "
        "partition lets Slurm's own preemption (PreemptMode=REQUEUE) requeue it for "
        "higher-priority work, an interactive server's included.",
    ).tag(config=True)
    slurm_qos = Dict(
        {"preemptible": "", "normal": "", "high": ""},
        help="Slurm QOS of each priority class (``job_backend = 'slurm'``), e.g. "
        "``{'preemptible': 'scavenger'}``: Slurm's limits, fairshare and QOS-based "
        "preemption (PreemptType=preempt/qos) then apply to gpuslice's jobs as to any. "
        "Empty: the user's default QOS.",
    ).tag(config=True)
    slurm_accounts = Dict(
        {},
        help="Slurm account (--account) of each priority class's jobs (``job_backend = "
        "'slurm'``), e.g. ``{'normal': 'gpulab', 'high': 'gpulab-urgent'}``: Slurm charges "
        "them there (accounting, fairshare, limits). A class not named: the owner's default "
        "account. Slurm refuses an account the owner may not use, and the job fails with "
        "its message.",
    ).tag(config=True)
    slurm_reservations = Dict(
        {},
        help="Slurm reservation (--reservation) of each priority class's jobs (``job_backend "
        "= 'slurm'``), e.g. ``{'high': 'deadline'}``: Slurm runs them only on its nodes, "
        "while it is active, and gpuslice records them where Slurm runs them (the nodes of "
        "an active reservation are offered to no server). A class not named: no reservation.",
    ).tag(config=True)
    slurm_constraints = Dict(
        {},
        help="Node features (--constraint) each priority class's jobs need (``job_backend = "
        "'slurm'``), e.g. ``{'preemptible': 'spot|onprem'}``: Slurm runs them only on nodes "
        "with those features (slurm.conf Features=). A class not named: any node.",
    ).tag(config=True)
    kubernetes_namespace = Unicode(
        "default", help="Namespace of the Kubernetes Jobs (``job_backend = 'kubernetes'``)."
    ).tag(config=True)
    kubernetes_image = Unicode(
        "",
        help="Image of a Kubernetes Job's runner: gpuslice (``python -m gpuslice.run``) and "
        "the notebooks' kernels installed; required with ``job_backend = 'kubernetes'``.",
    ).tag(config=True)
    kubernetes_jobs_claim = Unicode(
        "",
        help="PersistentVolumeClaim holding the job folders, mounted in each Job where the "
        "service has ``jobs_root`` (mount the same claim there in the service's pod); "
        "required with ``job_backend = 'kubernetes'``.",
    ).tag(config=True)
    kubernetes_kueue_queues = Dict(
        {},
        help="Kueue LocalQueue of each priority class (``job_backend = 'kubernetes'`` on a "
        "cluster that runs Kueue), e.g. ``{'preemptible': 'gpu-spot', 'normal': 'gpu', "
        "'high': 'gpu'}``: the Job is created suspended with the queue's label and runs "
        "when Kueue admits it within its ClusterQueue's quota. Empty: no Kueue, the "
        "cluster's scheduler starts the Jobs as resources allow.",
    ).tag(config=True)
    runner_python = Unicode(
        "",
        help="Python that runs ``python -m gpuslice.run`` for the local backend (default: "
        "the service's own).",
    ).tag(config=True)
    run_jobs_as_service_user = Bool(
        False,
        help="""Run every batch job as the service's own account instead of its owner's.

        For a single-user or demo hub only: every user's notebook then runs with the
        service's rights (it still gets none of its variables or tokens). Off by default;
        when off, the local backend needs the service to run as root (it starts each job
        under its owner's uid, like JupyterHub's LocalProcessSpawner) and the Slurm
        backend submits through ``slurm_submit_prefix``. A warning is logged at start.""",
    ).tag(config=True)
    job_env_keep = List(
        Unicode(),
        default_value=list(DEFAULT_KEEP),
        help="Variables copied from the service's environment into every job's (when set). "
        "A job's environment is an allow-list (see the admin guide's security model); names "
        "starting with JUPYTERHUB_, JPY_, GPUSLICE_SERVICE or CONFIGPROXY_ are refused.",
    ).tag(config=True)
    job_environment = Dict(
        help="Fixed variables added to every job's environment, e.g. "
        '``{"HF_HOME": "/scratch/hf"}`` (the same names are refused as for job_env_keep).',
    ).tag(config=True)
    slurm_submit_prefix = List(
        Unicode(),
        help="""Command prefix that runs ``sbatch``/``scancel``/``scontrol update`` as the
        job's owner (``{username}`` is replaced), like batchspawner's ``exec_prefix``.
        Default: ``runuser -u {username} --`` when the service runs as root, else
        ``sudo -n -u {username} --`` (which needs a sudoers rule for those commands).""",
    ).tag(config=True)

    time_windows = Dict(
        help="""Named windows batch jobs may be limited to, each a span or a list of spans
        ``[DAYS ]HH:MM-HH:MM`` in ``time_window_timezone``, e.g. ``{"night": "02:00-06:00",
        "off-hours": ["mon-fri 19:00-07:00", "sat,sun 00:00-24:00"]}`` (a span ending at or
        before its start ends the next day). A job submitted with ``time_window`` (or of a
        class in ``class_time_windows``) waits until its window opens, and is checkpointed
        and requeued when it closes. Local backend only: Slurm and Kubernetes queue the jobs
        themselves.""",
    ).tag(config=True)
    time_window_timezone = Unicode(
        help="IANA time zone of the time windows, e.g. ``Europe/Berlin`` (default: the "
        "service machine's, from $TZ or /etc/localtime).",
    ).tag(config=True)
    class_time_windows = Dict(
        help="""Priority class -> time window name: every job of the class runs only inside
        that window, e.g. ``{"preemptible": "night"}``. A job of the class may not ask for
        another window.""",
    ).tag(config=True)

    reserved_pools = Dict(
        help="""Capacity reserved for people: pool name -> ``{"hosts": [name patterns],
        "gpus": [GPU UUIDs], "groups": [...]}`` (hosts or gpus or both; groups optional:
        then only for those groups), e.g. ``{"interactive": {"hosts": ["gpu-0[1-4]"]}}``.
        A reserved pool serves interactive servers (which take it before the rest) and
        ``high`` batch jobs; every other batch job runs on the GPUs in no reserved pool (the
        peak pool), except that ``preemptible`` jobs borrow idle reserved GPUs inside
        ``reserved_pool_borrowing``. Local backend only: Slurm and Kubernetes have
        partitions and node pools for this.""",
    ).tag(config=True)
    reserved_pool_borrowing = Unicode(
        "",
        help="""A window of ``time_windows`` (e.g. ``"off-hours"``) in which preemptible jobs
        may borrow idle GPUs of the reserved pools. They hold them preemptibly: a person's
        spawn preempts a borrower (checkpoint, requeue) as any preemptible job, and when the
        window closes the scheduler returns every borrowed slice the same way. Empty:
        batch jobs never use the reserved pools.""",
    ).tag(config=True)

    defragment_moves_per_hour = Integer(
        0,
        help="""Defragmentation: at most this many preemptible jobs moved per hour (0: off).
        When a queued one-slice job is refused for capacity that the cluster has but split
        across GPUs or hosts, the scheduler checkpoints the fewest running preemptible jobs
        that make it fit on one host, provided each of them fits again elsewhere, and the
        waiting job takes the room they leave; they resume from their checkpoints. Local
        backend only.""",
    ).tag(config=True)

    burst_partition = Unicode(
        "",
        help="""Burst: a second Slurm partition (another cluster's nodes, in production a
        cloud partition) that jobs submitted as ``burstable`` are moved to when they wait
        too long in their own (see ``burst_after_wait`` and ``burst_when_allocated_above``).
        They resume there from their checkpoint; a job preempted or requeued there comes
        back to its own partition's queue. Their GPU-hours there are counted as bought
        (admin panel, ``/metrics``), never as this cluster's. Empty: off. Slurm backend
        only, with every priority class's own partition named in ``slurm_partitions`` (the
        partition a job comes back to).""",
    ).tag(config=True)
    burst_after_wait = Float(
        0.5,
        help="A burstable job waiting in its own partition is moved to the burst partition "
        "once it has waited this fraction of its expected run time (its max_runtime): 0.5 "
        "is half. From 0.01 to 10.",
    ).tag(config=True)
    burst_when_allocated_above = Float(
        0.8,
        help="Also move a waiting burstable job when the cluster's allocated share of its "
        "GPUs in service has stayed above this for 10 minutes (0: only ``burst_after_wait``).",
    ).tag(config=True)

    def __init__(
        self, ledger: Ledger, db: Database, backend: Backend, root: Path, **kw: Any
    ) -> None:
        super().__init__(**kw)
        # parsed here, so a bad window stops the service at start (ConfigError names it)
        self.windows: dict[str, TimeWindow] = parse_windows(
            self.time_windows, self.time_window_timezone
        )
        for cls, name in self.class_time_windows.items():
            if cls not in PRIORITY_CLASSES or name not in self.windows:
                raise ConfigError(
                    "JobManager.class_time_windows",
                    f"{cls!r}: {name!r}: a priority class ({', '.join(PRIORITY_CLASSES)}) and "
                    f"a window of time_windows ({', '.join(sorted(self.windows)) or 'none set'})",
                )
        if self.defragment_moves_per_hour < 0:
            raise ConfigError("JobManager.defragment_moves_per_hour", "must be 0 (off) or more")
        if not 0.01 <= self.burst_after_wait <= 10:
            raise ConfigError("JobManager.burst_after_wait", "must be from 0.01 to 10")
        if not 0 <= self.burst_when_allocated_above < 1:
            raise ConfigError(
                "JobManager.burst_when_allocated_above", "must be from 0 (off) to below 1"
            )
        self.priority_rules = parse_priority_access(self.priority_access)
        if self.job_folder_retention_days < 0:
            raise ConfigError("JobManager.job_folder_retention_days", "must be 0 or more days")
        if self.max_job_folder_bytes_per_user < 0:
            raise ConfigError(
                "JobManager.max_job_folder_bytes_per_user", "must be 0 (no limit) or more"
            )
        # each user's job folders' bytes, for the cap; the jobs root's, as the last sweep saw
        self.usage = UserUsage()
        self.root_size = RootSize()
        self._root_lock = threading.Lock()
        # jobs moved by defragmentation since start, and the milli-GPUs they held (metrics)
        self.moved_jobs = 0
        self.moved_milli = 0
        self.pools = parse_pools(
            self.reserved_pools,
            self.reserved_pool_borrowing,
            self.windows,
            reserved_priority=100 * PRIORITY_CLASSES["high"],
        )
        window = self.class_time_windows.get("preemptible")
        check_borrowers_can_borrow(self.pools, self.windows.get(window) if window else None)
        # placement, the spawn form and refusals all read the split from the ledger
        if ledger is not None:  # (None: a settings check without a ledger)
            ledger.pools = self.pools
        self.ledger = ledger
        self.db = db
        self.backend = backend
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        # Owners reach their own job folder (0700, theirs) but cannot list the others.
        self.root.chmod(0o711)
        self.reservations: dict[tuple[str, str], Reservation] = {}
        # When the backend queues jobs itself (Slurm, Kubernetes): each waiting job's place among
        # gpuslice's jobs in its queue, as of the last pass (delegated.py)
        self.backend_order: dict[int, int] = {}
        self.wake = Wakeup()
        self.task: asyncio.Future | None = None
        self.sweeper: asyncio.Future | None = None  # (setup.sweep_forever)
        # Cancelled jobs whose run the backend could not stop (an engine that did not
        # answer), tried again at each pass (``retry_kills``): the run's reference, and the
        # slices that go back once it is stopped.
        self.kills_pending: dict[int, tuple[dict[str, Any], list[int]]] = {}

    # -- submission ----------------------------------------------------------------------

    @property
    def delegated(self) -> bool:
        """Whether the backend queues and places the jobs itself (Slurm)."""
        return bool(getattr(self.backend, "schedules_itself", False))

    @property
    def queueing(self) -> QueueingBackend:
        """The backend, when it schedules itself (``delegated``)."""
        return cast(QueueingBackend, self.backend)

    @property
    def python(self) -> str:
        """The Python that runs ``python -m gpuslice.run``."""
        return self.runner_python or sys.executable

    def account(self, user: str) -> Account:
        """The system account ``user``'s jobs run as (AccountError when there is none)."""
        if self.run_jobs_as_service_user:
            return Account.current()
        return Account.lookup(user)

    def verify_owner(self, job: Any, account: Account) -> None:
        """Refuse (``AccountError``, the reason logged) to run ``job``, a ledger row, as
        ``account`` unless it is the account the service recorded for it at submission:
        the owner of the folder it made for the job then (:func:`folder_mismatch`). A row
        rewritten by someone who can write the ledger does not choose whose account runs
        a job. (``run_jobs_as_service_user``: every job runs as the service's account.)"""
        if self.run_jobs_as_service_user:
            return
        problem = folder_mismatch(self.root, job, account)
        if problem:
            self.log.warning(
                "job %s: refused to run it as %s: %s. The service gave the job's folder to "
                "its owner at submission; its ledger row was changed since, outside the "
                "service (by someone who can write the ledger?)",
                job.id,
                account.name,
                problem,
            )
            raise AccountError(
                f"refused to run it as {account.name}: its record in the ledger does not "
                "match what the service recorded when it was submitted (the service's log "
                "says why)"
            )

    def allowed_priorities(self, user: str, groups: tuple[str, ...], admin: bool) -> list[str]:
        """The priority classes ``user`` may submit (``priority_access``), lowest first."""
        return allowed_classes(self.priority_rules, user, groups, admin)

    def submit(self, caller: Caller, body: dict[str, Any], admin: bool = False) -> dict[str, Any]:
        """Queue ``body`` as ``caller``'s job; ``admin``: the caller has the gpuslice admin
        scope (every priority class is theirs to use)."""
        spec = self._validate(body)
        check_class(self.priority_rules, spec["priority_class"], caller.user, caller.groups, admin)
        workdir = body.get("workdir")
        if workdir is not None and (
            not isinstance(workdir, str)
            or not workdir.startswith("/")
            or "\0" in workdir
            or len(workdir) > 4096
        ):
            raise Refused("bad_request", "field 'workdir' must be an absolute path")
        nb = read_notebook(body.get("notebook"))
        try:
            account = self.account(caller.user)
        except AccountError as e:
            raise Refused("no_account", str(e)) from None
        self._check_disk(caller.user)
        with self.db.writing() as s:
            # in statements built once, not an ORM object flushed twice: a busy site's
            # JupyterLabs submit thousands a day
            conn = s.connection()
            unfinished = _UNFINISHED.execute(conn, {"user": caller.user}).scalar_one()
            if unfinished >= self.max_jobs_per_user:
                raise Refused(
                    "too_many_jobs", f"{caller.user} already has {unfinished} unfinished jobs"
                )
            now = utcnow()
            job_id = _INSERT_JOB.execute(
                conn,
                {
                    "user": caller.user,
                    "groups": sorted(caller.groups),
                    "backend": self.backend.name,
                    "backend_ref": {},
                    "allocation_ids": [],
                    "submitted_at": now,
                    "job_dir": "",
                    "state": "queued",
                    **spec,
                },
            ).scalar_one()
            reason = f"submitted by {caller.actor}"
            record_transition(conn, job_id, None, "queued", now, reason)
            stale = set_aside_stale(self.root / str(job_id))
            if stale is not None:
                self.log.warning(
                    "job %s: its folder's place was taken (by another ledger's job over the "
                    "same jobs_root, or a submission that failed): moved that folder to %s",
                    job_id,
                    stale,
                )
            job_dir = create_job_dir(
                self.root,
                job_id,
                nb,
                {
                    "name": spec["name"],
                    "user": caller.user,
                    "parameters": spec["parameters"],
                    "checkpoint_interval": spec["checkpoint_interval"],
                    "workdir": workdir,
                },
                account,
            )
            write_job(conn, job_id, {"job_dir": str(job_dir)})
            made = disk_bytes(job_dir)
            self.usage.add(caller.user, made)
            self._root_changed(made, 1)
            row = CURRENT_ROW.execute(conn, {"job_id": job_id}).one()
            first = SimpleNamespace(state="queued", from_state=None, at=now, reason=reason)
            out = job_json(row, transitions=[first])
        self.wake.set()
        # Said when submitting (the lab shows them) and again in the job's log by the runner:
        # a parameter the notebook overwrites gives a result computed with another value.
        out["warnings"] = parameter_warnings(nb, spec["parameters"])
        return out

    def _check_disk(self, user: str) -> None:
        """Refused (``over_disk_quota``) when ``user``'s job folders take their cap or more:
        the message says how much, and how to free it."""
        cap = self.max_job_folder_bytes_per_user
        if cap <= 0:
            return
        used = self.usage.used(user, lambda: user_folders(self.db, user))
        if used < cap:
            return
        days = self.job_folder_retention_days
        after = f"{days:g} days after" if days else "once"
        raise Refused(
            "over_disk_quota",
            f"your batch jobs' folders take {size_text(used)} on the service's disk, and "
            f"{size_text(cap)} is the most a user's may take "
            f"(JobManager.max_job_folder_bytes_per_user). To free it: cancel queued jobs you "
            f"no longer need (the folder of a job that never started goes at once); an ended "
            f"job's folder goes {after} your JupyterLab has copied its outputs into your "
            "gpu-jobs folder (open JupyterLab to have them copied); or ask an admin",
            used_bytes=used,
            limit_bytes=cap,
        )

    def _validate(self, body: dict[str, Any]) -> dict[str, Any]:
        profile = body.get("profile")
        if not isinstance(profile, str) or profile not in self.ledger.profiles:
            raise Refused(
                "bad_request" if not isinstance(profile, str) else "unknown_profile",
                f"unknown profile {profile!r}; known: {sorted(self.ledger.profiles)}",
            )
        priority = body.get("priority", "preemptible")
        if not isinstance(priority, str) or priority not in PRIORITY_CLASSES:
            raise Refused(
                "bad_request", f"field 'priority' must be one of {list(PRIORITY_CLASSES)}"
            )
        slices = body.get("slices", 1)
        if not _int_in(slices, 1, self.max_slices_per_job):
            raise Refused(
                "bad_request",
                f"field 'slices' must be an integer from 1 to {self.max_slices_per_job}",
            )
        max_runtime = body.get("max_runtime", self.default_max_runtime)
        if not _num_in(max_runtime, 1, self.max_runtime_limit):
            raise Refused(
                "bad_request",
                f"field 'max_runtime' must be 1 to {self.max_runtime_limit:g} seconds",
            )
        # The default never exceeds the job's own max runtime (a 5-minute job checkpoints
        # within its 5 minutes); an interval the user chose is theirs.
        interval = body.get(
            "checkpoint_interval", min(self.default_checkpoint_interval, float(max_runtime))
        )
        if not _num_in(interval, 1, 86400):
            raise Refused("bad_request", "field 'checkpoint_interval' must be 1 to 86400 seconds")
        try:
            raw = body.get("parameters")
            parameters = validate_parameters({} if raw is None else raw)
        except ValueError as e:
            raise Refused("bad_request", f"field 'parameters': {e}") from None
        path = body.get("path", "")
        if not isinstance(path, str) or len(path) > 1024:
            raise Refused("bad_request", "field 'path' must be the notebook's path (a string)")
        name = body.get("name")
        if name is not None and not isinstance(name, str):
            raise Refused("bad_request", "field 'name' must be a string")
        name = name or Path(path).stem or "notebook"
        name = _NAME.sub("-", name).strip("-.")[:60] or "notebook"
        burstable = body.get("burstable", False)
        if not isinstance(burstable, bool):
            raise Refused("bad_request", "field 'burstable' must be true or false")
        if burstable and not self.burst_partition:
            raise Refused(
                "bad_request",
                "field 'burstable': this site has no burst partition (JobManager.burst_partition)",
            )
        return {
            "burstable": burstable,
            "time_window": self._window_of(body.get("time_window"), priority),
            "name": name,
            "profile": profile,
            "slices": slices,
            "priority_class": priority,
            "checkpoint_interval": float(interval),
            "max_runtime": float(max_runtime),
            "parameters": parameters,
            "notebook_path": path,
        }

    def _window_of(self, asked: Any, priority: str) -> str | None:
        """The window a submission runs in: its class's, else the one it names."""
        if asked is not None and (not isinstance(asked, str) or asked not in self.windows):
            known = ", ".join(sorted(self.windows)) or "none are configured"
            raise Refused("bad_request", f"unknown time window {asked!r} (known: {known})")
        forced = self.class_time_windows.get(priority)
        if forced is not None and asked not in (None, forced):
            raise Refused(
                "bad_request",
                f"{priority} jobs run in the time window {forced!r} (set by the admins), "
                f"not {asked!r}",
            )
        return forced or asked

    def window_standing(self, now: datetime) -> dict[str, Any]:
        """The windows for the submit dialog: each one's state, and which classes have one."""
        return {
            "windows": [w.standing(now) for _, w in sorted(self.windows.items())],
            "class_windows": dict(self.class_time_windows),
            # where a burstable job may go, and when (None: no burst partition)
            "burst": (
                {
                    "partition": self.burst_partition,
                    "after_wait": self.burst_after_wait,
                    "allocated_above": self.burst_when_allocated_above,
                }
                if self.burst_partition
                else None
            ),
        }

    # -- queries -------------------------------------------------------------------------

    def get(self, job_id: int, log_bytes: int = 2000) -> dict[str, Any] | None:
        with self.db.reading() as s:
            job = s.get(JobRow, job_id)
            if job is None:
                return None
            return job_json(job, self.log_text(job, log_bytes))

    def list_jobs(
        self,
        user: str | None,
        states: set[str] | None,
        limit: int,
        order: str = "newest",
        cursor: int | None = None,
    ) -> tuple[list[dict], int | None, int]:
        """A page of jobs, the cursor of the next page (None at the end), and how many match.

        ``newest``: newest first; the cursor is the last job id shown. ``run``: the jobs
        holding slices (oldest first), then the queue in the order the scheduler starts it
        (its own ordering, aging included) with each queued job's ``queue_position``; the
        cursor is a position in that order, which is worked out again for each page.
        """
        where = []
        if user is not None:
            where.append(JobRow.user == user)
        if states:
            where.append(JobRow.state.in_(states))
        with self.db.reading() as s:
            total = int(s.scalar(select(func.count(JobRow.id)).where(*where)) or 0)
            if order == "newest":
                q = (
                    select(JobRow)
                    .options(selectinload(JobRow.transitions))
                    .where(*where)
                    .order_by(JobRow.id.desc())
                    .limit(limit + 1)
                )
                if cursor is not None:
                    q = q.where(JobRow.id < cursor)
                found = list(s.scalars(q))
                page = [job_json(j) for j in found[:limit]]
                return page, page[-1]["id"] if len(found) > limit else None, total
            rows = list(s.execute(select(*RUN_ORDER_COLUMNS).where(*where)))
            holding = sorted((r for r in rows if r.state in ACTIVE), key=lambda r: r.id)
            waiting = [r for r in rows if r.state == "queued"]
            if self.delegated:
                # Slurm's order (its priority as of the last pass), not gpuslice's
                last = len(self.backend_order) + 1
                queued = sorted(waiting, key=lambda r: (self.backend_order.get(r.id, last), r.id))
            else:
                queued = queue_order(waiting, utcnow(), self.aging_seconds)
            position = {r.id: i + 1 for i, r in enumerate(queued)}
            # the jobs that will not run again (a state filter may ask for them), newest
            # first: every job counted in ``total`` is on some page
            done = sorted(
                (r for r in rows if r.state not in ACTIVE and r.state != "queued"),
                key=lambda r: -r.id,
            )
            ordered = holding + queued + done
            start = cursor or 0
            ids = [r.id for r in ordered[start : start + limit]]
            page_rows = select(JobRow).options(selectinload(JobRow.transitions))
            full = {j.id: j for j in s.scalars(page_rows.where(JobRow.id.in_(ids)))}
            page = []
            for i in ids:
                item = job_json(full[i])
                if i in position:
                    item["queue_position"] = position[i]
                page.append(item)
            end = start + len(ids)
            return page, end if end < len(ordered) else None, total

    def log_text(self, job: JobRow, tail_bytes: int) -> str:
        if not job.job_dir:
            return ""
        return JobDir(Path(job.job_dir), same_owner=True).log_tail(tail_bytes)

    def output(self, job: JobRow, kind: str, max_bytes: int) -> bytes | None:
        """The output notebook or its HTML, if the runner wrote one (a regular file, read
        without following links: the folder is the owner's)."""
        if not job.job_dir:
            return None
        jd = JobDir(Path(job.job_dir), same_owner=True)
        path = {"ipynb": jd.output_path, "html": jd.html_path}[kind]
        return jd.read(path.name, max_bytes)

    def current(self, job_id: int) -> Any:
        """The job's whole row as it is now, or None: a row, not an ORM object, and without
        its history (``row`` loads that too, which the scheduler never needs)."""
        with self.db.reading() as s:
            return CURRENT_ROW.execute(s.connection(), {"job_id": job_id}).first()

    def row(self, job_id: int) -> JobRow | None:
        """The job's row, its history loaded (it is read after the session closes)."""
        with self.db.reading() as s:
            return s.get(JobRow, job_id, options=[selectinload(JobRow.transitions)])

    def jobs_accounted(self, key: str = "slurm_job_id") -> set[str]:
        """The engine's names (``backend_ref[key]``: Slurm ids, Kubernetes Job names) of the
        jobs whose GPUs the job pass accounts for itself (the engine schedules them): every
        unfinished job's, but one the ledger could not record where the engine runs it. The
        mirror of the engine's holdings leaves these out, so neither a job the engine has
        just started (before the pass records it) nor one whose slice went to a server
        (while the engine still runs it) is taken for a foreign job; an unrecorded one, or
        the run of a finished job still ending, is held by the mirror."""
        with self.db.reading() as s:
            refs = s.scalars(select(JobRow.backend_ref).where(JobRow.state.not_in(TERMINAL)))
            return {
                str(ref[key]) for ref in refs if ref and ref.get(key) and not ref.get("unrecorded")
            }

    def slurm_jobs_submitting(self) -> set[tuple[str, str]]:
        """The (Slurm job name, account) of every unfinished job being handed to Slurm
        whose Slurm id is not known yet (written before sbatch runs, and kept while a
        timed-out submission is looked for): Slurm may already run it, and the mirror
        of Slurm's holdings must leave it out as it leaves out ``jobs_accounted``."""
        with self.db.reading() as s:
            rows = s.execute(
                select(JobRow.id, JobRow.backend_ref).where(JobRow.state.not_in(TERMINAL))
            )
            return {
                (slurm_job_name(job_id), str(ref["user"]))
                for job_id, ref in rows
                if ref and ref.get("attempt_id") and not ref.get("slurm_job_id") and ref.get("user")
            }

    # -- cancel and preempt --------------------------------------------------------------

    def cancel(self, job_id: int, actor: str, reason: str = "") -> dict[str, Any]:
        with self.db.writing() as s:
            job = s.get(JobRow, job_id)
            if job is None:
                raise Refused("not_found", f"no job {job_id}")
            if job.state in TERMINAL:
                raise Refused("wrong_state", f"job {job_id} is already {job.state}")
            ref, allocs = dict(job.backend_ref or {}), list(job.allocation_ids or [])
            was_active = job.state in ACTIVE
            detail = {"job_id": job_id, "name": job.name, "state": job.state}
            # an owner cancelling their own job is no admin action (not in the action log)
            kind = "job-cancelled-by-owner" if actor == job.user else "job-cancel-requested"
            record_admin_event(s, kind, job.user, actor, reason, detail)
            why = f"cancelled by {actor}" + (f": {reason}" if reason else "")
            if was_active and job.attempt_started_at is not None:
                # the run it stops counts as time on the GPU, as an ended run's does
                job.run_seconds += max(0.0, (utcnow() - job.attempt_started_at).total_seconds())
            transition(s, job, "cancelled", why)
            job.allocation_ids = []
            # nothing ran: its folder holds the notebook (which the owner has) and no more
            never_ran = not was_active and job.started_at is None
        if was_active:
            # (the runner is killed, and says nothing more: the log says why it stops here)
            self.log_line(job, f"{why}; stopping it")
            allocs = self._stop_cancelled(job, ref, allocs)
        elif self.delegated and current_ref(ref, self.queueing.ref_key):
            # waiting in the engine's queue (or ended there since the last pass)
            try:
                self.backend.kill(ref)
            except Exception as e:
                self.log.info("job %s: cancelling it in %s: %s", job_id, self.backend.name, e)
                never_ran = False  # (it may start there yet: the sweep removes it later)
        elif self.delegated and ref.get("unsure"):
            # a submission whose answer never came (it timed out, or the service died while
            # it was made): the engine may hold it all the same
            try:
                found = self.queueing.find(job_id, self.account(job.user))
                if found:
                    self.backend.kill({**ref, self.queueing.ref_key: found})
            except Exception as e:
                self.log.info("job %s: cancelling it in %s: %s", job_id, self.backend.name, e)
                never_ran = False
        self.release(allocs, f"job {job_id} cancelled")
        if never_ran:
            self._remove_folder(job.id, job.user, job.job_dir, utcnow())
        return self.get(job_id) or {}

    # -- job folders (folders.py) ---------------------------------------------------------

    def _remove_folder(self, job_id: int, user: str, job_dir: str, now: datetime) -> bool:
        """Remove an ended job's folder and record it; False when it could not go now."""
        freed = disk_bytes(Path(job_dir))
        try:
            remove_folder(self.root, job_dir)
        except OSError as e:
            self.log.warning("job %s: its folder %s could not be removed: %s", job_id, job_dir, e)
            return False
        record_removed(self.db, job_id, now)
        self.usage.forget(user)
        self._root_changed(-freed, -1)
        return True

    def _root_changed(self, delta: int, folders: int) -> None:
        """What a folder made or removed changes in the jobs root's size between two
        sweeps' measures (which each start from the disk again)."""
        with self._root_lock:
            size = self.root_size
            if size.bytes is not None:
                self.root_size = RootSize(
                    max(0, size.bytes + delta), max(0, size.folders + folders), size.measured_at
                )

    def sweep_folders(self, now: datetime, history_days: float = 0.0) -> Swept:
        """Remove the folders of ended jobs that are due (``folders.due_for_removal``), then
        measure the jobs root. Off the event loop: it walks folders."""
        swept = Swept()
        elsewhere = 0
        due = due_for_removal(self.db, now, self.job_folder_retention_days, history_days)
        for row in due:
            if row.id in self.kills_pending:
                continue  # (its run may still write there: once it is stopped)
            if not is_job_folder(self.root, row.job_dir):
                elsewhere += 1  # (under another jobs_root: not this service's to remove)
                continue
            if self._remove_folder(row.id, row.user, row.job_dir, now):
                swept.removed += 1
            else:
                swept.failed += 1
        if elsewhere:
            self.log.info("%d ended jobs' folders are outside %s: left alone", elsewhere, self.root)
        folders = sum(1 for _ in self.root.iterdir()) if self.root.is_dir() else 0
        measured = RootSize(disk_bytes(self.root), folders, now)
        with self._root_lock:
            self.root_size = measured
        return swept

    def outputs_collected(self, job_id: int) -> dict[str, Any]:
        """The owner's server copied the ended job's outputs into their ``gpu-jobs`` folder:
        its folder may go after ``job_folder_retention_days``."""
        with self.db.writing() as s:
            job = s.get(JobRow, job_id)
            if job is None:
                raise Refused("not_found", f"no job {job_id}")
            if job.state not in TERMINAL:
                raise Refused(
                    "wrong_state",
                    f"job {job_id} is {job.state}: its outputs are copied once it has ended",
                )
            if job.outputs_collected_at is None:
                job.outputs_collected_at = utcnow()
        return self.get(job_id) or {}

    def disk_standing(self) -> dict[str, Any]:
        """The jobs root's size as the last sweep measured it (the admin overview)."""
        size = self.root_size
        return {
            "path": str(self.root),
            "bytes": size.bytes,
            "folders": size.folders,
            "measured_at": iso(size.measured_at),
            "user_cap_bytes": self.max_job_folder_bytes_per_user or None,
            "retention_days": self.job_folder_retention_days,
        }

    def _stop_cancelled(self, job: Any, ref: dict[str, Any], allocs: list[int]) -> list[int]:
        """Stop a cancelled job's run; the slices that may go back now."""
        try:
            self.backend.kill(ref)
            return allocs
        except Exception as e:
            self.log.warning("job %s: could not stop its run: %s; trying again", job.id, e)
            self.log_line(job, f"could not stop its run ({e}); trying again")
        if self.delegated:
            # The engine's job may run on, but the slice goes back now: the mirror of the
            # engine's holdings counts a finished job's run that still runs as held
            # (``jobs_accounted``), so its GPU is not offered twice.
            self.kills_pending[job.id] = (ref, [])
            return allocs
        # Here the ledger alone keeps the GPU from the next holder: held until the run stops
        # (or, should the service stop first, until its restart: recovery.py).
        self.kills_pending[job.id] = (ref, allocs)
        return []

    def retry_kills(self) -> None:
        """Try again to stop the runs of cancelled jobs the backend could not stop; those
        stopped give their slices back."""
        for job_id, (ref, allocs) in list(self.kills_pending.items()):
            try:
                self.backend.kill(ref)
            except Exception as e:
                self.log.info("job %s: still could not stop its run: %s", job_id, e)
                continue
            self.kills_pending.pop(job_id, None)
            self.log.info("job %s: its run is stopped", job_id)
            self.release(allocs, f"job {job_id} cancelled")

    def defaults(self) -> dict[str, Any]:
        """What a submission that leaves these out gets, the largest max runtime, and the
        time windows a job may ask for."""
        return {
            "checkpoint_interval": self.default_checkpoint_interval,
            "max_runtime": self.default_max_runtime,
            "max_runtime_limit": self.max_runtime_limit,
            **self.window_standing(utcnow()),
        }

    def preempt(self, job_id: int, actor: str, reason: str) -> dict[str, Any]:
        """Ask a running job to checkpoint and give its slices back (killed after grace)."""
        with self.db.writing() as s:
            job = s.get(JobRow, job_id)
            if job is None:
                raise Refused("not_found", f"no job {job_id}")
            if job.state == "preempting":
                return job_json(job)
            if job.state not in ("starting", "running"):
                raise Refused("wrong_state", f"job {job_id} is {job.state}, not running")
            detail = {"job_id": job_id, "name": job.name, "state": job.state}
            record_admin_event(s, "job-preempt-requested", job.user, actor, reason, detail)
            transition(s, job, "preempting", f"{reason} (by {actor})")
            job.preempt_deadline = utcnow() + timedelta(seconds=self.preempt_grace)
            job.preemptions += 1
            ref = dict(job.backend_ref or {})
        self.log_line(job, f"preempting: {reason}")
        self.backend.signal_preempt(ref)
        self.wake.set()
        return self.get(job_id) or {}

    def _candidates(self) -> list[Any]:
        """The preemptible jobs that hold (or are giving back) slices: rows of the columns
        choosing a victim reads, not ORM objects (the spawn form asks at every look, and a
        backfilled cluster runs thousands of them)."""
        with self.db.reading() as s:
            return list(_CANDIDATES.execute(s.connection()).rows)

    def _victim_for(
        self,
        caller: Caller,
        profile: Profile,
        overcommit: bool,
        limit: int | None = None,
        candidates: list[Any] | None = None,
    ) -> Any:
        """The preemptible job whose slice a spawn of ``profile`` by ``caller`` would take
        (``pick_victim``), or None. ``overcommit``: as the spawn is placed (False: in full);
        ``limit``, ``candidates``: the spawn form's bounded look, at jobs it read once."""
        if candidates is None:
            candidates = self._candidates()
        request = self.ledger.request_for(caller.user, profile, "interactive", overcommit)
        return pick_victim(
            self.ledger,
            profile,
            candidates,
            below_rank=len(PRIORITY_CLASSES),
            access=self.ledger.access("interactive", caller.groups),
            request=request,
            limit=limit,
        )

    def _too_long(self, victim: JobRow, wait_seconds: float | None) -> str | None:
        """Why a spawn that waits at most ``wait_seconds`` does not preempt ``victim``
        (its grace period is longer: the spawn would give up first, and the job would have
        lost its work for nothing); None when it may."""
        if victim.state == "preempting" or wait_seconds is None:
            return None
        if self.preempt_grace <= wait_seconds:
            return None
        return (
            f"batch job {victim.id} could give its slice up, but it may take up to "
            f"{self.preempt_grace:g} s to checkpoint and this spawn waits at most "
            f"{wait_seconds:.0f} s (an admin can raise Spawner.start_timeout and "
            "GPUSliceMixin.preempt_wait_timeout above JobManager.preempt_grace)"
        )

    def spawn_preemption(
        self,
        caller: Caller,
        profiles: list[Profile],
        overcommit: bool,
        wait_seconds: float | None,
    ) -> dict[str, float | str | None]:
        """For the spawn form (the ledger's ``spawn_preemption`` hook), per profile: what a
        spawn of it that finds none free would get, by the check ``preempt_for_interactive``
        makes (on the first ``FORM_VICTIMS`` candidates: a bounded look that may miss a
        later one; what it finds, a spawn made at that moment would find too). None: no
        job would make room; a str: one would, not within the spawn's wait (why not); else
        the seconds the spawn may wait for it (0: the cluster's engine preempts it). The
        jobs are read once for all the profiles."""
        candidates = self._candidates() if profiles else []
        out: dict[str, float | str | None] = {}
        for profile in profiles:
            victim = (
                self._victim_for(caller, profile, overcommit, FORM_VICTIMS, candidates)
                if candidates
                else None
            )
            if victim is None:
                out[profile.name] = None
            elif self.delegated:
                out[profile.name] = 0.0
            else:
                out[profile.name] = self._too_long(victim, wait_seconds) or float(
                    self.preempt_grace
                )
        return out

    def preempt_for_interactive(
        self,
        caller: Caller,
        profile: Profile,
        server_name: str,
        wait_seconds: float | None,
        overcommit: bool = True,
    ) -> dict[str, Any] | str | None:
        """The ledger's hook: free a slice for an interactive spawn, or None if no job can.

        A job is only preempted when its grace period fits in the spawn's ``wait_seconds``:
        a spawn that gives up first would have cost the job its work for nothing. Then the
        answer is why not (a str). ``overcommit``: as the spawn is placed (False: in
        full, as the Kubernetes and Slurm spawners ask)."""
        key = (caller.user, server_name)
        held = self.reservations.get(key)
        if held is not None:
            job = self.current(held.job_id)
            if job is not None and job.state == "preempting":
                return self._pending(job, "your server will start when it has checkpointed")
        victim = self._victim_for(caller, profile, overcommit)
        if victim is None:
            return None
        if self.delegated:
            row = self.current(victim.id)  # (the victim is a row of VICTIM_COLUMNS only)
            if row is not None and row.state == "preempting":
                # asked already (an admin's preemption): it gives its slice up when it exits
                return self._pending(row, "your server will start when it has checkpointed")
            freed = None if row is None else self._engine_preempts(row, caller, profile)
            return freed or self._ended_first(victim)
        why = self._too_long(victim, wait_seconds)
        if why is not None:
            return why
        if victim.state != "preempting":
            reason = f"{profile.name} needed by {_whose_server(caller, victim.user)}"
            try:
                self.preempt(victim.id, "scheduler", reason)
            except Refused:
                return self._ended_first(victim)
        job = self.current(victim.id)
        assert job is not None
        deadline = job.preempt_deadline or utcnow()
        self.reservations[key] = Reservation(job.id, profile.name, deadline + timedelta(seconds=30))
        return self._pending(job, "your server will start when it has checkpointed")

    def _engine_preempts(self, job: Any, caller: Caller, profile: Profile) -> dict[str, Any] | None:
        """The engine schedules: the job's slice goes to the interactive server now, and the
        engine preempts the job when the server needs the GPU (Slurm's
        ``PreemptMode=REQUEUE``: the server's partition or QOS must be allowed to preempt the
        job's; Kubernetes: the server pod's priority is above gpuslice-preemptible's).
        Should it not do so within ``preempt_grace``, the service asks the job to checkpoint
        and stop."""
        engine = self.queueing.engine
        unit = "pod" if engine == "Kubernetes" else "job"  # what a server is to the engine
        reason = (
            f"{profile.name} needed by {_whose_server(caller, job.user)}: "
            f"{engine} preempts it when that server's {unit} starts"
        )
        with self.db.writing() as s:
            row = s.get(JobRow, job.id)
            if row is None or row.state not in ("starting", "running"):
                return None
            detail = {"job_id": row.id, "name": row.name, "state": row.state}
            record_admin_event(s, "job-preempt-requested", row.user, "scheduler", reason, detail)
            transition(s, row, "preempting", reason)
            row.preempt_deadline = utcnow() + timedelta(seconds=self.preempt_grace)
            row.preemptions += 1
            allocs, row.allocation_ids = list(row.allocation_ids or []), []
            row.backend_ref = {**(row.backend_ref or {}), "preempted_by": self.backend.name}
        self.log_line(job, f"preempting: {reason}")
        self.release(
            allocs, f"job {job.id} preempted by {engine} for {_whose_server(caller, job.user)}"
        )
        self.wake.set()
        return {
            "job_id": job.id,
            "retry_after": 1,
            "message": (
                f"Batch job {job.id} gives its slice up: {engine} preempts it for your server"
            ),
        }

    @staticmethod
    def _ended_first(victim: Any) -> dict[str, Any]:
        """The job a spawn picked ended (cancelled, completed, requeued) before it was asked
        to give its slice up: the slice is free or about to be, and the spawn's next try
        finds it."""
        return {
            "job_id": victim.id,
            "retry_after": 1,
            "message": "A batch job has just given a slice up; asking for it again",
        }

    def _pending(self, job: Any, what: str) -> dict[str, Any]:
        left = ((job.preempt_deadline or utcnow()) - utcnow()).total_seconds()
        return {
            "job_id": job.id,
            # the slice is free the moment the job exits: ask again soon, not every 5 s
            "retry_after": 1 if left < 30 else 2,
            "message": f"Preempting batch job {job.id} to free a slice; {what}",
        }

    # -- helpers shared with the scheduler -----------------------------------------------

    def release(self, allocation_ids: list[int], reason: str) -> None:
        for alloc_id in allocation_ids:
            try:
                self.ledger.release(alloc_id, "scheduler", reason)
            except Refused as e:
                self.log.warning("could not release allocation %s: %s", alloc_id, e.message)

    def log_line(self, job: Any, message: str) -> None:
        """Append ``message`` to the log of ``job`` (anything with its ``id`` and ``job_dir``):
        only to a log that is the folder owner's own file with no other name (a hard link
        the job's code put there, to another user's file, is left alone, and this logged)."""
        if not job.job_dir:
            return
        try:
            JobDir(Path(job.job_dir), same_owner=True).log(f"service: {message}", create=False)
        except OSError as e:
            self.log.warning("job %s: cannot write its log: %s", job.id, e)


def _int_in(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _num_in(v: Any, lo: float, hi: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi


def _whose_server(caller: Caller, job_owner: str) -> str:
    """The server a job is preempted for, as its owner may read it (the job's log, its
    transitions, the release of its slice): never another user's name."""
    if caller.user == job_owner:
        return "your interactive server"
    return "another user's interactive server"
