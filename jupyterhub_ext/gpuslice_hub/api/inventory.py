"""Inventory, profiles with live availability, health."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuslice.isotime import iso

from ..idle import announced, effective_policy
from ..serialize import inventory_json
from .base import BaseHandler, Identity, RequestError, api_authenticated


class HealthHandler(BaseHandler):
    async def get(self) -> None:
        inv = self.service.inventory
        self.write_json(
            {
                "status": "ok",
                "backend": inv.backend if inv else None,
                "simulated": bool(inv and inv.simulated),
                "started": iso(self.service.started_at),
                "reconciled": iso(self.service.reconciled_at),
                "slurm_synced": iso(self.service.slurm_synced_at),
                "kubernetes_synced": iso(self.service.kubernetes_synced_at),
            }
        )


class InventoryHandler(BaseHandler):
    @api_authenticated
    async def get(self) -> None:
        ident = self.identity()
        await self.write_computed(lambda: self._inventory(ident))

    def _inventory(self, ident: Identity) -> dict[str, Any]:
        hosts, gpus, active = self.ledger.snapshot()
        holders: dict[str, list[dict[str, Any]]] = {}
        for a in active:
            visible = ident.sees_all or a.user == ident.name
            for c in a.claims:
                entry = {
                    "allocation_id": a.id if visible else None,
                    "user": a.user if visible else None,
                    "profile": a.profile,
                    "purpose": a.purpose,
                    "milli": c.milli,
                    "memory_mib": c.memory_mib,
                    # another user's charge would tell their memory use (peak x headroom)
                    "charged_milli": c.charged_milli if visible else None,
                    "charged_memory_mib": c.charged_memory_mib if visible else None,
                    "since": iso(a.created_at),
                }
                holders.setdefault(c.mig_uuid or c.gpu_uuid, []).append(entry)
                if c.mig_uuid:
                    # The parent GPU lists its MIG holders too, so per-GPU totals add up.
                    holders.setdefault(c.gpu_uuid, []).append(entry)
        inv = self.service.inventory
        out = inventory_json(hosts, gpus, holders)
        out.update(backend=inv.backend if inv else None, simulated=bool(inv and inv.simulated))
        return out


class ProfilesHandler(BaseHandler):
    @api_authenticated
    async def get(self) -> None:
        ident = self.identity()
        user = self.get_argument("user", None)
        groups = ident.groups
        # whether the user asked about has the admin scope: known of the caller only
        admin: bool | None = ident.is_admin
        if user is not None and user != ident.name:
            admin = None
            if not ident.sees_all:
                raise RequestError(403, f"{ident.name} may not see {user}'s availability")
            looked_up = await self.service.hub_api.user_groups(user)
            if looked_up is None:
                raise RequestError(404, f"no such user {user!r} on the hub")
            groups = looked_up
        else:
            user = ident.name
        # false: counted as the spawner will ask for them (its engine counts each share in
        # full, so its allocations are never overcommitted: "overcommit" in api/allocations)
        overcommit = self.get_argument("overcommit", "true")
        if overcommit not in ("true", "false"):
            raise RequestError(400, "overcommit must be true or false")
        # how long the spawner waits for a batch job to give a slice up (absent: no limit)
        raw_wait = self.get_argument("wait_seconds", None)
        wait: float | None = None
        if raw_wait is not None:
            try:
                wait = float(raw_wait)
            except ValueError:
                wait = -1.0
            if not 0 <= wait <= 86400:  # (NaN included)
                raise RequestError(400, "wait_seconds must be a number of seconds, 0 to 86400")
        # in a worker thread: at hundreds of hosts a count after a change takes tens of ms,
        # and the quota's figures wait for the ledger's cache
        await self.write_computed(
            lambda: self._profiles(user, groups, overcommit == "true", wait, admin)
        )

    def _profiles(
        self,
        user: str,
        groups: Sequence[str],
        overcommit: bool,
        wait: float | None,
        admin: bool | None,
    ) -> dict[str, Any]:
        inv = self.service.inventory
        profiles = self.ledger.availability(user, groups, overcommit, wait)
        # what idle reclaim will do on each, as the user's server will apply it
        store = self.service.admin_settings
        exemption = store.exemption(user) if store is not None else None
        for entry in profiles:
            policy = effective_policy(
                self.service.idle_policy_config,
                self.service.parsed_profiles,
                user,
                groups,
                entry["name"],
                exemption,
            )
            entry["idle"] = announced(policy)
            entry["idle_timeout"] = entry["idle"]["timeout"]
        return {
            "user": user,
            "simulated": bool(inv and inv.simulated),
            "profiles": profiles,
            "quota": self.ledger.quota_standing(user, groups),
            # what the submit dialog offers, and what a job gets for a field left empty
            "jobs": self._job_settings(user, tuple(groups), admin) if self.service.jobs else None,
        }

    def _job_settings(
        self, user: str, groups: tuple[str, ...], admin: bool | None
    ) -> dict[str, Any]:
        jobs = self.service.jobs
        assert jobs is not None
        return {
            **jobs.defaults(),
            # how large a submission may be (the server extension refuses a larger
            # notebook before sending it)
            "max_notebook_bytes": self.service.max_notebook_bytes,
            # the priority classes the submit dialog offers (JobManager.priority_access);
            # null for another user than the caller, whose admin scope is not known here
            "allowed_priorities": None
            if admin is None
            else jobs.allowed_priorities(user, groups, admin),
        }
