"""``gpuslice.checkpoint``: checkpoints for long cells of a batch notebook.

::

    ckpt = gpuslice.checkpoint.open()
    state = ckpt.restore()            # None on the first run
    w = state["w"] if state else np.zeros(10)
    for step in ckpt.steps(10_000):   # continues from the saved step after a preemption
        w = train_step(w)
        ckpt.save(w=w)                # cheap: written only every checkpoint interval

``save`` remembers the latest state; it is written when the checkpoint interval has passed
and, after a preemption signal, at the end of the current step, after which the cell stops
with :class:`Preempted` (the runner requeues the job; it resumes at this cell, and
``steps`` continues from the saved step). Outside a batch job (no ``GPUSLICE_JOB_DIR``)
checkpoints go to ``./.gpuslice-checkpoints`` and nothing ever preempts.
"""

from __future__ import annotations

import builtins
import logging
import os
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

from .atomic import atomic_write, write_all
from .format import CorruptCheckpoint, decode, encode, read_records, records

__all__ = ["Checkpoint", "CorruptCheckpoint", "Preempted", "open", "preemption_requested"]

log = logging.getLogger("gpuslice.checkpoint")

STEP_KEY = "__gpuslice_step__"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_preempted = False


class Preempted(BaseException):
    """Raised at a step boundary after the job was asked to give its slice back.

    A ``BaseException`` so that a broad ``except Exception`` in the notebook does not
    swallow it.
    """


def request_preemption(*_: Any) -> None:
    """Mark this process as preempted (the runner forwards the signal as SIGUSR1)."""
    global _preempted
    _preempted = True


def preemption_requested() -> bool:
    return _preempted


def install_preemption_handler() -> None:
    """Called by the runner in the kernel before the first cell.

    SIGUSR1 is the runner's forwarded signal. SIGTERM too: Slurm signals every process of
    a job it preempts, kernel included, and the kernel must live to save its step.
    """
    signal.signal(signal.SIGUSR1, request_preemption)
    signal.signal(signal.SIGTERM, request_preemption)


def checkpoint_dir() -> str:
    job_dir = os.environ.get("GPUSLICE_JOB_DIR")
    if job_dir:
        return os.path.join(job_dir, "checkpoints")
    return os.path.abspath(".gpuslice-checkpoints")


def default_interval() -> float:
    try:
        return float(os.environ.get("GPUSLICE_CHECKPOINT_INTERVAL", "600"))
    except ValueError:
        return 600.0


class Checkpoint:
    def __init__(self, path: str, interval: float) -> None:
        self.path = path
        self.interval = interval
        self.step = 0
        self.last_saved = time.monotonic()
        self.saves = 0
        self._pending: dict[str, Any] | None = None
        self._in_loop = False

    def restore(self) -> dict[str, Any] | None:
        """The last saved state (and set ``step`` from it), or None when there is none."""
        if not os.path.exists(self.path):
            return None
        with builtins.open(self.path, "rb") as f:
            state = {name: decode(data, bufs) for name, data, bufs in read_records(f)}
        self.step = int(state.pop(STEP_KEY, 0))
        return state

    def save(self, **state: Any) -> None:
        """Remember ``state``; inside ``steps`` it is written when due, outside right away."""
        self._pending = state
        if not self._in_loop:
            self.write()

    def write(self) -> bool:
        """Write the remembered state now. On failure the previous checkpoint is kept."""
        if self._pending is None:
            return False
        items = [(STEP_KEY, *encode(self.step))]
        items += [(name, *encode(value)) for name, value in self._pending.items()]
        try:
            atomic_write(self.path, lambda f: write_all(f, records(items)))
        except OSError as e:
            log.warning("checkpoint %s not written (%s); the previous one is kept", self.path, e)
            return False
        self.last_saved = time.monotonic()
        self.saves += 1
        _touch_marker()
        return True

    def steps(self, total: int) -> Iterator[int]:
        """Yield step numbers from the restored step up to ``total``."""
        self._in_loop = True
        try:
            while self.step < total:
                yield self.step
                self.step += 1
                if _preempted:
                    self.write()
                    raise Preempted(f"preempted at step {self.step} of {total}")
                if time.monotonic() - self.last_saved >= self.interval:
                    self.write()
            # Finished: record it, so a rerun of this cell after a later preemption skips it.
            self.write()
        finally:
            self._in_loop = False


def open(name: str = "default", interval: float | None = None) -> Checkpoint:
    """A named checkpoint of this job (``interval``: seconds between writes)."""
    if not _NAME.match(name):
        raise ValueError(f"checkpoint name must match {_NAME.pattern}, got {name!r}")
    path = os.path.join(checkpoint_dir(), f"{name}.ckpt")
    return Checkpoint(path, default_interval() if interval is None else float(interval))


def _touch_marker() -> None:
    """Tell the runner when work was last made safe (it reports lost work from this)."""
    job_dir = os.environ.get("GPUSLICE_JOB_DIR")
    if not job_dir:
        return
    try:
        with builtins.open(os.path.join(job_dir, "checkpoints", ".last-save"), "w") as f:
            f.write(repr(time.time()))
    except OSError:
        pass
