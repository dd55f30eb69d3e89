"""Jobs as Slurm batch jobs, scheduled by Slurm.

A job is handed to Slurm when it is submitted (``sbatch --requeue``, the profile's
``--gres`` times its slices, its priority class's partition and QOS, a warning signal
before the time limit, output appended across restarts). Slurm's queue is the queue: its
priorities, fairshare, limits, backfill and accounting decide when and where it runs; the
service reads every job's state with one ``squeue`` per pass (:meth:`SlurmBackend.records`),
and the ledger records the slice where Slurm runs it (:mod:`gpuslice_hub.jobs.delegated`).

When Slurm preempts the job (``PreemptMode=REQUEUE``, e.g. for an interactive server in a
higher-priority partition or QOS) it sends SIGTERM to the batch script — which *is* the
runner (``exec``) — so the runner checkpoints and exits 75 within ``KillWait``; Slurm puts
the job back in its queue and, when it runs again, the runner resumes from the job folder
(a shared filesystem).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from gpuslice.vocab import EXIT_BY_STATUS
from gpuslice_spawner.launchers.slurm import SlurmGres, grants_sbatch_options

from ...profiles import Profile
from ...slurmusage import HOLDING_STATES, expand_hostlist
from ..accounts import Account
from .base import RunStatus, SubmitRefused, SubmitUnsure, profile_grant
from .local import _runner_status

log = logging.getLogger(__name__)

# What sbatch/scontrol/scancel themselves get from the service's environment: enough to find
# the commands and the cluster, nothing else (the job's environment is in its script).
COMMAND_ENV_KEEP = ("PATH", "SLURM_CONF", "LANG", "LC_ALL", "TZ")


# What a pass reads of each job: squeue --Format's name, and the key squeue --json gives it
RECORD_FIELDS = (
    ("JobID", "job_id"),
    ("State", "job_state"),
    ("NodeList", "nodes"),
    ("Reason", "state_reason"),
    ("PriorityLong", "priority"),
    ("RestartCnt", "restart_cnt"),
    ("exit_code", "exit_code"),
    ("Partition", "partition"),
    # when the job may start and when it was (re)queued: tells Slurm's own hold after a
    # requeue from a deferral someone set (see requeue_hold)
    ("EligibleTime", "eligible_time"),
    ("SubmitTime", "submit_time"),
)
# How long slurmctld holds a job back after a requeue (its BeginTime: the requeue time, which
# becomes its submit time, plus 121 s on Slurm 22.05, measured on the test cluster); a
# BeginTime later than that was set by someone (``scontrol update StartTime=``), and stays.
REQUEUE_HOLD_SECONDS = 130.0
# A requeue revokes the job's launch credential on its node, and slurmd refuses every
# credential made in the second of the revocation or before ("Job credential revoked": the
# job FAILS). A requeued job let go in that same second would be started with such a
# credential, so it may start no sooner than this after its requeue (its submit time).
AFTER_REQUEUE_SECONDS = 2
# sbatch errors that trying again cannot mend: the job fails with Slurm's message
PERMANENT = (
    "Requested node configuration is not available",
    "Invalid partition",
    "Invalid qos",
    "Invalid generic resource",
    "Invalid account",
    "Invalid feature",
)
NUMERIC = {"job_id", "priority", "restart_cnt", "exit_code"}
FILTER_MAX = 300  # job ids asked for by --jobs; more: the whole queue (see records())
SEP = "|"


def parse_records(out: str) -> dict[str, dict[str, Any]]:
    """``squeue --noheader --Format=<RECORD_FIELDS, each followed by |>`` as records by id.
    A line that does not have every field is an error: nothing is concluded from it."""
    records: dict[str, dict[str, Any]] = {}
    for line in out.splitlines():
        if not line.strip():
            continue
        values = line.split(SEP)
        if len(values) != len(RECORD_FIELDS) + 1 or values[-1].strip():
            raise RuntimeError(f"squeue printed an unexpected line: {line[:200]!r}")
        record: dict[str, Any] = {}
        for (_, key), value in zip(RECORD_FIELDS, values, strict=False):
            value = value.strip()
            record[key] = (int(value) if value.isdigit() else None) if key in NUMERIC else value
        records[str(record["job_id"])] = record
    return records


def exit_code(raw: object) -> int | None:
    """The batch script's exit code from squeue's ``exit_code`` (a wait status: the code in
    the high byte); None when a signal ended it (no code to tell)."""
    if not isinstance(raw, int) or raw < 0:
        return None
    return None if raw & 0x7F else (raw >> 8) & 0xFF


def default_prefix() -> list[str]:
    """How the service runs a Slurm command as a job's owner."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "{username}", "--"]
    return ["sudo", "-n", "-u", "{username}", "--"]


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# a node feature expression (--constraint): features joined by & | , with brackets, counts
# and alternatives; one token, no space or newline (it is written into the script)
CONSTRAINT = re.compile(r"[A-Za-z0-9_.&|,()\[\]*:!-]+")
# The per-class sbatch options an admin sets (JobManager.slurm_*), and how each is checked
CLASS_OPTIONS = {"account": NAME, "reservation": NAME, "constraint": CONSTRAINT, "qos": NAME}
CLASS_TRAITS = {
    "account": "slurm_accounts",
    "reservation": "slurm_reservations",
    "constraint": "slurm_constraints",
    "qos": "slurm_qos",
}


