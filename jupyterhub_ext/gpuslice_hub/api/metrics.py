"""Prometheus scrape endpoint."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..errors import RequestError
from .base import BaseHandler


class MetricsHandler(BaseHandler):
    async def get(self) -> None:
        if self.service.metrics_require_auth:
            if not self.current_user:
                raise RequestError(403, "metrics need a token with the gpuslice admin scope")
            if not self.identity().is_admin:
                raise RequestError(403, f"metrics need the {self.service.admin_scope} scope")
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.service.registry))
