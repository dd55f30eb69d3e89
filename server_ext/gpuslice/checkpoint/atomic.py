"""Atomic, durable file writes: a checkpoint is either the old one or the new one, never half.

The data goes to a temporary file in the same directory, is fsynced, and replaces the old
file with one ``rename``; the directory is fsynced so the rename survives a power cut. If
anything fails (disk full, quota) the temporary file is removed and the previous good
checkpoint stays in place.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import BinaryIO


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, write: Callable[[BinaryIO], None]) -> int:
    """Call ``write(f)`` on a temporary file and move it over ``path``; returns bytes written."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb", buffering=0) as raw:
            write(raw)
            raw.flush()
            os.fsync(raw.fileno())
            size = raw.tell()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)
    return size


def write_all(f: BinaryIO, chunks: Iterator[bytes | memoryview]) -> None:
    for chunk in chunks:
        f.write(chunk)
