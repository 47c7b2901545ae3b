"""What keeps slow or abusive clients from exhausting the router: a header-read timeout, a
connection cap answered with 503, the open-files limit raised at start, and logs that say
each distinct error once per interval instead of once per request (with no tracebacks)."""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from qlift.errors import BadInputError
from qlift.router.config import redact_url

log = logging.getLogger(__name__)

FD_RESERVE = 64  # files the router needs besides client connections: logs, backend pools' spares, the filter
REFUSED_LINGER_S = 1.0  # a refused connection stays open this long for its 503 to be read

_BODY_503 = b'{"error":{"message":"too many connections to the router: retry later","type":"service_unavailable",' \
            b'"code":503}}'
RESPONSE_503 = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                b"Connection: close\r\nContent-Length: " + str(len(_BODY_503)).encode() + b"\r\n\r\n" + _BODY_503)
RESPONSE_408 = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit from %d to %d: %s", soft, target, exc)
    return soft


def connection_cap(wanted: int, open_files: int) -> int:
    """Client connections the router can hold: each may need a backend connection too (2 files)."""
    room = max(1, (open_files - FD_RESERVE) // 2)
    if wanted > room:
        log.warning("server.max_connections %d lowered to %d: the open-files limit is %d (raise `ulimit -n`)",
                    wanted, room, open_files)
    return min(wanted, room)


class OncePerInterval(logging.Filter):
    """One line per distinct error per interval: no traceback, later repeats counted and summed up."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        self._seen: dict[tuple[str, str, str], tuple[float, int]] = {}  # key -> (last shown, repeats since)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        kind = type(exc).__name__ if exc is not None else ""
        key = (record.name, str(record.msg), kind)
        now = self._clock()
        shown, repeats = self._seen.get(key, (None, 0))
        if shown is not None and now - shown < self.interval_s:
            self._seen[key] = (shown, repeats + 1)
            return False
        if len(self._seen) > 1000:  # distinct keys are few; a flood of new ones must not grow this
            self._seen.clear()
        self._seen[key] = (now, 0)
        message = "; ".join(part.strip() for part in record.getMessage().splitlines() if part.strip())
        if exc is not None:
            detail = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())[:200]
            message += f": {kind}" + (f": {redact_url(detail)}" if detail else "")
        if repeats:
            message += f" (and {repeats} more like it in the last {self.interval_s:g} s)"
        record.msg, record.args = f"router: {message}", None
        record.exc_info = record.exc_text = record.stack_info = None
        return True


NOISY_LOGGERS = ("aiohttp.server", "aiohttp.web", "aiohttp.access", "aiohttp.internal", "asyncio", __name__)


def install_log_guard(interval_s: float) -> Callable[[], None]:
    """Put a OncePerInterval filter on the loggers that see per-connection errors; returns its remover."""
    guard = OncePerInterval(interval_s)
    loggers = [logging.getLogger(name) for name in NOISY_LOGGERS]
    for logger in loggers:
        logger.addFilter(guard)

    def remove() -> None:
        for logger in loggers:
            logger.removeFilter(guard)

    return remove


class _HeaderTimedHandler(RequestHandler):
    """aiohttp's handler, closing a connection whose request headers do not arrive within a deadline.

    The clock starts when the connection opens and again when the first bytes of a later request
    on a kept-alive connection arrive; it stops once the headers are complete.
    """

    def __init__(self, *args: Any, header_timeout_s: float, on_timeout: Callable[[], None], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.header_timeout_s = header_timeout_s
        self.on_timeout = on_timeout
        self.header_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self.header_timer = self._loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        before = self._request_count
        super().data_received(data)
        if self._request_count > before:
            self._disarm()
        elif self.header_timer is None and not self._messages and not self._request_in_progress:
            self._arm()

    def _headers_late(self) -> None:
        self.header_timer = None
        waiting = self._waiter is not None and not self._waiter.done()
        if not waiting or self.transport is None:
            return  # a request is being handled: its body has its own timeout
        self.on_timeout()
        self.transport.write(RESPONSE_408)
        self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)


class _Refused(asyncio.Protocol):
    """A connection over the cap: a 503 at once, then closed (its request, if any, read and dropped)."""

    def __init__(self) -> None:
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(RESPONSE_503)
        if transport.can_write_eof():
            transport.write_eof()
        self.timer = asyncio.get_running_loop().call_later(REFUSED_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # the client is done: close

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()


class GuardedSite(web.TCPSite):
    """A TCPSite whose connections get a header timeout, and whose connections over ``max_connections``
    get a 503 instead of a handler."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, *, max_connections: int,
                 header_timeout_s: float, on_refused: Callable[[], None] = lambda: None,
                 on_header_timeout: Callable[[], None] = lambda: None, sock: socket.socket | None = None) -> None:
        super().__init__(runner, host, port)
        self.sock = sock  # a listening socket to serve on (one inherited from the router taken over), not host:port
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.on_refused = on_refused
        self.on_header_timeout = on_header_timeout

    def _protocol(self) -> asyncio.Protocol:
        server = self._runner.server
        assert server is not None
        if len(server.connections) >= self.max_connections:
            self.on_refused()
            log.warning("connection cap reached (%d open): new connections get 503", self.max_connections)
            return _Refused()
        return _HeaderTimedHandler(server, loop=server._loop, header_timeout_s=self.header_timeout_s,
                                   on_timeout=self._header_timeout, **server._kwargs)

    def _header_timeout(self) -> None:
        self.on_header_timeout()
        log.warning("closed connections whose request headers took over %g s (server.header_timeout_s)",
                    self.header_timeout_s)

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner (what TCPSite.start does first)
        loop = asyncio.get_running_loop()
        if self.sock is not None:
            self._server = await loop.create_server(self._protocol, sock=self.sock, backlog=self._backlog)
        else:
            self._server = await loop.create_server(self._protocol, self._host, self._port,
                                                    reuse_address=self._reuse_address, reuse_port=self._reuse_port,
                                                    backlog=self._backlog)
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port


def listen_error(host: str, port: int, exc: OSError) -> BadInputError:
    """A failure to listen, blamed on the right flag: an address that is not this machine's is --host's."""
    if isinstance(exc, socket.gaierror) or exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        return BadInputError(f"cannot listen on {host!r}: {exc.strerror or exc}", field="--host",
                             hint="Pass an address of this machine: 127.0.0.1, ::1, or 0.0.0.0 for every interface.")
    return BadInputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", field="--port",
                         hint="Pick another --port (0 = any free one).")
