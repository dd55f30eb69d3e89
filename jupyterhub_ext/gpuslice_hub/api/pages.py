"""The service's pages behind the hub (HubOAuth login): a first look at who holds what, and
the admin panel, whose script reads the REST API with the page's XSRF token."""

from __future__ import annotations

import asyncio
from html import escape

from tornado import web

from .base import BaseHandler


class HomeHandler(BaseHandler):
    """What a researcher can get and holds, and their quota; admins see every holder."""

    @web.authenticated
    async def get(self) -> None:
        ident = self.identity()
        inv = self.service.inventory
        allocations = []
        for a in self.ledger.allocations(user=None if ident.is_admin else ident.name):
            if a["purpose"] == "batch":
                holder = "batch " + a["server_name"].replace("-", " ")  # "job-12" → "job 12"
            else:
                holder = f"server {a['server_name']}" if a["server_name"] else "default server"
            where = ", ".join(
                f"GPU {x['gpu_index']}" if x.get("gpu_index") is not None else x["gpu_uuid"]
                for x in a["assignments"]
            )
            allocations.append({**a, "holder": holder, "where": where})
        hub_prefix = self.hub_auth.hub_prefix if self.hub_auth else "/hub/"
        self.render(
            "overview.html",
            user=ident.name,
            is_admin=ident.is_admin,
            prefix=self.service.service_prefix,
            hub_prefix=hub_prefix,
            backend=inv.backend if inv else "?",
            simulated=bool(inv and inv.simulated),
            quota=self.ledger.quota_standing(ident.name, ident.groups),
            profiles=await asyncio.to_thread(self.ledger.availability, ident.name, ident.groups),
            allocations=allocations,
        )


class AdminPageHandler(BaseHandler):
    @web.authenticated
    async def get(self) -> None:
        ident = self.identity()
        if not ident.is_admin:
            self.set_status(403)
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.finish(
                "<!doctype html><title>gpuslice: not an admin</title>"
                f"<p>The gpuslice admin panel needs the <code>{escape(self.service.admin_scope)}"
                f"</code> scope; {escape(ident.name)} does not have it.</p>"
            )
            return
        inv = self.service.inventory
        self.render(
            "admin.html",
            user=ident.name,
            prefix=self.service.service_prefix,
            backend=inv.backend if inv else "?",
            simulated=bool(inv and inv.simulated),
            admin_scope=self.service.admin_scope,
        )
