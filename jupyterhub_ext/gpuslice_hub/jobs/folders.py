"""Job folders on disk, kept bounded: removed once nothing in them is needed, and measured
against each user's cap (``JobManager.max_job_folder_bytes_per_user``).

A job's folder ``<jobs_root>/<id>/`` holds its notebook, checkpoints, output and log. It is
removed
- at once when the job is cancelled before it ever started (nothing ran; the notebook
  snapshot is in the owner's ``gpu-jobs/`` folder too),
- ``job_folder_retention_days`` after the job ended, once the owner's server has copied its
  outputs into their ``gpu-jobs/<name>-<id>/`` (it says so: ``POST api/jobs/<id>/collected``);
  outputs never copied stay until
- the job ended longer ago than ``history_retention_days`` (when that is set): then
  whatever became of them.

The folder is the owner's, and their code may have planted anything in it: it is removed
without following a link (``shutil.rmtree``'s descriptor-based walk), and only a folder
that is the service's own ``<jobs_root>/<digits>`` is ever removed. Sizes are what the files
take on disk (allocated blocks), each file once, never through a link or across a mount.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import and_, or_, select

from ..db.engine import Database
from ..db.jobs_models import JobRow
from .job_writes import write_job
from .states import TERMINAL

# How long a user's measured total stands before a submission measures it again (it grows
# meanwhile by the folders submitted since, added as they are made).
USAGE_MAX_AGE = 30.0
# Seconds between two sweeps of the jobs root (removals, and the measure of its size).
SWEEP_EVERY = 600.0


def is_job_folder(root: Path, job_dir: str) -> bool:
    """Whether ``job_dir`` is a job's place in the jobs root (``<root>/<digits>``): the only
    folders the service removes."""
    path = Path(job_dir)
    return path.parent == root and path.name.isascii() and path.name.isdigit()


def remove_folder(root: Path, job_dir: str) -> None:
    """Remove a job's folder and everything in it, following no link (OSError: not all of
    it went; what is left is tried again at the next sweep)."""
    if not is_job_folder(root, job_dir):
        raise OSError(f"{job_dir!r} is not a job folder of {root}: not removed")
    path = Path(job_dir)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):  # (never made by the service: a link, say)
        path.unlink()
        return
    if not shutil.rmtree.avoids_symlink_attacks:  # (it does, on Linux: descriptor-based)
        raise OSError("this platform's rmtree may follow a link planted in the folder")
    shutil.rmtree(path)


def disk_bytes(path: Path, seen: set[tuple[int, int]] | None = None) -> int:
    """What ``path`` and everything under it take on disk, in bytes: allocated blocks, each
    file once (``seen``: the (device, inode) pairs already counted), not following links
    nor crossing into another file system. What cannot be read is not counted."""
    seen = set() if seen is None else seen
    try:
        top = path.lstat()
    except OSError:
        return 0
    total = 0
    stack = [(str(path), top)]
    while stack:
        where, st = stack.pop()
        key = (st.st_dev, st.st_ino)
        if key in seen:
            continue
        seen.add(key)
        total += st.st_blocks * 512
        if not stat.S_ISDIR(st.st_mode):
            continue
        try:
            entries = list(os.scandir(where))
        except OSError:
            continue
        for entry in entries:
            try:
                sub = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if sub.st_dev == top.st_dev:
                stack.append((entry.path, sub))
    return total


def size_text(n: int) -> str:
    """``n`` bytes as a person reads them: 10.3 GiB, 512 MiB, 4 KiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{n} bytes"


class UserUsage:
    """Each user's job folders' bytes, for the cap a submission is checked against.

    Measured by walking the user's folders (in the submitting thread, never on the event
    loop), at most every ``max_age`` seconds per user; a submission's new folder is added as
    it is made. Between two walks, a folder the user's own code filled is counted at the next
    one: the cap bounds the disk, it is not an exact quota."""

    def __init__(self, max_age: float = USAGE_MAX_AGE) -> None:
        self.max_age = max_age
        self._lock = threading.Lock()
        self._known: dict[str, tuple[float, int]] = {}

    def used(self, user: str, folders: Callable[[], list[str]]) -> int:
        now = time.monotonic()
        with self._lock:
            known = self._known.get(user)
        if known is not None and now - known[0] < self.max_age:
            return known[1]
        seen: set[tuple[int, int]] = set()
        total = sum(disk_bytes(Path(f), seen) for f in folders())
        with self._lock:
            self._known[user] = (now, total)
        return total

    def add(self, user: str, n: int) -> None:
        with self._lock:
            known = self._known.get(user)
            if known is not None:
                self._known[user] = (known[0], known[1] + n)

    def forget(self, user: str) -> None:
        """Measure again at the next submission (a folder of theirs was removed)."""
        with self._lock:
            self._known.pop(user, None)


@dataclass
class RootSize:
    """The whole jobs root as the last sweep measured it, with the folders made and removed
    since (the admin overview shows it)."""

    bytes: int | None = None
    folders: int = 0
    measured_at: datetime | None = None


@dataclass
class Swept:
    removed: int = 0
    failed: int = 0


def due_for_removal(
    db: Database, now: datetime, keep_days: float, history_days: float
) -> list[Any]:
    """The ended jobs whose folders may go now (id, user, job_dir): cancelled before they
    started; or ended ``keep_days`` ago with their outputs copied to the owner's folder; or
    ended before the history retention (``history_days`` > 0), copied or not."""
    due = [
        and_(JobRow.state == "cancelled", JobRow.started_at.is_(None)),
        and_(
            JobRow.outputs_collected_at.is_not(None),
            JobRow.finished_at < now - timedelta(days=keep_days),
        ),
    ]
    if history_days > 0:
        due.append(JobRow.finished_at < now - timedelta(days=history_days))
    with db.reading() as s:
        return list(
            s.execute(
                select(JobRow.id, JobRow.user, JobRow.job_dir).where(
                    JobRow.folder_removed_at.is_(None),
                    JobRow.state.in_(TERMINAL),
                    JobRow.job_dir != "",
                    or_(*due),
                )
            )
        )


def record_removed(db: Database, job_id: int, now: datetime) -> None:
    with db.writing() as s:
        write_job(s.connection(), job_id, {"folder_removed_at": now})


def user_folders(db: Database, user: str) -> list[str]:
    """The folders of ``user``'s jobs that are still on disk."""
    with db.reading() as s:
        return list(
            s.scalars(
                select(JobRow.job_dir).where(
                    JobRow.user == user, JobRow.folder_removed_at.is_(None), JobRow.job_dir != ""
                )
            )
        )
