"""The service's pages behind the hub (HubOAuth login): a first look at who holds what, and
the admin panel, whose script reads the REST API with the page's XSRF token."""

from __future__ import annotations

from html import escape

from tornado import web

from .base import BaseHandler


class HomeHandler(BaseHandler):
    @web.authenticated
    async def get(self) -> None:
        ident = self.identity()
        inv = self.service.inventory
        rows = []
        for a in self.ledger.allocations(user=None if ident.is_admin else ident.name):
            where = ", ".join(x["mig_uuid"] or x["gpu_uuid"] for x in a["assignments"])
            rows.append(
                f"<tr><td>{a['id']}</td><td>{escape(a['user'])}</td>"
                f"<td>{escape(a['server_name'] or '(default)')}</td><td>{escape(a['profile'])}</td>"
                f"<td>{escape(a['host'])}</td><td>{escape(where)}</td><td>{a['created_at']}</td></tr>"
            )
        profiles = []
        for p in self.ledger.availability(ident.name, ident.groups):
            why = f" — {escape(p['reason'])}" if p["reason"] else ""
            profiles.append(
                f"<li><b>{escape(p['display_name'])}</b> ({escape(p['description'])}): "
                f"{p['free']} free of {p['total']}{why}</li>"
            )
        banner = ""
        if inv and inv.simulated:
            banner = '<p class="sim">Simulated GPUs: no real GPU is in use.</p>'
        scope = "all allocations" if ident.is_admin else "your allocations"
        panel = ""
        if ident.is_admin:
            panel = f'<p><a href="{escape(self.service.service_prefix)}admin">Admin panel</a></p>'
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(
            f"""<!doctype html><html><head><meta charset="utf-8"><title>gpuslice</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px}}.sim{{background:#fff3cd;padding:6px}}</style>
</head><body><h1>gpuslice</h1>{banner}
<p>Signed in as {escape(ident.name)}{" (admin)" if ident.is_admin else ""}.
Backend: {escape(inv.backend if inv else "?")}.</p>{panel}
<h2>Profiles</h2><ul>{"".join(profiles)}</ul>
<h2>Active allocations ({scope})</h2>
<table><tr><th>id</th><th>user</th><th>server</th><th>profile</th><th>host</th><th>slice</th>
<th>since</th></tr>{"".join(rows)}</table></body></html>"""
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
