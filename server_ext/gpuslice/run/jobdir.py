"""The job folder: the contract between the service, its backends and the runner.

``job.json`` (written by the service: the notebook, parameters, checkpoint interval) is
read-only for the runner; ``state.json`` (written by the runner, atomically) tells the
service how far the job got, without the runner needing any credentials.

The folder belongs to the job's owner, whose code may plant links or FIFOs in it; the
service reads and writes it with more rights than the owner. So every file the service
touches here is opened beneath the folder without following a link at any step
(:func:`open_beneath`), must be a regular file, and is read up to a bounded size; the
service's view (``JobDir(..., same_owner=True)``) also opens only files of the folder's
owner, and writes only to those with no other name: a hard link to another user's file is
never read, appended to or handed over.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..vocab import EXIT_FAILED, EXIT_PREEMPTED

__all__ = ["EXIT_FAILED", "EXIT_PREEMPTED", "JobDir"]
# The most the service reads of a small file the runner writes (state.json).
MAX_STATE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class JobDir:
    root: Path
    # The service's view (it has more rights than the folder's owner): files are opened
    # only when the folder's owner owns them (open_beneath's ``same_owner``). The runner,
    # which runs as the owner, needs no such check.
    same_owner: bool = False

    @property
    def spec_path(self) -> Path:
        return self.root / "job.json"

    @property
    def input_path(self) -> Path:
        return self.root / "input.ipynb"

    @property
    def output_path(self) -> Path:
        return self.root / "output.ipynb"

    @property
    def html_path(self) -> Path:
        return self.root / "output.html"

    @property
    def log_path(self) -> Path:
        return self.root / "job.log"

    @property
    def state_path(self) -> Path:
        return self.root / "state.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def namespace_path(self) -> Path:
        return self.checkpoints / "namespace.ckpt"

    @property
    def namespace_meta_path(self) -> Path:
        return self.checkpoints / "namespace.json"

    @property
    def last_save_marker(self) -> Path:
        return self.checkpoints / ".last-save"

    def spec(self) -> dict[str, Any]:
        return json.loads(self.spec_path.read_text())

    def read(self, name: str, max_bytes: int = MAX_STATE_BYTES) -> bytes | None:
        """The file ``name`` (relative to the folder) if it is a regular file reached without
        a link, at most ``max_bytes`` of it (from the start); None otherwise."""
        try:
            fd = open_beneath(
                self.root, name, os.O_RDONLY | os.O_NONBLOCK, same_owner=self.same_owner
            )
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            return f.read(max_bytes)

    def state(self) -> dict[str, Any]:
        raw = self.read(self.state_path.name)
        try:
            state = json.loads(raw) if raw else {}
        except (ValueError, RecursionError):
            # (the job's own code may write anything here: garbage, or nesting deep enough
            # to exhaust the parser's recursion, is no state)
            return {}
        return state if isinstance(state, dict) else {}

    def write_state(self, **fields: Any) -> dict[str, Any]:
        state = {**self.state(), **fields, "updated_at": time.time()}
        write_json_atomic(self.state_path, state)
        return state

    def log(self, message: str, create: bool = True) -> None:
        """Append a line to the job log. ``create=False`` (the service): only to a log that
        exists, so the service never makes a file in the folder that its owner cannot write."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        flags = os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | (os.O_CREAT if create else 0)
        fd = open_beneath(self.root, self.log_path.name, flags, same_owner=self.same_owner)
        with os.fdopen(fd, "a") as f:
            f.write(f"[{stamp}] {message}\n")

    def log_tail(self, max_bytes: int = 4000) -> str:
        try:
            fd = open_beneath(
                self.root,
                self.log_path.name,
                os.O_RDONLY | os.O_NONBLOCK,
                same_owner=self.same_owner,
            )
        except OSError:
            return ""
        with os.fdopen(fd, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read(max_bytes).decode(errors="replace")

    def last_save_time(self) -> float:
        raw = self.read("checkpoints/" + self.last_save_marker.name, 64)
        try:
            value = float(raw) if raw else 0.0
        except ValueError:
            return 0.0
        return value if 0.0 <= value < 1e11 else 0.0


def open_beneath(
    root: Path, rel: str, flags: int, mode: int = 0o600, *, same_owner: bool = False
) -> int:
    """Open ``root/rel`` without following a symbolic link in ``rel`` (``root`` itself is
    the service's to trust); the result must be a regular file. Returns the descriptor.

    ``same_owner`` (the service, which has more rights than the folder's owner): the file
    must also belong to whoever owns ``root`` and, when opened to write, have no other name
    (:func:`open_owned`). A hard link the owner made to another user's file is refused
    without being opened. Only an existing file is opened this way (no ``O_CREAT``)."""
    parts = PurePosixPath(rel).parts
    if not parts or any(p in ("..", "/") for p in parts):
        raise OSError(f"{rel!r} is not a path inside the job folder")
    if same_owner and flags & os.O_CREAT:
        raise ValueError("same_owner opens an existing file only")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        owner = os.fstat(fd).st_uid
        for part in parts[:-1]:
            sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = sub
        if same_owner:
            out = open_owned(fd, parts[-1], flags, owner)
        else:
            out = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NOCTTY, mode, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(out).st_mode):
        os.close(out)
        raise OSError(f"{rel!r} in the job folder is not a regular file")
    os.set_blocking(out, True)
    return out


def open_owned(dir_fd: int, name: str, flags: int, owner: int) -> int:
    """Open the existing file ``name`` in the folder ``dir_fd`` with ``flags``, only if it
    is a regular file of ``owner`` (not a link, FIFO or device) and, when opened to write,
    has no other name: a hard link to a file of someone else (or to one of the owner's
    that also sits elsewhere) is refused. ``PermissionError`` or ``OSError`` says which.

    The checks are made on an ``O_PATH`` descriptor, which opens nothing (a FIFO is not
    woken, no file is opened to write), and the file is then opened through that very
    descriptor (``/proc/self/fd``): it cannot be swapped for another in between. Linux."""
    where = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(where)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{name!r} in the job folder is not a regular file")
        if st.st_uid != owner:
            raise PermissionError(
                f"{name!r} in the job folder belongs to uid {st.st_uid}, not to the "
                f"folder's owner (uid {owner})"
            )
        if flags & (os.O_WRONLY | os.O_RDWR) and st.st_nlink != 1:
            raise PermissionError(
                f"{name!r} in the job folder has {st.st_nlink} names (a hard link): not written to"
            )
        # (O_NOFOLLOW would refuse /proc's link itself; the file is the one checked)
        reopen = (flags | os.O_NOCTTY | os.O_CLOEXEC) & ~(os.O_NOFOLLOW | os.O_CREAT)
        return os.open(f"/proc/self/fd/{where}", reopen)
    finally:
        os.close(where)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
