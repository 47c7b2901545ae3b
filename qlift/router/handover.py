"""A router restart without an outage (``qlift router --take-over``): the running router hands its listening
socket and its admin-set state to a new process, then drains and exits.

Every router listens, besides its TCP port, on a Unix socket of its own (``handover_path``: 0600, in a 0700
directory, callers of another user id refused). A new process started with ``--take-over`` connects there and
receives the TCP listening socket itself (SCM_RIGHTS) and, as JSON, what a state file keeps (weights, shadow
settings, the live backend list; never a token). It serves on that socket, the same kernel accept queue, so
no connection is refused or reset (two SO_REUSEPORT listeners would each have a queue of their own, and the
old one's would be reset when it closes), then writes ``ready``. Only then does the old router close its
copy; from the hand-over on its answers carry ``Connection: close``, and it exits once its requests are done
(``drain_s``). If the new process goes away before ``ready``, the old router goes on as if nothing happened.
Admin writes to the old router from the hand-over to its exit get 503 (``HANDOVER_HEADER``), which
``RouterClient`` retries: they reach the new process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import socket
import struct
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from qlift.errors import BadInputError
from qlift.router.client import HANDOVER_HEADER
from qlift.router.proxy import json_error

if TYPE_CHECKING:
    from qlift.router.app import Router
    from qlift.router.config import BackendConfig
    from qlift.router.state import Saved, SavedState

log = logging.getLogger("qlift.router.app")

READY_WAIT_S = 120.0  # how long the old router waits for the new one's `ready` (its first health round included)
IDLE_CLOSE_S = 1.0  # after the hand-over, a kept-alive connection idle this long is closed (others: Connection: close)
_MAX_UNIX_PATH = 100  # sun_path holds 108 bytes on Linux, 104 on macOS


def handover_path(host: str, port: int) -> Path:
    """Where the router listening on ``host:port`` offers its hand-over: under QLIFT_HOME/run, or a short
    name under the temp dir when that path is too long for a Unix socket."""
    from qlift.settings import qlift_home

    path = qlift_home() / "run" / f"router-{host}-{port}.sock"
    if len(os.fsencode(path)) > _MAX_UNIX_PATH:
        digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:16]
        path = Path(tempfile.gettempdir()) / f"qlift-{os.getuid()}" / f"router-{digest}.sock"
    return path


def _private_dir(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.parent.stat().st_uid != os.getuid():
        raise BadInputError(f"{path.parent} belongs to another user: refusing to offer the router's socket there",
                            hint="Set QLIFT_HOME to a directory of your own.")
    os.chmod(path.parent, 0o700)


def _peer(conn: socket.socket) -> tuple[int | None, int | None]:
    """(pid, uid) of the process at the other end of a Unix socket; (None, None) where the OS does not say."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None, None
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


@dataclass
class Inherited:
    """What the new process got from the router it takes over; ``confirm`` once serving on ``sock``."""

    sock: socket.socket  # the TCP listening socket, shared with the old process until it closes its copy
    pid: int  # the old router's
    state: dict[str, Any]  # the old router's ``snapshot``
    channel: socket.socket

    def confirm(self) -> None:
        """Tell the old router to stop accepting and drain."""
        try:
            self.channel.sendall(b"ready\n")
        except OSError as exc:
            log.warning("could not tell the old router (pid %d) that this one is ready (%s): stop it by hand "
                        "if it still runs", self.pid, exc.strerror or exc)
        self.channel.close()

    def abandon(self) -> None:
        """Give up: the old router goes on serving."""
        self.channel.close()
        self.sock.close()


