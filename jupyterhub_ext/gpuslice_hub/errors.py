"""Errors the service reports to admins (config) and to API callers (requests)."""

from __future__ import annotations


class ConfigError(ValueError):
    """Malformed configuration; the message names the offending key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class RequestError(Exception):
    """A request the service refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str, **detail: object) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.detail = detail
