"""What the scheduler needs from a backend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..accounts import Account


@dataclass(frozen=True)
class RunStatus:
    """``alive``: the run still exists; otherwise ``exit_code`` (None when unknown, e.g. the
    process was killed by a signal or vanished while the service was down)."""

    alive: bool
    exit_code: int | None = None


class Backend(Protocol):
    name: str

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

    def poll(self, ref: dict[str, Any]) -> RunStatus: ...

    def poll_many(self, refs: Sequence[dict[str, Any]]) -> list[RunStatus]:
        """``poll`` of each of ``refs``, in order (one query where the backend can)."""

    def signal_preempt(self, ref: dict[str, Any]) -> None:
        """Ask the runner to checkpoint and stop (it exits with 75)."""

    def kill(self, ref: dict[str, Any]) -> None:
        """Stop the run now (after the grace period, on cancel, on timeout)."""
