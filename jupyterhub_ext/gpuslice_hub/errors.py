"""Errors the service reports to admins (config) and the outcomes its core reports to
callers: a refusal (``Refused``) or work under way (``Pending``). Only ``api/`` knows HTTP:
it maps each refusal code to a status (``api/base.py``)."""

from __future__ import annotations

from gpuslice.errors import ConfigError, GPUSliceError

__all__ = ["REFUSAL_CODES", "ConfigError", "Pending", "Refused"]

# Every kind of refusal, and what it means. A caller branches on the code; a person reads
# the message, which names the real reason.
REFUSAL_CODES = {
    "bad_request": "the request is malformed or a value is out of its range",
    "not_found": "no such thing, or not one the caller may see",
    "unknown_profile": "no profile of that name is configured",
    "forbidden_profile": "the profile is not offered to the caller's groups",
    "forbidden_priority": "the caller may not submit jobs of that priority class",
    "no_account": "the user has no system account to run a job as",
    "over_quota": "it would take the user or their group over a quota",
    "too_many_jobs": "the user has as many unfinished jobs as they may",
    "over_disk_quota": "the user's job folders take as much disk as theirs may",
    "no_capacity": "nothing free fits; the message says what is free instead",
    "server_holds_allocation": "that server already holds a slice of another profile",
    "wrong_state": "the thing is not in a state that allows this (already ended, not running)",
    "conflict": "a concurrent change won; try again",
}


class Refused(GPUSliceError):
    """The core will not do what was asked: ``code`` (one of ``REFUSAL_CODES``) says what
    kind of refusal, ``message`` says why, ``detail`` adds fields for the caller."""

    def __init__(self, code: str, message: str, **detail: object) -> None:
        if code not in REFUSAL_CODES:
            raise ValueError(f"unknown refusal code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail


class Pending(GPUSliceError):
    """Not a refusal: what was asked is under way (a batch job is giving its slice up for
    this spawn); ask again after ``detail['retry_after']`` seconds."""

    def __init__(self, message: str, **detail: object) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
