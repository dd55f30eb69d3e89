"""Authentication, identity and JSON plumbing shared by every handler."""

from __future__ import annotations

import asyncio
import functools
import json
import math
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from jupyterhub.services.auth import HubOAuthenticated, UserNotAllowed
from tornado import web

from gpuslice.errors import GPUSliceError
from gpuslice.jsonbody import BodyError, parse_json_object
from gpuslice.jsonclient import JSONError

from ..errors import Pending, Refused
from ..ledger import Caller
from ..scopes import ADMIN_SCOPE, METRICS_SCOPE

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from ..app import GPUSliceService


class RequestError(GPUSliceError):
    """A request the API refuses; ``status`` is the HTTP status to answer with. The core
    raises ``Refused`` instead (``STATUS_BY_CODE`` maps it): only ``api/`` knows HTTP."""

    def __init__(self, status: int, message: str, **detail: object) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.detail = detail


# The HTTP status of each of the core's refusal codes (errors.REFUSAL_CODES).
STATUS_BY_CODE = {
    "bad_request": 400,
    "forbidden_profile": 403,
    "forbidden_priority": 403,
    "no_account": 403,
    "not_found": 404,
    "unknown_profile": 404,
    "conflict": 409,
    "no_capacity": 409,
    "server_holds_allocation": 409,
    "wrong_state": 409,
    "over_disk_quota": 413,
    "over_quota": 429,
    "too_many_jobs": 429,
}


@dataclass(frozen=True)
class Identity:
    kind: str  # "user" | "service"
    name: str
    groups: tuple[str, ...]
    # The admin scope: see everything, and the admin actions (drain, preempt, quotas, ...).
    is_admin: bool
    # The gpuslice service's own token: the hub-side spawner uses it to allocate for a user
    # and to read every allocation; it carries no admin action.
    is_trusted: bool
    scopes: frozenset[str] = frozenset()
    # A server's token (``access:servers!server=ann/a`` and no wider server access): the
    # names of the owner's servers it may act for; None: any of them (the owner's own
    # token, an admin, the spawner). A server reports on its own slice, not its siblings'.
    servers: frozenset[str] | None = None

    @property
    def sees_all(self) -> bool:
        """May read (and the spawner release) every user's allocations, events and jobs."""
        return self.is_admin or self.is_trusted

    def acts_as_owner_of(self, alloc: dict[str, Any]) -> bool:
        """Whether this identity may act on ``alloc`` as its owner: the owner's own token,
        or the token of the server that holds it (never a sibling server's token)."""
        if self.kind != "user" or alloc["user"] != self.name:
            return False
        return self.servers is None or (
            alloc["purpose"] == "interactive" and alloc["server_name"] in self.servers
        )


def confined_servers(name: str, scopes: set[str]) -> frozenset[str] | None:
    """The servers of user ``name`` a token with ``scopes`` is confined to: those named by
    its ``access:servers!server=<name>/<server>`` scopes, when it has no wider
    ``access:servers`` (all servers, a user's, a group's). None when it is not confined:
    a user's own token, or the browser session, which carries no server access at all."""
    targets = [t for base, _, t in (s.partition("!") for s in scopes) if base == "access:servers"]
    if not targets or not all(t.startswith("server=") for t in targets):
        return None
    owned = (t[len("server=") :].partition("/") for t in targets)
    return frozenset(server for owner, _, server in owned if owner == name)


# A body over its route's limit is read to its end and thrown away, then refused with a 413
# that says why. Answered before the body was read, the connection closed on the rest: the
# client saw a reset, and configurable-http-proxy, still sending it, answered with its own 503
# page (write ECONNRESET) instead of the refusal. Beyond the limit plus this many bytes the
# connection is closed unread (tornado's bare 400): no client has a reason to send that much.
DISCARD_BYTES = 1 << 30


