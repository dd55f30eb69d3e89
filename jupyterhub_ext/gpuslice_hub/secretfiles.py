"""Secrets the service reads from files: never from one that other accounts can read.

The ledger's password gives whoever has it the ledger, and with the ledger the jobs' rows
(issue 45: a user who read it in a 0644 ``gpuslice_config.py`` rewrote her job's owner).
So the service refuses to start when the config file it read holds the password and can
be read by group or others, or when the password file it was given
(``GPUSliceService.db_password_file``) can; the message names the file and the fix.
"""

from __future__ import annotations

import os
import stat
from urllib.parse import quote, quote_plus

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from .errors import ConfigError

# The most of a password file read: a password, not a file someone pointed at by mistake.
MAX_PASSWORD_BYTES = 4096


def url_password(db_url: str) -> str | None:
    """The password written in ``db_url``, or None (none, or not a URL: opening the
    database says what is wrong with it)."""
    try:
        return make_url(db_url).password  # type: ignore[return-value]
    except (ArgumentError, ValueError):
        return None


def is_sqlite(db_url: str) -> bool:
    return db_url.startswith("sqlite")


def check_secret_settings(
    db_url: str, password_file: str, config_file: str | None, on_command_line: bool
) -> None:
    """Where the ledger's password comes from, checked when the settings are loaded:
    written in ``db_url`` or read from ``password_file``, not both; not on the command
    line (every local user reads it, ``ps``); and a ``config_file`` that holds it is
    readable by the service's account only."""
    if password_file and is_sqlite(db_url):
        raise ConfigError("db_password_file", "a SQLite ledger (db_url) has no password")
    password = url_password(db_url)
    if not password:
        return
    if password_file:
        raise ConfigError(
            "db_password_file",
            "db_url holds a password too: take it out of db_url, the file's is the one used",
        )
    if on_command_line:
        raise ConfigError(
            "db_url",
            "holds the ledger's password on the command line, where every local user can "
            "read it (ps, /proc): put the password in a file named by db_password_file "
            "(chmod 600), and db_url without it",
        )
    if config_file and _holds(config_file, password):
        _private("config_file", config_file, "holds the ledger's password (in db_url)")


def read_password_file(path: str) -> str:
    """The password in ``path``: its first line, without the line's end. The file must be
    readable by the service's account only (ConfigError names the file and the fix)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError("db_password_file", f"{path} cannot be read ({e.strerror})") from None
    try:
        # checked on what was opened: the file read is the file checked
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("db_password_file", f"{path} is not a regular file")
        _check_mode("db_password_file", path, st, "holds the ledger's password")
        raw = os.read(fd, MAX_PASSWORD_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_PASSWORD_BYTES:
        raise ConfigError("db_password_file", f"{path} is larger than a password")
    try:
        password = raw.decode("utf-8").split("\n", 1)[0].rstrip("\r")
    except UnicodeDecodeError:
        raise ConfigError("db_password_file", f"{path} is not UTF-8 text") from None
    if not password:
        raise ConfigError("db_password_file", f"{path} holds no password on its first line")
    return password


def with_password(db_url: str, password: str) -> str:
    """``db_url`` with ``password`` in it (quoted as a URL needs it)."""
    return make_url(db_url).set(password=password).render_as_string(hide_password=False)


def _holds(path: str, password: str) -> bool:
    """Whether the file ``path`` spells ``password`` (as written, or URL-quoted). Only
    then does it hold the secret: a config that builds db_url from another file or the
    environment holds none itself."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return False
    return any(form in text for form in {password, quote(password, safe=""), quote_plus(password)})


def _private(key: str, path: str, what: str) -> None:
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(key, f"{path} cannot be examined ({e.strerror})") from None
    _check_mode(key, path, st, what)


def _check_mode(key: str, path: str, st: os.stat_result, what: str) -> None:
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        can = " and ".join(
            verb
            for verb, bits in (("read", 0o044), ("write", 0o022), ("run", 0o011))
            if mode & bits
        )
        raise ConfigError(
            key,
            f"{path} {what}, and group or others can {can} it (mode {mode:04o}): "
            f"chmod 600 {path} (the service's account alone may read it)",
        )