def inherit(host: str, port: int, *, timeout_s: float = 10.0) -> Inherited | None:
    """Ask the router on ``host:port`` for its listening socket and state; None when none offers them."""
    if port == 0:
        raise BadInputError("--take-over needs the port of the router to take over", field="--port",
                            hint="Pass the running router's --port (and --host, if not 127.0.0.1).")
    path = handover_path(host, port)
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    channel.settimeout(timeout_s)
    try:
        channel.connect(os.fsdecode(path))
    except (FileNotFoundError, ConnectionRefusedError):
        channel.close()
        return None
    try:
        _pid, uid = _peer(channel)
        if uid is not None and uid != os.getuid():
            raise BadInputError(f"the router's hand-over socket {path} is served by user id {uid}, not this one",
                                hint="Run the new router as the user that runs the old one.")
        message, fds, _flags, _addr = socket.recv_fds(channel, 1 << 16, 1)
        while message and not message.endswith(b"\n"):
            more = channel.recv(1 << 16)
            if not more:
                break
            message += more
        if not fds:
            raise BadInputError(f"the router at {host}:{port} answered the hand-over without its socket",
                                hint="Stop it, then start this one without --take-over.")
        offer = json.loads(message)
        os.set_inheritable(fds[0], False)
        sock = socket.socket(fileno=fds[0])
    except (OSError, ValueError) as exc:
        channel.close()
        raise BadInputError(f"could not take over the router at {host}:{port}: {exc}",
                            hint="It goes on serving; stop it, then start this one without --take-over.") from None
    channel.settimeout(None)
    return Inherited(sock=sock, pid=int(offer["pid"]), state=offer["state"], channel=channel)


def snapshot(router: Router) -> dict[str, Any]:
    """What the router hands over: the state file's fields (weights, shadow, the live backend list and the
    configuration's fingerprint; no token) and which backends are spares (weight 0 from the configuration)."""
    from qlift.router.state import spec_of

    backends = router.balancer.backends
    return {"weights": router.balancer.weights,
            "shadow": router.shadow.settings.as_dict() if router.shadow else None,
            "backends": [spec_of(b) for b in backends], "configured": router.saved.configured,
            "spare": [b.name for b in backends if b.spare]}


@dataclass
class Carried:
    """The old router's state, as the new one starts from it."""

    saved: Saved
    spare: set[str]

    def adopt(self, saved: SavedState, configured: list[BackendConfig]) -> Saved:
        """What the new router starts from; its state file keeps it under this configuration from now on."""
        from qlift.router.state import fingerprint

        saved.configured = fingerprint(configured)
        return self.saved


def carried_state(inherited: Inherited, configured: list[BackendConfig]) -> Carried:
    """The old router's state for a new one configured with ``configured``: its live backend list, weights
    and shadow settings win, as a state file's do, when it started from the same configured backends (or now
    runs exactly these). Otherwise BadInputError: a take-over never changes what serves."""
    from qlift.router.config import BackendConfig, check_weights
    from qlift.router.state import Saved, fingerprint, spec_of
    from qlift.router.wire import ShadowSettings

    state = inherited.state
    try:
        backends = [BackendConfig.model_validate(b) for b in state["backends"]]
        by_name = sorted(map(spec_of, backends), key=lambda s: s["name"])
        if state.get("configured") != fingerprint(configured) and \
                by_name != sorted(map(spec_of, configured), key=lambda s: s["name"]):
            raise ValueError(f"it serves backends {', '.join(s['name'] for s in by_name)} and was started "
                             "with other ones than this configuration names")
        names = [b.name for b in backends]
        weights = check_weights(state["weights"], names)
        shadow = ShadowSettings.parse(state["shadow"], names) if state.get("shadow") else None
    except (ValueError, KeyError, TypeError) as exc:
        inherited.abandon()
        raise BadInputError(f"cannot take over the router (pid {inherited.pid}), which was left running: {exc}",
                            hint="Start this one with the backends that router serves (see its /admin/state), "
                                 "or stop it, then start this one without --take-over.") from None
    return Carried(Saved(weights, shadow, backends), set(state.get("spare") or []))


