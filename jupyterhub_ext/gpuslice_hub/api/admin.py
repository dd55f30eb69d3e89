"""Admin actions: drain a GPU, change a quota, exempt a user from idle culling, and the log
of such actions. Each change is recorded as an event with who made it and why."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from ..ledger.external import EXTERNAL
from ..overrides import ADMIN_EVENT_KINDS, AdminSettings, parse_limit_body, quotas_json
from ..scopes import ADMIN_SCOPE
from ..snapshot import AllocationView
from .base import BaseHandler, Identity, RequestError, api_authenticated, int_arg


class AdminBase(BaseHandler):
    @property
    def store(self) -> AdminSettings:
        store = self.service.admin_settings
        assert store is not None, "the service opens its settings with the ledger"
        return store

    def admin(self, what: str) -> Identity:
        ident = self.identity()
        if not ident.is_admin:
            raise RequestError(403, f"{what} needs the {ADMIN_SCOPE} scope")
        return ident


class DrainHandler(AdminBase):
    @api_authenticated
    async def post(self, gpu_uuid: str) -> None:
        """Drain (or undrain) a GPU: no new slices on it; current holders keep theirs."""
        ident = self.admin("draining a GPU")
        body = self.json_body({"drained", "reason"})
        drained = body.get("drained", True)
        if not isinstance(drained, bool):
            raise RequestError(400, "field 'drained' must be true or false")
        reason = self.reason(body)
        # a ledger write (it takes the allocation lock): never on the event loop
        await self.write_computed(
            lambda: self.ledger.set_drained(gpu_uuid, drained, ident.name, reason[:255])
        )


class QuotasHandler(AdminBase):
    """``GET api/admin/quotas``: configured, overridden and effective quotas, and what each
    user and group holds now."""

    @api_authenticated
    async def get(self) -> None:
        self.admin("reading quotas")
        # the admin panel asks every few seconds; at 200 hosts a walk over thousands of
        # held slices: in a worker thread
        await self.write_computed(self._quotas)

    def _quotas(self) -> dict[str, Any]:
        _, _, active = self.ledger.snapshot()
        users, groups = quota_holdings(active)
        with self.ledger.db.reading() as s:
            effective = self.ledger.effective_quotas(s)
        return {
            "config": quotas_json(self.service.parsed_quotas),
            "overrides": self.store.overrides(),
            "effective": quotas_json(effective),
            "in_use": {"users": users, "groups": groups},
        }


def quota_holdings(
    active: Iterable[AllocationView],
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """What each user holds and what is charged to each group, as the quotas count it: the
    holdings of jobs and pods outside gpuslice (the Slurm and Kubernetes mirrors') count
    against nobody."""
    users: dict[str, dict[str, float]] = {}
    groups: dict[str, dict[str, float]] = {}
    for a in active:
        if a.purpose == EXTERNAL:
            continue
        for key, table in ((a.user, users), (a.charged_group, groups)):
            if key is None:
                continue
            held = table.setdefault(key, {"slices": 0.0, "milli": 0})
            held["slices"] += a.quota_weight
            held["milli"] += a.gpu_milli
    return users, groups


class QuotaHandler(AdminBase):
    """``PUT``/``DELETE api/admin/quotas/{user|group}/<name>``."""

    @api_authenticated
    async def put(self, subject: str, name: str) -> None:
        self._subject(subject)
        await self._put(subject, name)

    def _subject(self, subject: str) -> None:
        self.admin("changing a quota")
        if subject not in ("user", "group"):
            raise RequestError(404, f"quotas are set for a user or a group, not {subject!r}")

    async def _put(self, subject: str, name: str) -> None:
        ident = self.admin("changing a quota")
        body = self.json_body({"max_slices", "max_milli", "reason"})
        slices, milli = parse_limit_body(body)
        reason = self.reason(body, required=True)
        await self._check_exists(subject, name)
        # admin settings are ledger writes (on SQLite they may wait for the one writer):
        # in a worker thread, here and below
        await self.write_computed(
            lambda: self.store.set_quota(subject, name, slices, milli, ident.name, reason)
        )

    @api_authenticated
    async def delete(self, subject: str, name: str) -> None:
        self._subject(subject)
        await self._delete(subject, name)

    async def _delete(self, subject: str, name: str) -> None:
        ident = self.admin("changing a quota")
        reason = self.optional_reason()
        if not await asyncio.to_thread(self.store.reset_quota, subject, name, ident.name, reason):
            raise RequestError(404, f"no quota override for {subject} {name!r}".strip())
        self.set_status(204)
        self.finish()

    async def _check_exists(self, subject: str, name: str) -> None:
        """A typo in a name would silently limit nobody: the user or group must exist."""
        hub = self.service.hub_api
        if subject == "default_user" or not hub.configured:
            return
        if subject == "user" and await hub.user_groups(name) is None:
            raise RequestError(404, f"no such user {name!r} on the hub")
        configured = name in self.service.parsed_quotas.groups
        if subject == "group" and not configured and not await hub.group_exists(name):
            raise RequestError(404, f"no such group {name!r} on the hub or in the quotas config")


class DefaultQuotaHandler(QuotaHandler):
    """``PUT``/``DELETE api/admin/quotas/default_user``: the quota of every user without one."""

    @api_authenticated
    async def put(self) -> None:  # type: ignore[override]
        await self._put("default_user", "")

    @api_authenticated
    async def delete(self) -> None:  # type: ignore[override]
        await self._delete("default_user", "")


class ExemptionsHandler(AdminBase):
    @api_authenticated
    async def get(self) -> None:
        self.admin("reading idle exemptions")
        config = self.service.idle_policy_config
        await self.write_computed(
            lambda: {
                "exemptions": self.store.exemptions(),
                "config": {
                    "users": sorted(config.exempt_users),
                    "groups": sorted(config.exempt_groups),
                    "profiles": sorted(config.exempt_profiles),
                },
            }
        )


class ExemptionHandler(AdminBase):
    """``PUT api/admin/exemptions/<user>`` ``{"reason", "hours"}``: never cull this user's
    sessions for idleness (for ``hours``, or until removed); ``DELETE`` ends it."""

    @api_authenticated
    async def put(self, user: str) -> None:
        ident = self.admin("exempting a user")
        body = self.json_body({"reason", "hours"})
        reason = self.reason(body, required=True)
        hours = body.get("hours")
        if hours is not None and (
            isinstance(hours, bool) or not isinstance(hours, int | float) or not 0 < hours <= 8760
        ):
            raise RequestError(400, "field 'hours' must be a number of hours, 0 < hours <= 8760")
        if self.service.hub_api.configured and await self.service.hub_api.user_groups(user) is None:
            raise RequestError(404, f"no such user {user!r} on the hub")
        await self.write_computed(lambda: self.store.exempt(user, ident.name, reason, hours))

    @api_authenticated
    async def delete(self, user: str) -> None:
        ident = self.admin("ending an idle exemption")
        reason = self.optional_reason()
        if not await asyncio.to_thread(self.store.unexempt, user, ident.name, reason):
            raise RequestError(404, f"{user} has no idle exemption set in the panel")
        self.set_status(204)
        self.finish()


class ActionsHandler(AdminBase):
    """``GET api/admin/actions?limit=N``: the newest admin actions, newest first."""

    @api_authenticated
    async def get(self) -> None:
        self.admin("reading the admin action log")
        limit = int_arg(self, "limit", 100, 1, 1000)
        await self.write_computed(
            lambda: {"actions": self.ledger.events(kinds=ADMIN_EVENT_KINDS, limit=limit)}
        )


def admin_handlers(api: str) -> list[tuple[str, type]]:
    from jupyterhub.utils import url_path_join

    return [
        (url_path_join(api, r"gpus/([^/]+)/drain"), DrainHandler),
        (url_path_join(api, "admin/quotas"), QuotasHandler),
        (url_path_join(api, r"admin/quotas/([^/]+)/([^/]+)"), QuotaHandler),
        (url_path_join(api, "admin/quotas/default_user"), DefaultQuotaHandler),
        (url_path_join(api, "admin/exemptions"), ExemptionsHandler),
        (url_path_join(api, r"admin/exemptions/([^/]+)"), ExemptionHandler),
        (url_path_join(api, "admin/actions"), ActionsHandler),
    ]