@web.stream_request_body
class BaseHandler(HubOAuthenticated, web.RequestHandler):
    """Every handler of the service. The body is streamed (``data_received``) and kept up to
    the route's limit (``body_limit``): what is larger is discarded as it arrives, never
    buffered, and refused once it has all arrived (``take_body``)."""

    @property
    def service(self) -> GPUSliceService:
        return self.settings["gpuslice"]

    def body_limit(self) -> tuple[int, str]:
        """The largest body this request may carry, and the setting that says so."""
        return self.service.max_body_bytes, "max_body_bytes"

    def prepare(self) -> Awaitable[None] | None:
        self._body = bytearray()
        self._body_over: str | None = None
        length = self.request.headers.get("Content-Length", "")
        chunked = "chunked" in self.request.headers.get("Transfer-Encoding", "").lower()
        if not chunked and (not length.isdigit() or int(length) == 0):
            # no body: no limit to look up (a GET, most requests)
            self._body_limit = 0
            return None
        self._body_limit, setting = self.body_limit()
        # tornado's own limit (the server's max_body_size) would close the connection
        set_max = getattr(self.request.connection, "set_max_body_size", None)
        if set_max is not None:
            set_max(self._body_limit + DISCARD_BYTES)
        if length.isdigit() and int(length) > self._body_limit:
            self._body_over = setting
        return None

    def data_received(self, chunk: bytes) -> None:
        if self._body_over is None and len(self._body) + len(chunk) > self._body_limit:
            # (a chunked body, whose size no header said)
            self._body_over = self.body_limit()[1]
            self._body = bytearray()
        if self._body_over is None:
            self._body += chunk

    def too_large_hint(self) -> str:
        """What the sender of a body over the limit can do about it."""
        return ""

    def take_body(self) -> None:
        """The body, now that all of it has arrived, as ``request.body``; a 413 when it was
        over the limit."""
        if getattr(self, "_body_over", None) is not None:
            limit = self._body_limit
            size = f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit} bytes"
            raise RequestError(
                413,
                f"request body is larger than {size}, the most the gpuslice service takes "
                f"here (GPUSliceService.{self._body_over}){self.too_large_hint()}",
            )
        if getattr(self, "_body", None):
            self.request.body, self._body = bytes(self._body), bytearray()

    @property
    def ledger(self):  # type: ignore[no-untyped-def]
        return self.service.ledger

    async def resolve_user(self) -> Any:
        """The hub user of this request, found without blocking the event loop.

        JupyterHub's ``current_user`` (``HubAuth.get_user`` called synchronously) runs the
        token check as a coroutine on a thread of its own and blocks the loop until it is
        done: a thread hop on every request, and, when the token is not in its cache, the
        whole round trip to the hub's API with every other request waiting. Awaited here,
        then kept where ``current_user`` finds it (with the checks it makes: allowed
        scopes, a token from the URL kept as a cookie)."""
        if not hasattr(self, "_hub_auth_user_cache"):
            model = await self.hub_auth.get_user(self, sync=False)
            allowed = None
            if model:
                try:
                    allowed = self.check_hub_user(model)
                except UserNotAllowed:
                    # Logged in, without the scope: a page's login check must answer 403,
                    # not send them to log in again (the hub would send them straight
                    # back: a redirect loop). JupyterHub's own path does the same.
                    refusal = f"{model.get('kind', 'user')} {model.get('name')} is not allowed"

                    def refuse(*args: Any, **kwargs: Any) -> None:
                        raise web.HTTPError(403, refusal)

                    self.redirect = refuse  # type: ignore[method-assign]
            self._hub_auth_user_cache = allowed
            if allowed:
                self.hub_auth._persist_url_token_if_set(self)
        return self._hub_auth_user_cache

    def identity(self) -> Identity:
        """Who is asking. Of the hub's services only gpuslice's own (the spawner) and those
        with the admin scope use the API: another (a Prometheus scraper given the metrics
        scope) is refused here, never taken for the user of the same name."""
        ident = self.token_identity()
        if ident.kind != "user" and not (ident.is_trusted or ident.is_admin):
            raise RequestError(
                403,
                f"service {ident.name!r} may not use this route: a hub service other than "
                f"gpuslice's own needs the {ADMIN_SCOPE} scope (with the "
                f"{METRICS_SCOPE} scope it may read /metrics only)",
            )
        return ident

    def token_identity(self) -> Identity:
        """The identity of the request's token, whatever kind (``identity`` checks it)."""
        model = self.current_user
        if not model:
            raise web.HTTPError(403)
        if "\x00" in model["name"]:
            # (JupyterHub takes such a name; PostgreSQL's text cannot hold it)
            raise RequestError(
                403, "this account's name holds a NUL character, which gpuslice cannot store"
            )
        scopes = set(model.get("scopes") or ())
        is_admin = ADMIN_SCOPE in scopes
        kind = model.get("kind", "user")
        trusted = kind == "service" and model.get("name") == self.service.service_name
        return Identity(
            kind=kind,
            name=model["name"],
            groups=tuple(model.get("groups") or ()),
            is_admin=is_admin,
            is_trusted=trusted,
            scopes=frozenset(scopes),
            servers=confined_servers(model["name"], scopes)
            if kind == "user" and not is_admin
            else None,
        )

    async def resolve_caller(self, ident: Identity, body: dict[str, Any], action: str) -> Caller:
        """Who a request acts for: the caller, or (only the spawner) ``body["user"]``.

        ``action`` completes the refusal messages, e.g. "allocate" or "submit jobs".
        Only the hub-side spawner (the service's own token) may state a user's groups;
        for anyone else they are looked up on the hub.
        """
        user = body.get("user")
        if user is None or (user == ident.name and ident.kind == "user"):
            if ident.kind != "user":
                raise RequestError(400, f"field 'user' is required when a service asks to {action}")
            if "groups" in body:
                raise RequestError(403, "only the hub-side spawner may state a user's groups")
            return Caller(ident.name, ident.groups, ident.name)
        if not isinstance(user, str) or not user:
            raise RequestError(400, "field 'user' must be a user name")
        if not ident.is_trusted:
            raise RequestError(403, f"{ident.name} may not {action} for {user}")
        groups = body.get("groups")
        if groups is None:
            looked_up = await self.service.hub_api.user_groups(user)
            if looked_up is None:
                raise RequestError(404, f"no such user {user!r} on the hub")
            groups = list(looked_up)
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise RequestError(400, "field 'groups' must be a list of group names")
        return Caller(user, tuple(groups), ident.name)

    def listed_user(self, ident: Identity, what: str) -> str | None:
        """The ``?user=`` a listing is for: anyone for admins (None: all), else oneself."""
        user = self.get_argument("user", None)
        if ident.sees_all:
            return user
        if user not in (None, ident.name):
            raise RequestError(403, f"{ident.name} may not list {user}'s {what}")
        return ident.name

    def visible_allocation(self, ident: Identity, alloc_id: int | str) -> dict[str, Any]:
        """The allocation, if the caller may see it (its owner, an admin, the spawner).
        Anyone else gets the answer a missing one gets: ids are not a side channel."""
        if isinstance(alloc_id, str):
            alloc_id = self.db_id(alloc_id, "allocation")
        alloc: dict[str, Any] | None = self.ledger.get(alloc_id) if alloc_id > 0 else None
        if alloc is None or not (ident.sees_all or ident.acts_as_owner_of(alloc)):
            raise RequestError(404, f"no allocation {alloc_id}")
        return alloc

    def held_allocation(self, ident: Identity, alloc_id: int | str) -> dict[str, Any]:
        """A live interactive allocation that the caller holds: its owner's own token or its
        server's token. The only allocations a client may report on; admins are no holders."""
        if isinstance(alloc_id, int) and not 0 < alloc_id <= MAX_DB_ID:
            raise RequestError(404, f"no allocation {alloc_id}")
        alloc = self.visible_allocation(ident, alloc_id)
        if not ident.acts_as_owner_of(alloc):
            raise RequestError(
                403, f"only the holder of allocation {alloc_id} may report on it or release it"
            )
        if alloc["state"] != "active":
            raise RequestError(409, f"allocation {alloc_id} is already released")
        if alloc["purpose"] != "interactive":
            raise RequestError(409, f"allocation {alloc_id} is a batch job's, not a server's")
        return alloc

    def reason(self, body: dict[str, Any], required: bool = False) -> str:
        """``body["reason"]``, which admin actions record with the change."""
        reason = body.get("reason", "")
        if not isinstance(reason, str) or len(reason) > 1000:
            raise RequestError(400, "field 'reason' must be a string (1000 characters at most)")
        if required and not reason.strip():
            raise RequestError(400, "field 'reason' is required: say why, it is recorded")
        return reason.strip()

    def optional_reason(self) -> str:
        """The reason in an optional ``{"reason": ...}`` body (DELETE, preempt)."""
        self.take_body()
        return self.reason(self.json_body({"reason"}) if self.request.body else {})

    def json_body(
        self, allowed: Collection[str], max_bytes: int | None = None, notebook: str | None = None
    ) -> dict[str, Any]:
        """The request's JSON object (see :mod:`gpuslice.jsonbody` for what is refused).

        ``max_bytes``: a larger limit for a body that carries a notebook (in the field
        ``notebook``), whose strings (cell outputs) may then be as long as the body, and
        hold any character: it is stored as a file."""
        self.take_body()
        limit = max_bytes or self.service.max_body_bytes
        kw = {"max_string": limit} if max_bytes else {}
        files = (notebook,) if notebook else ()
        try:
            return parse_json_object(
                self.request.body, allowed, max_bytes=limit, file_fields=files, **kw
            )
        except BodyError as e:
            raise RequestError(e.status, str(e)) from e

    def decode_argument(self, value: bytes, name: str | None = None) -> str:
        """A URL's path part or query argument, refused with a 400 when it holds a NUL
        (``%00``): no route names one, and PostgreSQL's text cannot hold it (a lookup by
        it was a 500 there). Tornado would turn one in a query argument into a space."""
        text = super().decode_argument(value, name)
        if "\x00" in text:
            raise RequestError(400, "the URL holds a NUL character (%00)")
        return text

    def db_id(self, raw: str, what: str) -> int:
        """A ``{id}`` from the URL: ids beyond what the database stores do not exist."""
        # (a 5000-digit id would not even convert: Python limits int() of long strings)
        value = int(raw) if len(raw) <= 19 else 0
        if not 0 < value <= MAX_DB_ID:
            raise RequestError(404, f"no {what} {raw[:40]}")
        return value

    def write_json(self, data: Any, status: int = 200) -> None:
        self._send_json(dumps(data), status)

    async def write_computed(
        self, compute: Callable[[], Any], status: int = 200, pool: Executor | None = None
    ) -> None:
        """Compute a response and write its JSON in a worker thread, then send it. For what
        reads the ledger or grows with the cluster: neither the reads (which wait for the
        caches' locks) nor the writing (the admin overview at 200 hosts is 1.6 MB, 24 ms of
        ``json.dumps``) then hold up the requests waiting on the event loop. ``pool``: the
        threads to use (default: the shared ones)."""
        loop = asyncio.get_running_loop()
        text = await loop.run_in_executor(pool, lambda: dumps(compute()))
        self._send_json(text, status)

    def _send_json(self, text: str, status: int) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(text)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        body: dict[str, Any] = {"status": status_code, "message": self._reason}
        if isinstance(exc, web.HTTPError) and exc.log_message:
            body["message"] = exc.log_message % exc.args if exc.args else exc.log_message
        self.set_header("Content-Type", "application/json")
        self.finish(dumps(body))

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, Refused):
            status = STATUS_BY_CODE[e.code]
            body = {"status": status, "message": e.message, "code": e.code, **e.detail}
        elif isinstance(e, Pending):
            # under way, not refused: the caller asks again after detail["retry_after"]
            status = 202
            body = {"status": status, "message": e.message, "code": "preempting", **e.detail}
        elif isinstance(e, RequestError):
            status = e.status
            body = {"status": status, "message": e.message, **e.detail}
        elif isinstance(e, JSONError):
            # The service's own call to the hub's API failed (the hub restarting, say): the
            # request was fine and the service could not complete it. (The hub's address is
            # for the log, not for the caller.)
            self.service.log.warning("%s %s: %s", self.request.method, self.request.path, e)
            if e.status >= 500:
                status, message = 503, "the hub did not answer the gpuslice service"
            else:
                status, message = 502, f"the hub refused a request of the gpuslice service ({e})"
            body = {"status": status, "message": f"{message}; try again in a moment"}
        else:
            super()._handle_request_exception(e)  # type: ignore[misc]
            return
        if self._finished:
            return
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(dumps(body))


