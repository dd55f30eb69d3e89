"""``gpuslice.checkpoint``: checkpoints for long loops in a batch notebook.

::

    ckpt = gpuslice.checkpoint.open()
    state = ckpt.restore()            # None on the first run
    w = state["w"] if state else np.zeros(10)
    for step in ckpt.steps(10_000):   # continues after the saved step after a preemption
        w = train_step(w)
        ckpt.save(w=w)                # after the step's work; written every interval

The rules that keep a resume from giving a wrong result (docs/checkpointing.md):

* ``save`` inside ``steps`` says "this state is the result of every step up to and
  including this one". It is written at the end of that step when the checkpoint interval
  has passed, when the job is being preempted, or when it is the last step; a state saved
  in an earlier step is never written later under a newer step number. So saving every
  few steps is fine: a resume redoes the steps after the last save, it never skips them.
* After a preemption signal the loop stops at the end of the current step with
  :class:`Preempted`; the runner requeues the job and it resumes at this cell. If the
  notebook swallows ``Preempted`` (a bare ``except:``), the runner still treats the cell
  as preempted and says so in the job log.
* In a batch job each cell's default checkpoint is its own (``cell-<n>``); opening one
  name twice in a job is refused, and ``steps`` refuses to start over a saved state that
  ``restore`` was not asked for.
* Outside a batch job (no ``GPUSLICE_JOB_DIR``) checkpoints go to
  ``./.gpuslice-checkpoints``, nothing ever preempts, and nothing is resumed unless
  ``open(..., resume=True)`` asks for it.
"""

from __future__ import annotations

import builtins
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

from ..errors import GPUSliceError
from .atomic import atomic_write, write_all
from .format import CorruptCheckpoint, decode, encode, read_records, records

__all__ = [
    "Checkpoint",
    "CheckpointMisuse",
    "CorruptCheckpoint",
    "Preempted",
    "open",
    "preemption_requested",
]

log = logging.getLogger("gpuslice.checkpoint")

STEP_KEY = "__gpuslice_step__"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_preempted = False
# Set by the runner before each cell of a batch job: names the cell's default checkpoint.
_cell: int | None = None
# Whether Preempted was raised in the current cell (the runner asks after the cell, to
# catch a notebook that swallowed it).
_raised = False
_opened: set[str] = set()  # names opened in this batch job's kernel


class Preempted(BaseException):
    """Raised at a step boundary after the job was asked to give its slice back.

    A ``BaseException`` so that a broad ``except Exception`` in the notebook does not
    swallow it.
    """


class CheckpointMisuse(GPUSliceError, RuntimeError):
    """A use of the API that would make a resume skip or repeat work."""


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


def begin_cell(n: int) -> None:
    """Called by the runner before cell *n* (0-based, counting code cells)."""
    global _cell, _raised
    _cell = n
    _raised = False


def raised_in_cell() -> bool:
    return _raised


def in_batch_job() -> bool:
    return bool(os.environ.get("GPUSLICE_JOB_DIR"))


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
    """One loop's checkpoint file. ``resume=False``: ``restore`` ignores what is on disk."""

    def __init__(
        self, path: str, interval: float, *, name: str | None = None, resume: bool = True
    ) -> None:
        self.path = path
        self.name = name or os.path.basename(path)
        self.interval = interval
        self.resume = resume
        self.step = 0
        self.last_saved = time.monotonic()
        self.saves = 0
        self.restored = False
        self._pending: dict[str, Any] | None = None
        self._pending_step = 0  # the steps done when the pending state was saved
        self._saved_in: int | None = None  # the step whose body last called save
        self._in_loop = False

    def restore(self) -> dict[str, Any] | None:
        """The last saved state (and set ``step`` from it), or None when there is none."""
        self.restored = True
        if not self.resume or not os.path.exists(self.path):
            return None
        with builtins.open(self.path, "rb") as f:
            state = {name: decode(data, bufs) for name, data, bufs in read_records(f)}
        self.step = int(state.pop(STEP_KEY, 0))
        # In the cell's output, so the notebook shows where it went on from. ``step`` counts
        # the steps done; steps are numbered from 0, as ``steps`` yields them and as the docs
        # number them ("saved in step n … starts at n+1").
        print(f"gpuslice.checkpoint: {self.name!r} {resumed_at(self.step)}", file=sys.stderr)
        return state

    def save(self, **state: Any) -> None:
        """Remember ``state`` as the result of the steps done so far, this one included.

        Inside ``steps`` it is written when due, at the end of this step; outside, now.
        """
        self._pending = state
        if self._in_loop:
            self._pending_step = self.step + 1
            self._saved_in = self.step
        else:
            self._pending_step = self.step
            self.write()

    def write(self) -> bool:
        """Write the remembered state now. On failure the previous checkpoint is kept."""
        if self._pending is None:
            return False
        items = [(STEP_KEY, *encode(self._pending_step))]
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
        global _raised
        if self.resume and not self.restored and os.path.exists(self.path):
            raise CheckpointMisuse(
                f"checkpoint {self.name!r} has a saved state; call restore() before steps() "
                "and start from the state it returns (or the loop would start over, or go on "
                "from the saved step without its state)"
            )
        self._in_loop = True
        try:
            while self.step < total:
                yield self.step
                # Only a state saved in the step that just ended may be written now: one
                # saved earlier would be stamped with steps whose effect it lacks (or, if
                # mutated in place since, already has).
                fresh = self._saved_in == self.step
                self.step += 1
                if _preempted:
                    if fresh:
                        self.write()
                    _raised = True
                    raise Preempted(
                        f"preempted after step {self.step - 1} (steps 0 to {total - 1})"
                    )
                due = time.monotonic() - self.last_saved >= self.interval
                if fresh and (due or self.step == total):
                    # The last step is written too, so a rerun of this cell after a later
                    # preemption goes straight past the finished loop.
                    self.write()
        finally:
            self._in_loop = False


def resumed_at(done: int) -> str:
    """What a resume says, given the steps done (the saved step count)."""
    if done <= 0:
        return "resumed before its first step (step 0)"
    return f"resumed after step {done - 1}: continuing at step {done}"


def open(
    name: str | None = None, interval: float | None = None, resume: bool | None = None
) -> Checkpoint:
    """A named checkpoint (``interval``: seconds between writes).

    In a batch job the default name is the cell's (``cell-<n>``, numbered as in the job
    log) and the saved state is resumed; a name may be opened once per job. Outside one the
    name is ``default`` and nothing is resumed unless ``resume=True``.
    """
    batch = in_batch_job()
    if name is None:
        name = f"cell-{_cell + 1}" if batch and _cell is not None else "default"
    if not _NAME.match(name):
        raise ValueError(f"checkpoint name must match {_NAME.pattern}, got {name!r}")
    if batch:
        if name in _opened:
            raise CheckpointMisuse(
                f"checkpoint {name!r} is already open in this job: two loops sharing one "
                "would resume each other's steps; give each its own name, "
                "gpuslice.checkpoint.open('train')"
            )
        _opened.add(name)
    path = os.path.join(checkpoint_dir(), f"{name}.ckpt")
    return Checkpoint(
        path,
        default_interval() if interval is None else float(interval),
        name=name,
        resume=batch if resume is None else resume,
    )


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
