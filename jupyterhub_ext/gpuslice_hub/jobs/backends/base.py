"""What the scheduler needs from a backend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpuslice.errors import GPUSliceError

if TYPE_CHECKING:
    from ...profiles import Profile
    from ..accounts import Account


@dataclass(frozen=True)
class RunStatus:
    """``alive``: the run still exists; otherwise ``exit_code`` (None when unknown, e.g. the
    process was killed by a signal or vanished while the service was down)."""

    alive: bool
    exit_code: int | None = None
    # A backend that schedules itself (Slurm): the node the run holds its GPUs on now, or
    # "" while it waits in the backend's queue, and then the backend's reason for waiting.
    node: str = ""
    waiting: str = ""
    priority: int | None = None  # the backend's priority of a waiting run (higher: sooner)
    # which run of the backend's job this is: a requeued job runs again as a new run
    # (Slurm: its restart count; Kubernetes: the name of the Job's pod)
    run: int | str | None = None
    completing: bool = False  # ending on ``node`` (a run that ended, never a new one)
    state: str = ""  # the backend's word for it (Slurm: PENDING, CANCELLED, ...), for messages
    partition: str = ""  # Slurm: the partition the job is in (burst.py)
    # The backend writes the run's folder itself and vouches that it wrote nothing there
    # since it was last asked (the simulator's backend): the pass keeps what it read of the
    # folder without a stat. A real runner writes its own folder: False for every real one.
    files_unchanged: bool = False


class Backend(Protocol):
    """What every backend answers: the state of its runs, preemption and kill."""

    name: str

    def poll(self, ref: dict[str, Any]) -> RunStatus: ...

    def poll_many(self, refs: Sequence[dict[str, Any]]) -> list[RunStatus]:
        """``poll`` of each of ``refs``, in order (one query where the backend can)."""

    def signal_preempt(self, ref: dict[str, Any]) -> None:
        """Ask the runner to checkpoint and stop (it exits with 75)."""

    def kill(self, ref: dict[str, Any]) -> None:
        """Stop the run now (after the grace period, on cancel, on timeout)."""

    # A backend may also have ``changed_jobs() -> Collection[int]``: the ids of the jobs
    # whose run ``poll_many`` might no longer answer alive with ``files_unchanged`` since
    # it was last asked about them (a run started, ended or wrote its folder). Only a
    # backend that writes the folders itself can tell (the simulator's); with it a pass
    # asks about, and looks at, only the jobs that might need it (watchlist.py).


class PlacedBackend(Backend, Protocol):
    """A backend that runs a job where the ledger placed it (local, Kubernetes)."""

    def start(
        self,
        job_id: int,
        job_dir: str,
        env: dict[str, str],
        grants: Sequence[dict[str, Any]],
        priority: str,
        previous: dict[str, Any],
        account: Account,
    ) -> dict[str, Any]:
        """Start the runner as ``account`` with exactly the environment ``env``, holding
        the slices ``grants`` (the ledger's allocations: kind, host, assignments) (or,
        ``previous`` still queued in the backend, let it run again); returns the reference
        stored in the job row."""


class SubmitUnsure(GPUSliceError):
    """Submitting timed out: the backend may have queued the job all the same (the pass
    looks for it with :meth:`QueueingBackend.find` before submitting again)."""


class SubmitRefused(GPUSliceError):
    """The backend refused a submission; ``permanent``: trying again cannot mend it (an
    invalid request), otherwise it is retried with backoff (a limit, a busy controller)."""

    def __init__(self, message: str, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


class QueueingBackend(Backend, Protocol):
    """A backend with its own queue and placement (Slurm, Kubernetes): jobs are handed to it
    when they are submitted, and :class:`RunStatus` says where each one runs (``node``)."""

    schedules_itself: bool
    engine: str  # its name in messages ("Slurm")
    ref_key: str  # the key of a job row's ``backend_ref`` that names the backend's job

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
        """Queue the runner as ``account`` with exactly the environment ``env``, asking for
        ``slices`` slices of ``profile``; returns the reference stored in the job row."""

    def find(self, job_id: int, account: Account) -> str:
        """The id of a run of ``job_id`` the backend queued although submitting it seemed
        to fail (a timeout), or ""."""


def current_ref(ref: dict[str, Any] | None, key: str) -> bool:
    """Whether ``ref`` names an engine's job (``ref[key]``) the service has not accounted
    the end of."""
    return bool(ref and ref.get(key) and not ref.get("ended"))


def profile_grant(profile: Profile) -> dict[str, Any]:
    """One slice of ``profile`` in the shape of a ledger grant, without a host or devices:
    what the spawner's translators (Slurm gres, pod resources) need to name it when the
    engine, not the ledger, chooses the node and device."""
    # a profile open to several models names none: the engine picks the model
    model = profile.models[0] if len(profile.models) == 1 else None
    if profile.kind == "mig":
        mig: dict[str, Any] = {"mig_profile": profile.mig_profile, "gpu_model": model}
        return {"kind": "mig", "assignments": [mig]}
    if profile.kind == "share":
        share: dict[str, Any] = {"milli": profile.gpu_milli, "gpu_model": model}
        share["memory_mib"] = profile.gpu_memory_mib  # the cap HAMi enforces
        return {"kind": "share", "assignments": [share]}
    return {"kind": "gpu", "assignments": [{"gpu_model": model}] * profile.count}