class NotFoundHandler(BaseHandler):
    """Every path the service does not serve: a JSON 404 like every other refusal (once
    the body has arrived: see ``DISCARD_BYTES``)."""

    async def refuse(self, *args: Any) -> None:
        raise RequestError(404, f"no such route: {self.request.path[:200]}")

    get = post = put = patch = delete = head = options = refuse


F = TypeVar("F", bound=Callable[..., Awaitable[None]])
MAX_DB_ID = 2**63 - 1  # BIGINT / SQLite INTEGER


# A list longer than this, at the top of a response or in one of its top-level fields, is
# written one item at a time (``dumps``).
PIECE_ITEMS = 32


def dumps(data: Any) -> str:
    """JSON that every client can parse: a non-finite float (which no stored figure should
    be, but a response must never break on) is written as null rather than as NaN.

    Written in pieces, the same text as one ``json.dumps``: the C encoder holds the GIL for
    its whole call, so the admin overview at 200 hosts (2.5 MB: 28 to 57 ms in one call)
    stopped the event loop's thread for as long, though it was written in a worker thread.
    Its long lists (hosts, jobs, events) are written an item at a time; between two items
    the loop gets its turn."""
    if (
        isinstance(data, dict)
        and any(_long(v) for v in data.values())
        and all(isinstance(k, str) for k in data)
    ):
        fields = (f"{json.dumps(k)}: {_list_in_pieces(v)}" for k, v in data.items())
        return "{" + ", ".join(fields) + "}"
    return _list_in_pieces(data)  # (a short answer: in one call, which is quicker)


