"""The embedded default: each job's runner is a subprocess of the service host.

The runner starts in a session of its own, so it outlives a service restart; the service
finds it again by pid and start time (a recycled pid is not mistaken for it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from gpuslice.run.jobdir import JobDir, open_beneath
from gpuslice.vocab import EXIT_BY_STATUS

from ..accounts import UMASK, Account
from .base import RunStatus


class LocalBackend:
    name = "local"

    def __init__(self, python: str = "") -> None:
        self.python = python or sys.executable
        self._procs: dict[int, subprocess.Popen] = {}

    def start(
        self,
        job_id: int,
        job_dir: str,
        env: dict[str, str],
        grants: Sequence[dict[str, Any]] = (),
        priority: str = "",
        previous: dict[str, Any] | None = None,
        account: Account | None = None,
    ) -> dict[str, Any]:
        account = account or Account.current()
        # As the owner (uid, groups), like LocalProcessSpawner; nothing of the service's
        # environment but what ``env`` (an allow-list) holds.
        who: dict[str, Any] = {}
        if not account.is_current:
            who = {"user": account.uid, "group": account.gid, "extra_groups": list(account.groups)}
        out = open_beneath(Path(job_dir), "runner.out", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            if not account.is_current:
                os.fchown(out, account.uid, account.gid)
            proc = subprocess.Popen(
                [self.python, "-m", "gpuslice.run", job_dir],
                cwd=job_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                umask=UMASK,
                **who,
            )
        finally:
            os.close(out)
        self._procs[proc.pid] = proc
        return {
            "pid": proc.pid,
            "create_time": _create_time(proc.pid),
            "job_dir": job_dir,
            "uid": account.uid,
        }

    def poll_many(self, refs: Sequence[dict[str, Any]]) -> list[RunStatus]:
        return [self.poll(ref) for ref in refs]

    def poll(self, ref: dict[str, Any]) -> RunStatus:
        pid = int(ref.get("pid") or 0)
        proc = self._procs.get(pid)
        if proc is not None:
            code = proc.poll()
            if code is None:
                return RunStatus(True)
            del self._procs[pid]
            return RunStatus(False, code if code >= 0 else None)
        # Not our child (the service restarted): alive if the same process still exists,
        # and its outcome from the state file the runner wrote last.
        if pid and _same_process(pid, ref):
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    return RunStatus(True)
        status = _runner_status(ref.get("job_dir", ""))
        return RunStatus(False, EXIT_BY_STATUS.get(status or ""))

    def signal_preempt(self, ref: dict[str, Any]) -> None:
        self._signal(ref, signal.SIGTERM)

    def kill(self, ref: dict[str, Any]) -> None:
        self._signal(ref, signal.SIGKILL, group=True)
        # The kernel runs in a session of its own: it would notice its parent is gone
        # within a second or so, but a killed job should free the GPU now.
        kernel = _kernel_pid(ref.get("job_dir", ""))
        if kernel and _is_kernel(kernel, ref.get("job_dir", ""), ref.get("uid")):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(kernel, signal.SIGKILL)

    def _signal(self, ref: dict[str, Any], sig: int, group: bool = False) -> None:
        pid = int(ref.get("pid") or 0)
        if not pid or not _same_process(pid, ref):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)


def _is_kernel(pid: int, job_dir: str, uid: int | None) -> bool:
    """The pid in state.json (which the job's own code can write) is still this job's
    kernel: not a recycled pid, and not someone else's process."""
    try:
        proc = psutil.Process(pid)
        if uid is not None and proc.uids().real != uid:
            return False
        return "kernel" in " ".join(proc.cmdline()) and proc.cwd() == job_dir
    except psutil.Error:
        return False


# How far two readings of one process's start time may differ. psutil derives it from the
# boot time, which Linux reports in whole seconds computed from the wall clock: while NTP
# steers the clock, two readings a minute apart can differ by a second. A pid reused by
# another process within that second is not a risk worth a preemption signal lost (seen:
# a job never told to checkpoint, then killed at the end of its grace).
SAME_START = 1.5


def _same_process(pid: int, ref: dict[str, Any]) -> bool:
    """Whether ``pid`` is still the process ``ref`` recorded (its start time)."""
    now, then = _create_time(pid), ref.get("create_time")
    return now is not None and isinstance(then, int | float) and abs(now - then) <= SAME_START


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _state(job_dir: str) -> dict[str, Any]:
    return JobDir(Path(job_dir)).state()


def _runner_status(job_dir: str) -> str | None:
    return _state(job_dir).get("status")


def _kernel_pid(job_dir: str) -> int | None:
    pid = _state(job_dir).get("kernel_pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 1 else None
