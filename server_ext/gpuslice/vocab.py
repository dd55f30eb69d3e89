"""The words the service, the server extension, the job runner and the spawner share.

One definition of each: a module that needs a job state, a runner exit status or the kind of
an idle event imports it from here.
"""

from __future__ import annotations

# -- the job runner's exit status (``python -m gpuslice.run``) --------------------------------
EXIT_COMPLETED = 0
EXIT_FAILED = 1  # a cell raised; the job has failed
EXIT_USAGE = 2  # bad command line or job folder
EXIT_PREEMPTED = 75  # checkpointed on request: requeue me (EX_TEMPFAIL)
# what the runner's state file says, as the exit status a backend reports it with
EXIT_BY_STATUS = {"completed": EXIT_COMPLETED, "failed": EXIT_FAILED, "preempted": EXIT_PREEMPTED}

# -- batch job states ------------------------------------------------------------------------
JOB_STATES = (
    "queued",
    "starting",
    "running",
    "preempting",
    "preempted",
    "completed",
    "failed",
    "cancelled",
    "timed-out",
)
# holding slices (or about to give them back)
ACTIVE_JOB_STATES = frozenset({"starting", "running", "preempting"})
TERMINAL_JOB_STATES = frozenset({"completed", "failed", "cancelled", "timed-out"})

# -- a job's submission ----------------------------------------------------------------------
# The fields ``POST api/jobs`` reads (any other is a 400). "user" and "groups" are named so
# that a submission stating them gets a 403 that says why, not a 400.
JOB_SUBMIT_FIELDS = frozenset(
    {
        "name",
        "path",
        "notebook",
        "profile",
        "slices",
        "priority",
        "checkpoint_interval",
        "max_runtime",
        "parameters",
        "user",
        "groups",
        "workdir",
        "time_window",
        "burstable",
    }
)
# What the single-user server's jobs proxy fills in itself (the notebook it reads at
# ``path``, its folder) or the service looks up (who): not for the lab to send.
SERVER_FILLED_FIELDS = frozenset({"notebook", "workdir", "user", "groups"})
# queue rank: a job may preempt only jobs of a lower rank, and only preemptible ones
PRIORITY_CLASSES = {"preemptible": 0, "normal": 1, "high": 2}

# -- what idle reclaim and the memory cap decide, as the service's event kinds ----------------
# (the keys are the ``action`` values of the idle event schema, schemas/idle-v1.yaml, that a
# server extension reports; its ``released`` is not reported: the service records the
# release itself)
IDLE_EVENT_KINDS = {
    "warning": "idle-warning",
    "extended": "idle-extended",
    "culled": "idle-culled",
    "memory-warning": "memory-warning",
    "memory-culled": "memory-culled",
}
