"""Errors raised by GPU discovery."""

from __future__ import annotations

from ..errors import ConfigError as _ConfigError
from ..errors import GPUSliceError


class GPUDiscoveryError(GPUSliceError, RuntimeError):
    """Discovery could not produce an inventory (no driver, NVML failure, bad backend name)."""


class ConfigError(GPUDiscoveryError, _ConfigError):
    """A declared host/GPU configuration is malformed: ``key`` is the key path
    (``hosts[0].gpus[1].mig``), the message says what is wrong with it."""

    def __init__(self, key: str, message: str) -> None:
        _ConfigError.__init__(self, key, message)
