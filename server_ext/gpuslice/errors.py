"""gpuslice's errors: the one base every exception of the three packages derives from, and
the one configuration error (the hub service, discovery and the server extension raise it
with the key that is wrong, so whoever reports it names the setting)."""

from __future__ import annotations


class GPUSliceError(Exception):
    """The base of every exception gpuslice raises (``except GPUSliceError`` catches them
    all), beside the standard class each also is (``ValueError`` for bad input, tornado's
    ``HTTPError`` for a request's answer, ...). One exception stands outside:
    ``gpuslice.checkpoint.Preempted`` is a ``BaseException`` so that a notebook's own
    ``except Exception`` cannot swallow a preemption."""


class ConfigError(GPUSliceError, ValueError):
    """Malformed configuration: ``key`` is the offending key (path), ``message`` what is
    wrong with it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message
