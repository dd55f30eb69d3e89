"""What each job's runner last wrote in its folder, read again only when it changed.

The scheduler's pass reads two files of every running job (``state.json`` and the
checkpoint library's last-save marker); with 1 000 running jobs and a pass a second that
was 2 000 guarded opens a second to learn, almost always, nothing new. A file's identity
(inode, modification time in ns, size, from ``lstat``) says whether it changed: the runner
writes ``state.json`` by atomic rename (a new inode each time). A path that is not a
regular file is never cached: it is read through :class:`JobDir`'s guarded open every time
(which refuses links), exactly as before.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from gpuslice.run.jobdir import JobDir

from .runner_state import runner_claims

Key = tuple[int, int, int] | None


def _key(path: str) -> Key | str:
    """A regular file's identity, "missing", or None (not a regular file: never cached)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class RunnerFiles:
    def __init__(self) -> None:
        # job folder -> (the two files' keys, state.json's content, the last save time)
        self._seen: dict[str, tuple[tuple[Any, Any], dict[str, Any], float]] = {}
        # job folder -> its JobDir and the two files' paths (Path arithmetic is not free)
        self._paths: dict[str, tuple[JobDir, str, str]] = {}

    def claims(self, job_dir: str) -> dict[str, Any]:
        """The runner's checked claims (:func:`runner_claims`), ``last_checkpoint_at``
        being the later of its own and the checkpoint library's last save."""
        state, saved = self._read(job_dir)
        claims = runner_claims(state)
        if saved > claims.get("last_checkpoint_at", 0.0):
            claims["last_checkpoint_at"] = saved
        return claims

    def _read(self, job_dir: str) -> tuple[dict[str, Any], float]:
        paths = self._paths.get(job_dir)
        if paths is None:
            jd = JobDir(Path(job_dir))
            paths = self._paths[job_dir] = (jd, str(jd.state_path), str(jd.last_save_marker))
        jd, state_path, marker = paths
        keys = (_key(state_path), _key(marker))
        hit = self._seen.get(job_dir)
        if hit is not None and hit[0] == keys:
            return hit[1], hit[2]
        state, saved = jd.state(), jd.last_save_time()
        if None not in keys:
            self._seen[job_dir] = (keys, state, saved)
        else:
            self._seen.pop(job_dir, None)
        return state, saved

    def keep(self, job_dirs: set[str]) -> None:
        """Forget the folders of jobs no longer watched."""
        for gone in set(self._paths) - job_dirs:
            del self._paths[gone]
            self._seen.pop(gone, None)