def requeue_hold(record: dict[str, Any]) -> bool:
    """Whether a pending job's ``BeginTime`` is the one slurmctld itself set on a requeue
    (the job was requeued, and may start no later than ``REQUEUE_HOLD_SECONDS`` after its
    requeue): only that one is lifted. A deferral an admin (or the owner) set with
    ``scontrol update StartTime=`` is later, or on a job never requeued, and stays."""
    if str(record.get("state_reason") or "") != "BeginTime":
        return False
    restarts = record.get("restart_cnt")
    if not isinstance(restarts, int) or restarts < 1:
        return False
    eligible, submitted = _when(record.get("eligible_time")), _when(record.get("submit_time"))
    if eligible is None or submitted is None:
        return False  # not told: leave it as Slurm has it
    return (eligible - submitted).total_seconds() <= REQUEUE_HOLD_SECONDS


def _when(value: object) -> datetime | None:
    """squeue's time (``2026-12-07T15:34:19``, local time, as both times are)."""
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def waiting_words(state: str, record: dict[str, Any]) -> str:
    """Why a job waits in Slurm, in words: Slurm's reason, and who holds it back where
    someone does (an admin's hold or deferral is shown, never undone)."""
    reason = str(record.get("state_reason") or "")
    said = f"{state.lower()} in Slurm ({reason or 'no reason given'})"
    if reason == "BeginTime" and not requeue_hold(record):
        return f"{said}: deferred in Slurm until {record.get('eligible_time') or 'later'}"
    if reason == "JobHeldAdmin":
        return f"{said}: held in Slurm by an admin until released (scontrol release)"
    if reason == "JobHeldUser":
        return f"{said}: held in Slurm by its owner until released (scontrol release)"
    return said


ALIVE = {
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "SUSPENDED",
    "CONFIGURING",
    "COMPLETING",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
}
# (PREEMPTED is final: a job Slurm requeues after a preemption is PENDING again)


def job_name(job_id: int) -> str:
    """The Slurm job name of gpuslice's job ``job_id`` (how a submission whose sbatch did
    not answer is found, and left out of the mirror of foreign work)."""
    return f"gpuslice-{job_id}"


