"""Whose system account a batch job runs as, and what its environment may hold.

A job is the owner's code: it runs under the owner's account (uid, primary and supplementary
groups, home, a private umask), the way JupyterHub's ``LocalProcessSpawner`` runs servers,
and sees an allow-listed environment only: never the service's variables or hub token.
``JobManager.run_jobs_as_service_user`` (single-user and demo hubs only) is the one exception.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuslice.errors import GPUSliceError

# Copied from the service's environment when set: locale and time zone only.
DEFAULT_KEEP = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ")
# Never passed to a job, whatever an admin lists: hub credentials and the service's own.
FORBIDDEN_PREFIXES = ("JUPYTERHUB_", "JPY_", "GPUSLICE_SERVICE", "CONFIGPROXY_")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
UMASK = 0o077


class AccountError(GPUSliceError):
    """The job's owner has no system account here; the message says so."""


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str

    @classmethod
    def lookup(cls, name: str) -> Account:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise AccountError(
                f"{name} has no system account on the service host, and jobs run as their "
                "owner's account"
            ) from None
        if pw.pw_uid == 0:
            raise AccountError(f"{name} is root: gpuslice does not run jobs as root")
        groups = tuple(sorted(set(os.getgrouplist(name, pw.pw_gid))))
        return cls(name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir, pw.pw_shell)

    @classmethod
    def current(cls) -> Account:
        """The service's own account (``run_jobs_as_service_user``); a uid with no passwd
        entry (as in some containers) is named by its number. Looked up once per effective
        uid: every submission and every start asks (a passwd lookup each was about 1 % of
        a simulated day)."""
        uid = os.geteuid()
        kept = _CURRENT.get(uid)
        if kept is None:
            kept = _CURRENT[uid] = cls._current(uid)
        return kept

    @classmethod
    def _current(cls, uid: int) -> Account:
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            home = os.environ.get("HOME", "/")
            return cls(str(uid), uid, os.getegid(), tuple(os.getgroups()), home, "/bin/sh")
        return cls(pw.pw_name, pw.pw_uid, pw.pw_gid, tuple(os.getgroups()), pw.pw_dir, pw.pw_shell)

    @property
    def is_current(self) -> bool:
        return self.uid == os.geteuid()


_CURRENT: dict[int, Account] = {}


def forbidden_names(names: Iterable[str]) -> list[str]:
    return [n for n in names if n.upper().startswith(FORBIDDEN_PREFIXES)]


def job_environment(
    account: Account,
    job_dir: str,
    python: str,
    job_vars: Mapping[str, str],
    keep: Iterable[str] = DEFAULT_KEEP,
    extra: Mapping[str, str] | None = None,
    source: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment of a job's runner (documented in the admin guide):
    identity (HOME, USER, LOGNAME, SHELL), PATH with the runner's Python first, the kernel's
    runtime folder inside the job folder, ``keep`` copied from ``source`` (the service's
    environment), the admin's fixed ``extra`` and the job's own variables (GPU, ids)."""
    source = os.environ if source is None else source
    env = {
        "HOME": account.home if account.home and os.path.isdir(account.home) else job_dir,
        "USER": account.name,
        "LOGNAME": account.name,
        "SHELL": account.shell or "/bin/sh",
        "PATH": f"{Path(python).parent}:{SYSTEM_PATH}",
        # Kernel connection files (with their HMAC keys) stay in the job's private folder.
        "JUPYTER_RUNTIME_DIR": os.path.join(job_dir, ".runtime"),
        "PYTHONUNBUFFERED": "1",
    }
    env.update({k: source[k] for k in keep if k in source and not forbidden_names([k])})
    env.update({k: v for k, v in (extra or {}).items() if not forbidden_names([k])})
    env.update(job_vars)
    return env
