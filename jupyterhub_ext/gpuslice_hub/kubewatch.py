"""What the Kubernetes API lists, kept current by a watch instead of listed again each pass.

A pass of the Kubernetes job backend needs every gpuslice Job and pod. Listing them each
pass costs in proportion to the queue (at 5 000 queued jobs, ~5 MB of JSON and ~2 s a
pass); a list once, then the API's watch from the list's ``resourceVersion``, costs what
changed. This is the informer pattern of the Kubernetes clients, kept small:

* ``snapshot()`` is None until the first list arrived, and again from the moment the watch
  broke (a connection refused or cut, an error answer, a 410) until a list and its watch
  are running again: the caller then lists for itself, as before, so an API outage reads
  as an outage. A stream that goes silent without closing is noticed by its read timeout
  (``WATCH_SECONDS`` and 30 s): until then the view lags (the backend lists for a Job it
  created that the view does not show, so its own creates are never missed);
* a watch the server ends in the normal way (its ``timeoutSeconds``) is started again from
  the last version seen, with nothing lost; a 410 (that version is too old) lists again;
* a watch the API forbids (403: the service account lacks ``watch``) is not tried again:
  the caller lists each pass, and the log says why once;
* the watch asks for bookmarks, so the last version seen stays recent even when nothing
  this watch selects changes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from .kubeapi import ApiSession, WatchExpired, list_versioned, watch_events

# A watch's length (the API's timeoutSeconds): also how long a connection that went silent
# without closing (a network partition) can go unnoticed, plus the read timeout's margin
WATCH_SECONDS = 60
RETRY_SECONDS = (1.0, 30.0)  # the wait after a failure, doubled each time up to the second


class Informer:
    """The objects one list call selects, as the API server last told them."""

    def __init__(
        self, session: ApiSession, api: str, method: str, log: logging.Logger, **selector: Any
    ) -> None:
        self.session = session
        self.api, self.method, self.selector = api, method, selector
        self.log = log
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, Any]] = {}  # name -> object
        self._current = False  # a list arrived and the watch following it is unbroken
        self._started = False
        self.version = ""  # the last resourceVersion applied
        self.lists = 0  # lists made (the first, and one after each 410 or break)

    def start(self) -> None:
        """Start listing and watching in the session's loop (once)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        self.session.keep_running(self._run)

    def snapshot(self) -> list[dict[str, Any]] | None:
        """Every object, or None while the watch is not known to be current."""
        with self._lock:
            return list(self._objects.values()) if self._current else None

    async def _run(self, api_client: Any) -> None:
        wait = RETRY_SECONDS[0]
        relist = True
        while True:
            try:
                if relist:
                    items, version = await list_versioned(
                        api_client, self.api, self.method, **self.selector
                    )
                    with self._lock:
                        self._objects = {_name(obj): obj for obj in items}
                        self.version, self._current = version, True
                        self.lists += 1
                    relist = False
                began = time.monotonic()
                if await self._follow(api_client) == 0 and time.monotonic() - began < 1:
                    # ended at once with nothing (a proxy cutting streams): not in a loop
                    await asyncio.sleep(wait)
                    wait = min(wait * 2, RETRY_SECONDS[1])
                else:
                    wait = RETRY_SECONDS[0]  # ended by the server in the normal way
            except asyncio.CancelledError:
                with self._lock:
                    self._current = False  # (the session closed: nothing follows now)
                raise
            except WatchExpired as e:
                self.log.info("the %s watch expired (%s): listing again", self.method, e)
                with self._lock:
                    self._current = False  # changes were missed until the list
                relist = True
            except Exception as e:
                if getattr(e, "status", None) == 403 and not relist:
                    self.log.warning(
                        "%s is not allowed to be watched (%s): the job pass lists it each "
                        "time instead (grant the service account 'watch')",
                        self.method,
                        getattr(e, "reason", e),
                    )
                    with self._lock:
                        self._current = False
                    return
                # what was missed meanwhile is unknown: the pass lists for itself until a
                # list and its watch are running again
                with self._lock:
                    self._current = False
                relist = True
                self.log.warning(
                    "the %s watch failed (%s); listing again in %.0f s", self.method, e, wait
                )
                await asyncio.sleep(wait)
                wait = min(wait * 2, RETRY_SECONDS[1])

    async def _follow(self, api_client: Any) -> int:
        """Apply the watch's events until the server ends it; how many came."""
        events = watch_events(
            api_client, self.api, self.method, self.version, WATCH_SECONDS, **self.selector
        )
        count = 0
        async for event in events:
            count += 1
            obj = event.get("object") or {}
            version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            kind = event.get("type")
            with self._lock:
                if kind in ("ADDED", "MODIFIED"):
                    self._objects[_name(obj)] = obj
                elif kind == "DELETED":
                    self._objects.pop(_name(obj), None)
                if version:
                    self.version = version
        return count


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")
