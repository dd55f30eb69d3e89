"""Errors raised by GPU discovery."""

from __future__ import annotations


class GPUDiscoveryError(RuntimeError):
    """Discovery could not produce an inventory (no driver, NVML failure, bad backend name)."""


class ConfigError(GPUDiscoveryError, ValueError):
    """A declared host/GPU configuration is malformed; the message names the key path."""