class HandoverOffer:
    """The running router's side: offers its listening socket to one new process at a time; ``done`` is set
    once one has taken over (``taker``: its pid). Admin writes wait out each attempt (``hold_admin_writes``)."""

    def __init__(self, router: Router, port: int) -> None:
        self.router = router
        self.path = handover_path(router.config.host, port)
        self.done = asyncio.Event()
        self.taker: int | None = None
        self._server: socket.socket | None = None
        self._inode: int | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, router: Router) -> HandoverOffer | None:
        """Offer the router's listening socket (replacing the offer of a router it took over, or a stale one);
        None, with a warning, where it cannot."""
        assert router.runner is not None
        tcp = next((site._server for site in router.runner.sites), None)
        sockets: list[Any] = list(getattr(tcp, "sockets", None) or [])
        if len(sockets) != 1:
            return None
        offer = cls(router, sockets[0].getsockname()[1])
        try:
            _private_dir(offer.path)
            with contextlib.suppress(FileNotFoundError):
                offer.path.unlink()
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(os.fsdecode(offer.path))
            os.chmod(offer.path, 0o600)
            server.listen(4)
            server.setblocking(False)
        except (OSError, BadInputError) as exc:
            log.warning("no take-over of this router will be possible: cannot listen on %s (%s)", offer.path,
                        getattr(exc, "strerror", None) or exc)
            return None
        offer._server, offer._inode = server, offer.path.stat().st_ino
        offer._task = asyncio.get_running_loop().create_task(offer._serve(sockets[0].fileno()))
        return offer

    async def _serve(self, listening_fd: int) -> None:
        loop = asyncio.get_running_loop()
        assert self._server is not None
        while not self.done.is_set():
            conn, _ = await loop.sock_accept(self._server)
            with conn:
                await self._offer(conn, listening_fd)

    async def _offer(self, conn: socket.socket, listening_fd: int) -> None:
        pid, uid = _peer(conn)
        if uid is not None and uid != os.getuid():
            log.warning("refused a take-over from user id %d (pid %s): only this router's user may", uid, pid)
            return
        conn.setblocking(False)
        self.router.handover_to = pid or 0
        offer = json.dumps({"pid": os.getpid(), "state": snapshot(self.router)}).encode() + b"\n"
        answer = b""
        try:
            socket.send_fds(conn, [offer], [listening_fd])
            async with asyncio.timeout(READY_WAIT_S):
                while not answer.endswith(b"\n"):
                    more = await asyncio.get_running_loop().sock_recv(conn, 64)
                    if not more:
                        break
                    answer += more
        except (OSError, TimeoutError) as exc:
            log.warning("take-over by pid %s broke off (%s)", pid, exc)
        if answer.strip() == b"ready":
            self.taker = pid
            self.done.set()
            log.info("handed the listening socket over to pid %s: draining, then exiting", pid)
        else:
            self.router.handover_to = None
            log.warning("take-over by pid %s did not complete: this router goes on serving", pid)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(OSError):  # the path is the new router's once it took over
                if self.path.stat().st_ino == self._inode:
                    self.path.unlink()


def hold_admin_writes(router: Router) -> Any:
    """Middleware: while the router hands over, an admin write gets 503 with HANDOVER_HEADER (its state went to
    the new process already); ``RouterClient`` retries it, and reaches the new process."""

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        if router.handover_to is not None and request.method not in ("GET", "HEAD") and \
                request.path.startswith("/admin/") and router.is_admin(request):
            return json_error(503, f"this router process is handing over to pid {router.handover_to} (qlift router "
                              "--take-over): retry in a moment, the new process answers", "service_unavailable",
                              headers={"Retry-After": "1", HANDOVER_HEADER: str(router.handover_to)})
        response: web.StreamResponse = await handler(request)
        return response

    return middleware


def close_after_handover(router: Router) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """A response hook: while the router hands over, answers close their connection, so the client's next
    request opens a new one, which the new process accepts."""

    async def hook(request: web.Request, response: web.StreamResponse) -> None:
        if router.handover_to is not None:
            response.headers["Connection"] = "close"
            response.force_close()

    return hook


async def first_set(*events: asyncio.Event) -> asyncio.Event:
    """Wait until one of ``events`` is set; that one."""
    waits = {asyncio.ensure_future(e.wait()): e for e in events}
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    return waits[next(iter(done))]


def busy(conn: Any) -> bool:
    """Whether a server connection is answering a request (or has one waiting to be read)."""
    return bool(getattr(conn, "_request_in_progress", True) or getattr(conn, "_messages", None))


async def let_connections_go(connections: Callable[[], list[Any]], until: float) -> None:
    """After a hand-over: wait for the connections to end (responses carry ``Connection: close``), closing one
    once idle for IDLE_CLOSE_S (a client about to reuse it is unlikely then), until the loop time ``until``."""
    loop = asyncio.get_running_loop()
    idle_since: dict[int, float] = {}
    while connections() and loop.time() < until:
        now = loop.time()
        for conn in connections():
            if busy(conn):
                idle_since.pop(id(conn), None)
            elif now - idle_since.setdefault(id(conn), now) >= IDLE_CLOSE_S:
                conn.close()
        await asyncio.sleep(0.05)