def batch_script(
    job_id: int,
    job_dir: str,
    python: str,
    placement: Sequence[str] = (),
    partition: str = "",
    time_limit_minutes: int = 0,
    warn_seconds: int = 60,
    env: dict[str, str] | None = None,
    extra: Sequence[str] = (),
    qos: str = "",
    account: str = "",
    reservation: str = "",
    constraint: str = "",
) -> str:
    """The sbatch script of a job (pure: tested without a cluster). ``placement``: what
    the job asks Slurm for, ``--gres`` (:func:`profile_sbatch_options`); ``account``,
    ``reservation``, ``constraint``, ``qos``: its class's (``JobManager.slurm_*``)."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name(job_id)}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={job_dir}/slurm.out",
        f"#SBATCH --chdir={job_dir}",
        # B: to the batch shell, which exec's the runner: it checkpoints and exits 75
        f"#SBATCH --signal=B:USR1@{warn_seconds}",
        # Nothing of the submitting environment: the job's allow-list is exported below.
        "#SBATCH --export=NONE",
    ]
    lines += [f"#SBATCH {opt}" for opt in placement]
    given = {
        "partition": partition,
        "qos": qos,
        "account": account,
        "reservation": reservation,
        "constraint": constraint,
    }
    for option, value in given.items():
        if value:
            if not CLASS_OPTIONS.get(option, NAME).fullmatch(value):
                raise ValueError(f"{option} {value!r} is not a Slurm {option} name")
            lines.append(f"#SBATCH --{option}={value}")
    if time_limit_minutes:
        lines.append(f"#SBATCH --time={time_limit_minutes}")
    lines += [f"#SBATCH {opt}" for opt in extra]
    for k, v in sorted((env or {}).items()):
        lines.append(f"export {k}={shlex.quote(v)}")
    # Slurm picks the device: it sets CUDA_VISIBLE_DEVICES for gpu gres; a shard/mps job
    # gets only GPU_DEVICE_ORDINAL (see tests/harness/slurm.py)
    lines.append('export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-${GPU_DEVICE_ORDINAL:-}}"')
    lines.append(f"exec {shlex.quote(python)} -m gpuslice.run {shlex.quote(job_dir)}")
    return "\n".join(lines) + "\n"


def profile_sbatch_options(profile: Profile, slices: int, gres: SlurmGres) -> list[str]:
    """What a job of ``slices`` slices of ``profile`` asks Slurm for: their gres summed
    (one node; Slurm chooses which), the spawner's translation without a host."""
    return grants_sbatch_options([profile_grant(profile)] * slices, gres)