def _long(value: Any) -> bool:
    return isinstance(value, list) and len(value) > PIECE_ITEMS


def _list_in_pieces(value: Any) -> str:
    if _long(value):
        return "[" + ", ".join(_one_piece(v) for v in value) + "]"
    return _one_piece(value)


def _one_piece(value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def api_authenticated(method: F) -> F:
    """Like ``web.authenticated``, but answers 403 in JSON instead of redirecting to login."""

    @functools.wraps(method)
    async def wrapper(self: BaseHandler, *args: Any, **kwargs: Any) -> None:
        self.take_body()  # (a body over the limit is refused before anything else)
        if not await self.resolve_user():
            raise RequestError(
                403, "authentication required: send a JupyterHub token or log in through the hub"
            )
        await method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def id_page(found: list[dict[str, Any]], limit: int, key: str) -> dict[str, Any]:
    """``{key: page, "next": id}`` from ``limit + 1`` rows asked for: one more than the page
    tells whether there is a next one, which starts after the page's last id."""
    page = found[:limit]
    return {key: page, "next": page[-1]["id"] if len(found) > limit else None}


def int_arg(handler: web.RequestHandler, name: str, default: int, lo: int, hi: int) -> int:
    raw = handler.get_argument(name, None)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise RequestError(400, f"query argument {name} must be an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise RequestError(400, f"query argument {name} must be between {lo} and {hi}")
    return value
