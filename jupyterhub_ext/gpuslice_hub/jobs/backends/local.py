"""The embedded default: each job's runner is a subprocess of the service host.

The runner starts in a session of its own, so it outlives a service restart; the service
finds it again by pid and start time (a recycled pid is not mistaken for it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from gpuslice.run.jobdir import JobDir, open_owned
from gpuslice.vocab import EXIT_BY_STATUS

from ..accounts import UMASK, Account
from ..runner_state import ATTEMPT_ID as ATTEMPT_ENV
from .base import RunStatus

log = logging.getLogger(__name__)


# The runner's own output (its stdout and stderr: what it prints before the job log is
# open, a traceback of its own), in the job folder, for the owner to read.
RUNNER_OUT = "runner.out"


def open_runner_output(folder: Path, account: Account) -> int:
    """``runner.out`` in the job folder ``folder``, opened to append, for a runner that
    runs as ``account``; the descriptor.

    The service (root) opens it, in a folder the job's code writes: it never opens for
    writing, and never hands over, a file that is not already ``account``'s alone. The
    owner's own file of an earlier run (regular, theirs, no other name) is appended to, as
    it is, and never chown'ed. Anything else in its place (a hard link to another user's
    file, a symbolic link, a FIFO) loses that name, which leaves the thing it named as it
    was, and a new file is made (``O_CREAT | O_EXCL | O_NOFOLLOW``) and given to
    ``account``; a file of another user that has no other name is left alone, and the start
    fails saying so (removing its name would delete it). The folder itself must be
    ``account``'s."""
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        owner = os.fstat(folder_fd).st_uid
        if owner != account.uid:
            raise PermissionError(
                f"the job folder belongs to uid {owner}, not to {account.name} "
                f"(uid {account.uid}), whom the runner would run as"
            )
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
        try:
            return open_owned(folder_fd, RUNNER_OUT, flags, account.uid)
        except FileNotFoundError:
            pass
        except OSError as e:
            st = os.stat(RUNNER_OUT, dir_fd=folder_fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                # another user's file whose only name this is: removing the name would
                # delete it. Left as it is; the job fails saying so.
                raise PermissionError(
                    f"{e}; it is its only name, so it is left as it is (the folder's owner "
                    "can move it away)"
                ) from None
            log.warning("%s: %s; that name is given to a new file", folder, e)
            # (a folder in its place cannot be unlinked: that error says so, and the job
            # fails with it)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(RUNNER_OUT, dir_fd=folder_fd)
        # O_EXCL: made by this call, or not at all (something planted again meanwhile
        # fails the start, with the error)
        out = os.open(
            RUNNER_OUT, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder_fd
        )
        try:
            if not account.is_current:
                os.fchown(out, account.uid, account.gid)  # (the file this call created)
        except OSError:
            os.close(out)
            raise
        return out
    finally:
        os.close(folder_fd)


class LocalBackend:
    name = "local"

    def __init__(self, python: str = "") -> None:
        self.python = python or sys.executable
        self._procs: dict[int, subprocess.Popen] = {}
        # Runners killed, waited for at each pass until they have exited: a cancelled or
        # timed-out job's run is never polled again, and its process would stay a zombie
        # (and its Popen here) for as long as the service runs.
        self._killed: list[subprocess.Popen] = []
        self._killed_lock = threading.Lock()  # (a cancel kills from the API's thread)

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
        try:
            out = open_runner_output(Path(job_dir), account)
        except OSError as e:
            raise OSError(f"its {RUNNER_OUT} could not be made ({e})") from None
        try:
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
        if self._killed:
            with self._killed_lock:
                self._killed = [proc for proc in self._killed if proc.poll() is None]
        return [self._poll_one(ref) for ref in refs]

    def _poll_one(self, ref: dict[str, Any]) -> RunStatus:
        """``poll``, where one run that cannot be asked about (its folder is the job's
        own code's to break) stops the answers for no other: it is taken as still running,
        which concludes nothing; its max runtime still ends it."""
        try:
            return self.poll(ref)
        except Exception:
            log.exception("the local run %s could not be asked about", ref.get("pid"))
            return RunStatus(True)

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
        self.reap(ref)
        # (a run polled after this is asked about as after a restart: by its pid and its
        # state file, the same answers)
        proc = self._procs.pop(int(ref.get("pid") or 0), None)
        if proc is not None and proc.poll() is None:
            with self._killed_lock:
                self._killed.append(proc)

    def reap(self, ref: dict[str, Any]) -> int:
        """Kill what is left of a run whose slice is about to go back: the kernel (in a
        session of its own), and every process it or its code started, which would
        otherwise go on using the GPU someone else is given next. Returns how many.

        A process belongs to the run when it is its owner's and its environment (as it
        was exec'ed: the runner's, inherited) names this run's attempt, or when it
        descends from one that does. The kernel pid in state.json is not used: the job's
        code can write it, and it could point the service at another process. (Each
        process's environment is read as it was exec'ed, which the code cannot rewrite.)
        Code that re-execs itself with a cleaned environment
        and detaches escapes this; a site that runs hostile code uses Slurm or Kubernetes,
        whose cgroups hold every process of a job (docs/admin-guide.md)."""
        attempt, uid = ref.get("attempt_id"), ref.get("uid")
        if not isinstance(attempt, str) or not attempt or not isinstance(uid, int):
            return 0
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.uids().real == uid and proc.environ().get(ATTEMPT_ENV) == attempt:
                    found[proc.pid] = proc
                    for child in proc.children(recursive=True):
                        found.setdefault(child.pid, child)
        for proc in found.values():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        return len(found)

    def _signal(self, ref: dict[str, Any], sig: int, group: bool = False) -> None:
        pid = int(ref.get("pid") or 0)
        if not pid or not _same_process(pid, ref):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)


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
    return JobDir(Path(job_dir), same_owner=True).state()


def _runner_status(job_dir: str) -> str | None:
    return _state(job_dir).get("status")
