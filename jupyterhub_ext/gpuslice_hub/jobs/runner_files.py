"""What each job's runner last wrote in its folder, read again only when it changed.

The scheduler's pass reads two files of every running job (``state.json`` and the
checkpoint library's last-save marker); with 1 000 running jobs and a pass a second that
was 2 000 guarded opens a second to learn, almost always, nothing new. A file's identity
(inode, modification and change times in ns, size; stat'ed without following a link) says
whether it changed: the runner writes ``state.json`` by atomic rename (a new inode each
time). A path that is not a regular file, or a file that could not be read, is never cached:
it is read through :class:`JobDir`'s guarded open every time (which refuses links, and
files the folder's owner does not own).
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any

from gpuslice.run.jobdir import JobDir

from .. import clock
from .runner_state import CHECKPOINT_SKEW, runner_claims

Key = tuple[int, int, int, int] | None


def _key(folder: str, name: str) -> Key | str:
    """A regular file's identity, "missing", or None (not a regular file, or unreadable:
    never cached). ``folder`` (the job folder, or its ``checkpoints``) is opened without
    following a link: a link its owner planted is never walked, even to stat."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return "missing"
    except OSError:
        return None
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return "missing"
    except OSError:
        return None
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        return None
    # ctime too: a file rewritten in place within the mtime's resolution changes it
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


class RunnerFiles:
    def __init__(self) -> None:
        # job folder -> (the two files' keys, the runner's checked claims without the
        # time bound, the last save time): the checked claims only, never the file (its
        # owner writes it, up to a MiB)
        self._seen: dict[str, tuple[tuple[Any, Any], dict[str, Any], float]] = {}
        # job folder -> the claims last answered for the files as ``_seen`` has them: the
        # same object while the files stay the same (the scheduler's pass compares by
        # identity to know that nothing changed), or absent
        self._merged: dict[str, tuple[dict[str, Any], float, dict[str, Any]]] = {}
        # job folder -> its JobDir and where its two files are (Path arithmetic is not free)
        self._paths: dict[str, tuple[JobDir, tuple[str, str], tuple[str, str]]] = {}

    def claims(self, job_dir: str, fresh: bool = False, unchanged: bool = False) -> dict[str, Any]:
        """The runner's checked claims (:func:`runner_claims`), ``last_checkpoint_at``
        being the later of its own and the checkpoint library's last save. ``fresh``: read
        the files whatever their identity says (a run that just ended: on a shared
        filesystem ``lstat`` may answer from a cache that missed the runner's last write).
        ``unchanged``: the backend wrote the folder itself and vouches that it wrote
        nothing there since it was last asked (the simulator's): what was read is kept
        without a ``stat``.

        While the files stay the same (and the runner's checkpoint time is not ahead of
        the clock) the same dict is answered, pass after pass: it is shared, never to be
        changed by a caller."""
        hit = self._seen.get(job_dir) if unchanged and not fresh else None
        claims, saved = (hit[1], hit[2]) if hit is not None else self._read(job_dir, fresh)
        own = claims.get("last_checkpoint_at", 0.0)
        # the time bound runner_claims applies, against now rather than when it was read
        if own > clock.timestamp() + CHECKPOINT_SKEW:
            self._merged.pop(job_dir, None)
            out = dict(claims)
            del out["last_checkpoint_at"]
            if saved > 0.0:
                out["last_checkpoint_at"] = saved
            return out
        merged = self._merged.get(job_dir)
        if merged is not None and merged[0] is claims and merged[1] == saved:
            return merged[2]
        out = dict(claims)
        if saved > own:
            out["last_checkpoint_at"] = saved
        cached = self._seen.get(job_dir)
        if cached is not None and cached[1] is claims:
            self._merged[job_dir] = (claims, saved, out)
        else:
            self._merged.pop(job_dir, None)
        return out

    def answers(self, job_dir: str, claims: dict[str, Any]) -> bool:
        """Whether :meth:`claims` answers ``claims`` itself for ``job_dir`` while its files
        stay the same (not where the runner's checkpoint time is ahead of the clock: that
        answer changes as the clock moves)."""
        merged = self._merged.get(job_dir)
        return merged is not None and merged[2] is claims

    def _read(self, job_dir: str, fresh: bool) -> tuple[dict[str, Any], float]:
        paths = self._paths.get(job_dir)
        if paths is None:
            jd = JobDir(Path(job_dir), same_owner=True)
            state_at = (job_dir, jd.state_path.name)
            marker_at = (str(jd.checkpoints), jd.last_save_marker.name)
            paths = self._paths[job_dir] = (jd, state_at, marker_at)
        jd, state_at, marker_at = paths
        keys = (_key(*state_at), _key(*marker_at))
        hit = self._seen.get(job_dir)
        if hit is not None and hit[0] == keys and not fresh:
            return hit[1], hit[2]
        state, saved = jd.state(), jd.last_save_time()
        claims = runner_claims(state, now=math.inf)
        # a file that exists but read as nothing failed to read (the runner always writes
        # something): not cached, read again next pass
        read_failed = (keys[0] != "missing" and not state) or (keys[1] != "missing" and not saved)
        if None not in keys and not read_failed:
            self._seen[job_dir] = (keys, claims, saved)
        else:
            self._seen.pop(job_dir, None)
        return claims, saved

    def keep(self, job_dirs: set[str]) -> None:
        """Forget the folders of jobs no longer watched."""
        for gone in set(self._paths) - job_dirs:
            del self._paths[gone]
            self._seen.pop(gone, None)
            self._merged.pop(gone, None)