class SlurmBackend:
    name = "slurm"
    # Slurm queues, orders, places, preempts and requeues the jobs: the scheduler submits
    # them at once and records where Slurm runs them (RunStatus.node; delegated.py).
    schedules_itself = True
    engine = "Slurm"
    ref_key = "slurm_job_id"

    def __init__(
        self,
        python: str,
        partition: str = "",
        gres: SlurmGres | None = None,
        env: dict[str, str] | None = None,
        time_limit_minutes: int = 0,
        partitions: dict[str, str] | None = None,
        qos: dict[str, str] | None = None,
        submit_prefix: Sequence[str] | None = None,
        accounts: dict[str, str] | None = None,
        reservations: dict[str, str] | None = None,
        constraints: dict[str, str] | None = None,
    ) -> None:
        self.python = python
        self.partition = partition
        self.gres = gres or SlurmGres()
        self.partitions = partitions or {}
        self.qos = qos or {}
        # per priority class: charged to a project, sent into a reservation, onto features
        self.accounts = accounts or {}
        self.reservations = reservations or {}
        self.constraints = constraints or {}
        self.env = env  # the environment Slurm commands run with (SLURM_CONF …)
        self.time_limit_minutes = time_limit_minutes
        self.submit_prefix = list(submit_prefix) if submit_prefix else default_prefix()

    def _as(self, ref: dict[str, Any]) -> list[str]:
        """The prefix that runs a command as the job's owner (none for the service's own)."""
        user = ref.get("user")
        if not user or user == Account.current().name:
            return []
        return [part.replace("{username}", str(user)) for part in self.submit_prefix]

    def _run(self, *argv: str, stdin: str | None = None, ref: dict[str, Any] | None = None) -> str:
        source = self.env if self.env is not None else os.environ
        argv = (*self._as(ref or {}), *argv)
        out = subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
            env={k: source[k] for k in COMMAND_ENV_KEEP if k in source},
        )
        if out.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {out.stderr.strip()}")
        return out.stdout

    def submit(
        self,
        job_id: int,
        job_dir: str,
        env: dict[str, str],
        profile: Profile,
        slices: int,
        priority: str,
        account: Account | None = None,
        attempt: str = "",
    ) -> dict[str, Any]:
        """Hand the job to Slurm's queue; returns the reference stored in the job row."""
        account = account or Account.current()
        try:
            options = profile_sbatch_options(profile, slices, self.gres)
        except ValueError as e:  # a profile its gres cannot name
            raise SubmitRefused(str(e), permanent=True) from None
        script = batch_script(
            job_id,
            job_dir,
            self.python,
            options,
            self.partitions.get(priority, self.partition),
            self.time_limit_minutes,
            env=env,
            qos=self.qos.get(priority, ""),
            account=self.accounts.get(priority, ""),
            reservation=self.reservations.get(priority, ""),
            constraint=self.constraints.get(priority, ""),
        )
        # Submitted as the owner: Slurm's accounting, fairshare and limits see the real user,
        # and slurmd starts the job under the owner's uid.
        owner = {"user": account.name}
        try:
            slurm_id = self._run("sbatch", "--parsable", stdin=script, ref=owner)
        except subprocess.TimeoutExpired as e:
            raise SubmitUnsure("sbatch timed out") from e
        except RuntimeError as e:
            message = str(e)
            permanent = any(word in message for word in PERMANENT)
            raise SubmitRefused(message, permanent) from e
        except OSError as e:  # sbatch (or the prefix's runuser/sudo) not found: an admin mends it
            raise SubmitRefused(f"sbatch could not be run: {e}", False) from e
        return {
            "slurm_job_id": slurm_id.strip().split(";")[0],
            "job_dir": job_dir,
            "attempt_id": attempt,
            **owner,
        }

    def records(self, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """slurmctld's records of ``job_ids``, by id, with the fields the pass reads (named
        as ``squeue --json`` names them): one ``squeue`` for all of them. A job slurmctld no
        longer remembers (after ``MinJobAge``) is absent.

        ``--Format`` with a separator rather than ``--json``: the JSON of a job is ~3 KB
        (its whole record), and at thousands of queued jobs printing and parsing it cost
        most of a pass; these seven fields are what a pass needs (no width: nothing is
        padded or cut)."""
        if not job_ids:
            return {}
        fields = ",".join(f"{name}:{SEP}" for name, _ in RECORD_FIELDS)
        # squeue matches --jobs against each job in turn: 3 000 ids over 3 000 jobs took
        # 189 ms, the whole queue without the filter 32 ms. Past a few hundred ids, read the
        # whole queue and pick ours out.
        wanted = [f"--jobs={','.join(job_ids)}"] if len(job_ids) <= FILTER_MAX else []
        argv = ["squeue", "--all", "--noheader", "--states=all", f"--Format={fields}"]
        try:
            out = self._run(*argv, *wanted)
        except RuntimeError as e:
            # one id slurmctld no longer knows (MinJobAge) fails the filtered query as a
            # whole ("Invalid job id specified"): read the queue and pick ours out
            if not wanted or "Invalid job id" not in str(e):
                raise
            wanted = []
            out = self._run(*argv)
        records = parse_records(out)
        if not wanted:
            records = {i: records[i] for i in job_ids if i in records}
        return records

    def find(self, job_id: int, account: Account) -> str:
        """A Slurm job of ``job_id`` (its name, as submitted by its owner), or ""."""
        out = self._run(
            "squeue",
            "--noheader",
            "--states=all",
            f"--name={job_name(job_id)}",
            f"--user={account.name}",
            "--Format=JobID:|",
        )
        ids = [line.split(SEP)[0].strip() for line in out.splitlines() if line.strip()]
        return ids[-1] if ids else ""

    def poll(self, ref: dict[str, Any]) -> RunStatus:
        return self.poll_many([ref])[0]

    def poll_many(self, refs: Sequence[dict[str, Any]]) -> list[RunStatus]:
        """Every run's status from one query (a pass used to fork scontrol per job)."""
        ids = [str(ref["slurm_job_id"]) for ref in refs if ref.get("slurm_job_id")]
        records = self.records(ids)
        return [self._status(ref, records.get(str(ref.get("slurm_job_id")))) for ref in refs]

    def _status(self, ref: dict[str, Any], record: dict[str, Any] | None) -> RunStatus:
        if record is None:
            # gone from slurmctld's memory (MinJobAge): the runner's own record tells
            status = _runner_status(str(ref.get("job_dir", ""))) or ""
            return RunStatus(False, EXIT_BY_STATUS.get(status))
        state = str(record.get("job_state", "")).upper()
        if state not in ALIVE:
            return RunStatus(False, exit_code(record.get("exit_code")), state=state)
        restarts = record.get("restart_cnt")
        run = restarts if isinstance(restarts, int) else None
        if state in HOLDING_STATES or state == "COMPLETING":
            # (COMPLETING: ending, still on its node; the external mirror leaves it out)
            nodes = expand_hostlist(str(record.get("nodes") or ""))
            return RunStatus(
                True,
                node=nodes[0] if nodes else "",
                run=run,
                completing=state == "COMPLETING",
                state=state,
                partition=str(record.get("partition") or ""),
            )
        if requeue_hold(record):
            # slurmctld holds a requeued job back for a while (gpuslice never asks for a
            # begin time): let it run as soon as it fits. Only that hold: a deferral an
            # admin set is theirs (requeue_hold), and is shown as the reason it waits.
            try:
                self.release_requeued(ref, record)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                # the state is known all the same: the next pass tries again
                log.info("Slurm job %s: could not release it: %s", ref["slurm_job_id"], e)
        priority = record.get("priority")
        return RunStatus(
            True,
            waiting=waiting_words(state, record),
            priority=priority if isinstance(priority, int) else None,
            run=run,
            state=state,
            partition=str(record.get("partition") or ""),
        )

    def release_requeued(self, ref: dict[str, Any], record: dict[str, Any]) -> None:
        """Let a requeued job start as soon as it fits: slurmctld otherwise holds it back
        (``BeginTime``, set with ``StartTime=``) for a while after a requeue. Called for
        that hold only (:func:`requeue_hold`). Not in the requeue's own second
        (``AFTER_REQUEUE_SECONDS``): a time already past is "now" to slurmctld."""
        submitted = _when(record.get("submit_time"))
        start = "now"
        if submitted is not None:
            start = (submitted + timedelta(seconds=AFTER_REQUEUE_SECONDS)).isoformat()
        self._run(
            "scontrol", "update", f"jobid={ref['slurm_job_id']}", f"StartTime={start}", ref=ref
        )

    def home_partition(self, priority: str) -> str:
        """The partition a job of ``priority`` is submitted to ("": Slurm's default)."""
        return self.partitions.get(priority, self.partition)

    def move(self, ref: dict[str, Any], partition: str) -> None:
        """Move a pending job to ``partition`` (burst, and back). Slurm refuses once the
        job has started: the move then did not happen (RuntimeError)."""
        self._run(
            "scontrol", "update", f"jobid={ref['slurm_job_id']}", f"Partition={partition}", ref=ref
        )

    def signal_preempt(self, ref: dict[str, Any]) -> None:
        self._run("scancel", "--batch", "--signal=TERM", str(ref["slurm_job_id"]), ref=ref)

    def kill(self, ref: dict[str, Any]) -> None:
        self._run("scancel", str(ref["slurm_job_id"]), ref=ref)


def check_class_options(settings: Mapping[str, Mapping[str, str]], classes: Sequence[str]) -> None:
    """Refuse at start a per-class sbatch option Slurm could not take (``settings``: option
    -> class -> value, from ``JobManager.slurm_accounts`` etc.): a class that does not
    exist, or a value that is no Slurm name (a feature expression for constraints)."""
    from ...errors import ConfigError

    for option, by_class in settings.items():
        trait = f"JobManager.{CLASS_TRAITS[option]}"
        for cls, value in by_class.items():
            if cls not in classes:
                raise ConfigError(trait, f"{cls!r} is no priority class ({', '.join(classes)})")
            if value and not (isinstance(value, str) and CLASS_OPTIONS[option].fullmatch(value)):
                raise ConfigError(trait, f"{cls}: {value!r} is not a Slurm {option}")
