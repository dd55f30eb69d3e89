"""Admin actions on the inventory. Each is recorded as an event with who did it and why."""

from __future__ import annotations

from ..errors import RequestError
from .base import BaseHandler, api_authenticated


class DrainHandler(BaseHandler):
    @api_authenticated
    async def post(self, gpu_uuid: str) -> None:
        """Drain (or undrain) a GPU: no new slices on it; current holders keep theirs."""
        ident = self.identity()
        if not ident.is_admin:
            raise RequestError(403, f"draining a GPU needs the {self.service.admin_scope} scope")
        body = self.json_body({"drained", "reason"})
        drained = body.get("drained", True)
        if not isinstance(drained, bool):
            raise RequestError(400, "field 'drained' must be true or false")
        reason = body.get("reason") or ""
        if not isinstance(reason, str):
            raise RequestError(400, "field 'reason' must be a string")
        self.write_json(self.ledger.set_drained(gpu_uuid, drained, ident.name, reason[:255]))
