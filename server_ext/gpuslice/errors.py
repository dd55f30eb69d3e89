"""The one configuration error of gpuslice: the hub service, discovery and the server
extension raise it with the key that is wrong, so whoever reports it names the setting."""

from __future__ import annotations


class ConfigError(ValueError):
    """Malformed configuration: ``key`` is the offending key (path), ``message`` what is
    wrong with it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message
