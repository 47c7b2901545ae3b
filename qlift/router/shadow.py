"""Shadow traffic: a share of live requests is copied to a version no user sees.

The user gets the primary's answer only. The copy is sent alongside the primary, in a task
of its own that nothing waits on; its answer is kept only to pair it with the primary's for
the judge (``GET /admin/shadow``). Copies are capped (``max_inflight``). One over the cap waits
for a slot, behind at most ``max_inflight`` others and for at most ``COPY_WAIT_S``: copies finish
a moment after their primaries, so even light traffic briefly finds the cap full. Past that, or
aimed at a version out of rotation, a copy is dropped and counted: under load the copies go first.

With a ``partner`` (the judge's sample in a split window, where users see both versions), a request
either of the two serves is copied to the other one, so each pair holds both versions' answers to
one prompt whichever of them the user got.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

import aiohttp

from qlift.router.balancer import Backend
from qlift.router.config import TimeoutsConfig
from qlift.router.proxy import UPSTREAM_HEADERS, Attempt, SseRelay, answer_problem
from qlift.router.rewrite import ModelRewriter
from qlift.router.wire import ShadowSettings, ShadowState

log = logging.getLogger(__name__)

COPY_WAIT_S = 10.0  # a copy waits this long for a slot under the cap; sustained overload drops instead


class Shadow:
    """The current shadow settings, its counters and its copies in flight or waiting for a slot."""

    def __init__(self, settings: ShadowSettings) -> None:
        self.settings = settings
        self.sent = 0
        self.dropped = 0
        self.inflight = 0
        self.waiting = 0
        self._share = 0.0  # percent owed: every request adds `percent`, a copy takes 100
        self._freed: asyncio.Condition | None = None

    def state(self) -> ShadowState:
        return ShadowState(**self.settings.as_dict(), sent=self.sent, dropped=self.dropped, inflight=self.inflight,
                           waiting=self.waiting)

    def wants(self, primary: Backend) -> bool:
        """This request's turn to be copied (an exact share of the requests it may copy)."""
        if self.settings.target_for(primary.name) is None:
            return False
        self._share += self.settings.percent
        if self._share < 100:
            return False
        self._share -= 100
        return True

    def admit(self, target: Backend) -> bool:
        """A slot now, or a place in the queue for one; counts the drop when there is neither."""
        cap = self.settings.max_inflight
        if self.inflight + self.waiting >= 2 * cap or not target.healthy or target.served_model is None:
            self.dropped += 1
            return False
        self.waiting += 1
        return True

    async def acquire(self, wait_s: float = COPY_WAIT_S) -> bool:
        """Take the slot admit() queued for, waiting up to ``wait_s``; False (counted dropped) when none freed."""
        if self._freed is None:
            self._freed = asyncio.Condition()
        try:
            async with self._freed:
                async with asyncio.timeout(wait_s):
                    await self._freed.wait_for(lambda: self.inflight < self.settings.max_inflight)
                self.inflight += 1
                self.sent += 1
                return True
        except TimeoutError:
            self.dropped += 1
            return False
        finally:
            self.waiting -= 1

    async def release(self) -> None:
        assert self._freed is not None
        async with self._freed:
            self.inflight -= 1
            self._freed.notify()


async def cancel_all(tasks: set[asyncio.Task[None]]) -> None:
    for task in list(tasks):
        task.cancel()
    for task in list(tasks):
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def send_copy(session: aiohttp.ClientSession, target: Backend, path: str, body: dict[str, Any], *,
                    request_id: str, timeouts: TimeoutsConfig) -> Attempt:
    """Send the copy and read its whole answer (never to a client), within the router's own time limits."""
    stream = bool(body.get("stream"))
    first_byte_s, idle_s, request_s = timeouts.first_byte_for(stream), timeouts.idle_s, timeouts.request_s
    payload = {**body, "model": target.served_model}
    if stream:
        options = body.get("stream_options")
        options = options if isinstance(options, dict) else {}
        payload["stream_options"] = {**options, "include_usage": True}
    att = Attempt(target.name, stream, target.served_model, validate=True, capture=True)
    deadline = att.started + request_s
    headers = {**UPSTREAM_HEADERS, "X-Request-Id": f"{request_id}-shadow"}
    try:
        async with asyncio.timeout(min(first_byte_s, request_s)):
            upstream = await session.post(target.url + path, data=json.dumps(payload).encode(), headers=headers)
        async with upstream:
            att.status = upstream.status
            if upstream.status != 200 or not stream:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    body_bytes = await upstream.read()
                att.ttfb_s = time.monotonic() - att.started
                if upstream.status != 200:
                    att.fail(f"http_{upstream.status // 100}xx", f"HTTP {upstream.status}")
                else:
                    problem = answer_problem(body_bytes)
                    if problem is not None:
                        att.fail(*problem)
                    else:
                        att.take_event(json.loads(body_bytes))
                        att.completed = True
            else:
                relay = SseRelay(att, ModelRewriter(None, None), strip_usage=False)
                while True:
                    async with asyncio.timeout(max(0.0, min(idle_s, deadline - time.monotonic()))):
                        chunk = await upstream.content.readany()
                    if not chunk:
                        break
                    if att.ttfb_s is None:
                        att.ttfb_s = time.monotonic() - att.started
                    relay.feed(chunk)
                if relay.error_event:
                    att.fail("error_event", "stream carried an error event")
                elif not relay.done:
                    att.fail("no_done", "stream ended without [DONE]")
                att.completed = att.reason is None
    except TimeoutError:
        att.fail("deadline" if time.monotonic() >= deadline else "timeout", "shadow copy timed out")
    except aiohttp.ClientError as exc:
        att.fail("upstream", f"{type(exc).__name__}")
    att.latency_s = time.monotonic() - att.started
    return att
