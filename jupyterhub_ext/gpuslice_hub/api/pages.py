"""The service's pages behind the hub (HubOAuth login): a first look at who holds what, and
the admin panel, whose script reads the REST API with the page's XSRF token."""

from __future__ import annotations

import asyncio
from typing import Any

from tornado import web

from ..jobs.holder import holder_job
from ..ledger.holders import HOLDERS, engine_of
from ..scopes import ADMIN_SCOPE
from .base import BaseHandler, Identity


class PageHandler(BaseHandler):
    async def prepare(self) -> None:
        super().prepare()
        # the login check (``web.authenticated``) then finds the user already resolved,
        # without JupyterHub's synchronous path that holds the event loop (resolve_user)
        await self.resolve_user()

    def render_page(self, name: str, status: int = 200, **values: Any) -> None:
        """Render one of the service's templates (the site's override, if any)."""
        html = (
            self.settings["gpuslice_templates"]
            .get_template(name)
            .render(
                static_url=self.static_url,
                prefix=self.service.service_prefix,
                **values,
            )
        )
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(html)


class HomeHandler(PageHandler):
    """What a researcher can get and holds, and their quota; admins see every holder."""

    @web.authenticated
    async def get(self) -> None:
        ident = self.identity()
        inv = self.service.inventory
        # in a worker thread, as the API's: the reads wait for the ledger's caches
        held, quota, profiles = await asyncio.to_thread(self._reads, ident)
        allocations = []
        for a in held:
            if a["purpose"] == "external":
                engine = engine_of(a["profile"])
                holder = f"{HOLDERS[engine]} outside gpuslice ({a['server_name']})"
            elif a["purpose"] == "batch":
                job = holder_job(a["server_name"])
                holder = f"batch job {job}" if job is not None else f"batch {a['server_name']}"
            else:
                holder = f"server {a['server_name']}" if a["server_name"] else "default server"
            where = ", ".join(
                f"GPU {x['gpu_index']}" if x.get("gpu_index") is not None else x["gpu_uuid"]
                for x in a["assignments"]
            )
            allocations.append({**a, "holder": holder, "where": where})
        hub_prefix = self.hub_auth.hub_prefix if self.hub_auth else "/hub/"
        self.render_page(
            "overview.html",
            user=ident.name,
            is_admin=ident.is_admin,
            hub_prefix=hub_prefix,
            backend=inv.backend if inv else "?",
            simulated=bool(inv and inv.simulated),
            quota=quota,
            profiles=profiles,
            allocations=allocations,
        )

    def _reads(self, ident: Identity) -> tuple[list[dict[str, Any]], Any, list[dict[str, Any]]]:
        return (
            self.ledger.allocations(user=None if ident.is_admin else ident.name),
            self.ledger.quota_standing(ident.name, ident.groups),
            self.ledger.availability(ident.name, ident.groups),
        )


class AdminPageHandler(PageHandler):
    @web.authenticated
    async def get(self) -> None:
        ident = self.identity()
        if not ident.is_admin:
            self.render_page("forbidden.html", 403, user=ident.name, admin_scope=ADMIN_SCOPE)
            return
        inv = self.service.inventory
        self.render_page(
            "admin.html",
            user=ident.name,
            xsrf_token=self.xsrf_token.decode(),
            backend=inv.backend if inv else "?",
            simulated=bool(inv and inv.simulated),
            admin_scope=ADMIN_SCOPE,
        )
