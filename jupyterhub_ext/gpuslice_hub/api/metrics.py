"""Prometheus scrape endpoint."""

from __future__ import annotations

import asyncio

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..scopes import METRICS_SCOPE
from .base import BaseHandler, RequestError


class MetricsHandler(BaseHandler):
    async def get(self) -> None:
        if self.service.metrics_require_auth:
            scope = METRICS_SCOPE
            if not await self.resolve_user():
                raise RequestError(403, f"metrics need a token with the {scope} scope")
            ident = self.token_identity()  # (a service with the metrics scope too)
            if not (ident.is_admin or scope in ident.scopes):
                raise RequestError(403, f"metrics need the {scope} scope")
        # In a worker thread: a scrape reads the whole pool (tens of ms at hundreds of hosts)
        body = await asyncio.to_thread(generate_latest, self.service.registry)
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(body)
