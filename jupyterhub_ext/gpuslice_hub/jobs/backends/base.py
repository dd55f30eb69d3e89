"""What the scheduler needs from a backend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

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
    restarts: int | None = None  # how often the backend has requeued the run (Slurm)
    completing: bool = False  # ending on ``node`` (a run that ended, never a new one)
    state: str = ""  # the backend's word for it (Slurm: PENDING, CANCELLED, ...), for messages


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


class QueueingBackend(Backend, Protocol):
    """A backend with its own queue and placement (Slurm): jobs are handed to it when they
    are submitted, and :class:`RunStatus` says where each one runs (``node``)."""

    schedules_itself: bool

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
