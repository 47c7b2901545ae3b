"""A version served by a pool: N vLLM servers behind one vllm-router, reported as one URL.

``prepare_pool`` splits this machine between the replicas (CPU cores by ``VLLM_CPU_OMP_THREADS_BIND``, GPUs by
``CUDA_VISIBLE_DEVICES``), plans one replica on its share and lays out each replica's launch on a free 127.0.0.1
port; vllm-router (PyPI ``vllm-router``) listens on the options' host and port. ``PoolHandle`` starts the replicas,
waits for each /health, then starts vllm-router in front, and stops them all together.

vllm-router balances, retries a failed request on another replica and takes a dead one out of rotation (its
health checks and circuit breaker). Its own /health answers 503 while any worker is unhealthy, so the handle also
removes a replica whose process exited from vllm-router's list (``POST /remove_worker``): the pool's /health then
speaks for the replicas still running. It forwards /v1/models, /metrics and /v1/load_lora_adapter to one replica:
qlift reads /metrics and loads adapters on each replica directly (docs/serve.md, "Replica pools").
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from qlift import httpclient
from qlift.errors import ExternalToolError, IncompatibleError
from qlift.hardware import Hardware
from qlift.models.ref import ModelRef
from qlift.serve.handle import ServeHandle
from qlift.serve.launch import LaunchSpec, config_server, config_yaml, prepare
from qlift.serve.options import ServeOptions
from qlift.vllm.logview import LogView
from qlift.vllm.process import bound_cores, child_setup, free_port

log = logging.getLogger(__name__)
CPU_BIND = "VLLM_CPU_OMP_THREADS_BIND"
GPU_BIND = "CUDA_VISIBLE_DEVICES"
REPLICA_HOST = "127.0.0.1"  # replicas are the router's, never the clients'
# vllm-router's checks, so a dead replica leaves rotation within seconds: /health each second, out after 2 misses
# (3 s each at most). A request is tried up to 5 times (vllm-router counts the first try); a replica that failed 2
# is skipped by its circuit breaker for 10 s, so the later tries reach another replica. With 3 tries and a breaker
# at 3, power_of_two could send all three to a just-killed replica (it has no load), one request in eight.
ROUTER_CHECKS = ("--health-check-interval-secs", "1", "--health-failure-threshold", "2",
                 "--health-success-threshold", "1", "--health-check-timeout-secs", "3",
                 "--retry-max-retries", "5", "--retry-initial-backoff-ms", "50", "--retry-max-backoff-ms", "1000",
                 "--cb-failure-threshold", "2", "--cb-success-threshold", "1", "--cb-timeout-duration-secs", "10")
RETRY_WINDOW_S = 5.0  # the longest a request waits on a dead replica: its retries' backoffs, well within this


def router_binary() -> str:
    """vllm-router's console script: beside this interpreter (qlift's venv), else on PATH."""
    beside = Path(sys.executable).parent / "vllm-router"
    found = str(beside) if beside.is_file() else shutil.which("vllm-router")
    if found is None:
        raise IncompatibleError("--replicas needs vllm-router, which is not installed",
                                hint="pip install 'qlift[pool]' (the vllm-router package).")
    return found


@dataclass(frozen=True)
class Share:
    """What one replica gets of this machine: the environment that binds it and how to say so."""

    env: dict[str, str]
    text: str  # "cores 0-7", "GPUs 2,3"


def _span(ids: list[int]) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for these cores: "0-3" when contiguous, else "0,2,5"."""
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else str(ids[0])
    return ",".join(map(str, ids))


def cpu_cores(hw: Hardware, env: Mapping[str, str]) -> list[int]:
    """The cores the pool may use: those ``VLLM_CPU_OMP_THREADS_BIND`` names, else this process's (cgroup-capped)."""
    named = bound_cores(env.get(CPU_BIND))
    if named is not None:
        return sorted(named)
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(hw.cpu.cores))
    return mine[:hw.cpu.cores]


def replica_hardware(hw: Hardware, n: int, env: Mapping[str, str]) -> Hardware:
    """One replica's share of ``hw`` (its GPUs, cores and RAM divided by ``n``), what its plan is made for; refuses
    more replicas than GPUs (on a GPU machine) or cores."""
    if hw.gpus:
        if len(hw.gpus) < n:
            raise IncompatibleError(f"--replicas {n} needs a GPU per replica and {hw.describe()} has {len(hw.gpus)}",
                                    hint=f"Pass --replicas {len(hw.gpus)} or fewer.")
        return replace(hw, gpus=hw.gpus[:len(hw.gpus) // n])
    cores = cpu_cores(hw, env)
    if len(cores) < n:
        where = f"{CPU_BIND}={env.get(CPU_BIND)}" if env.get(CPU_BIND) else "this machine"
        raise IncompatibleError(f"--replicas {n} needs a CPU core per replica and {where} has {len(cores)}",
                                hint=f"Pass --replicas {len(cores)} or fewer.")
    return replace(hw, cpu=replace(hw.cpu, cores=len(cores) // n, memory_bytes=hw.cpu.memory_bytes // n))


def shares(plan_device: str, hw: Hardware, n: int, tp: int, env: Mapping[str, str]) -> list[Share]:
    """Each replica's cores (vllm-cpu: contiguous, as many each) or its ``tp`` GPUs."""
    if plan_device == "gpu":
        listed = env.get(GPU_BIND)
        visible = [d.strip() for d in listed.split(",") if d.strip()] if listed else \
            [str(i) for i in range(len(hw.gpus))]
        if len(visible) < n * tp:
            raise IncompatibleError(f"--replicas {n} at tensor_parallel_size {tp} needs {n * tp} GPUs and "
                                    f"{len(visible)} are visible", hint=f"Pass --replicas {len(visible) // tp or 1}.")
        groups = [visible[i * tp:(i + 1) * tp] for i in range(n)]
        return [Share({GPU_BIND: ",".join(g)}, f"GPU{'s' if tp > 1 else ''} {','.join(g)}") for g in groups]
    cores = cpu_cores(hw, env)
    each = len(cores) // n
    spans = [_span(cores[i * each:(i + 1) * each]) for i in range(n)]
    return [Share({CPU_BIND: s}, f"core{'s' if each > 1 else ''} {s}") for s in spans]


@dataclass
class PoolSpec:
    """A pool decided before anything starts: ``front`` is the version as clients see it (the router's host and
    port, the pool's run directory, one replica's plan); ``replicas`` each replica's launch."""

    front: LaunchSpec
    replicas: list[LaunchSpec]
    shares: list[Share]
    router_argv: list[str]
    router_metrics_port: int

    @property
    def base_url(self) -> str:
        return self.front.base_url

    @property
    def replica_urls(self) -> list[str]:
        return [r.base_url for r in self.replicas]


def replica_spec(front: LaunchSpec, index: int, share: Share) -> LaunchSpec:
    """``front``'s launch for replica ``index``: 127.0.0.1 on a free port, its run dir inside the pool's, bound to
    its share (over the recipe's environment and the caller's)."""
    port = free_port(REPLICA_HOST)
    options = replace(front.options, host=REPLICA_HOST, port=port, replicas=1)
    run_dir = front.run_dir / f"replica-{index}"
    env = {**front.env, **share.env}
    server = config_server(front.model, run_dir, options, front.engine_args, env)
    return replace(front, options=options, run_dir=run_dir, env=env, argv=server.argv(),
                   config_yaml=config_yaml(front.model.resolve(), REPLICA_HOST, port, front.served_model_name,
                                           front.engine_args))


def router_argv(front: LaunchSpec, workers: list[str], metrics_port: int) -> list[str]:
    o = front.options
    return [router_binary(), "--host", o.host, "--port", str(o.port), "--worker-urls", *workers,
            "--policy", o.router_policy, *ROUTER_CHECKS,
            "--worker-startup-timeout-secs", str(int(o.timeout_s)),
            "--prometheus-host", REPLICA_HOST, "--prometheus-port", str(metrics_port), "--log-level", "warning"]


def prepare_pool(model: ModelRef, options: ServeOptions, hardware: Hardware,
                 env: Mapping[str, str] | None = None) -> PoolSpec:
    """Plan one replica on its share of ``hardware`` and lay out ``options.replicas`` of them behind vllm-router;
    starts and writes nothing. ``env``: the caller's extra environment for vLLM (e.g. the cores to use)."""
    n = options.replicas
    merged = {**os.environ, **(env or {})}
    front = prepare(model, options, replica_hardware(hardware, n, merged))
    if env:
        front = replace(front, env={**front.env, **env})
    parts = shares(front.plan.device, hardware, n, front.plan.tensor_parallel_size, merged)
    front.notes.append(f"{n} replicas behind vllm-router (policy {options.router_policy}): "
                       + ", ".join(f"replica {i} on {s.text}" for i, s in enumerate(parts)))
    replicas = [replica_spec(front, i, s) for i, s in enumerate(parts)]
    metrics_port = free_port(REPLICA_HOST)
    return PoolSpec(front, replicas, parts, router_argv(front, [r.base_url for r in replicas], metrics_port),
                    metrics_port)


@dataclass
class PoolHandle(ServeHandle):
    """A started pool; a ``ServeHandle`` whose URL is vllm-router's and whose pid is vllm-router's (what a caller
    journals), holding each replica's handle. ``server``/``follow`` are replica 0's (its log reaches the view)."""

    pool: PoolSpec | None = None
    members: list[ServeHandle] = field(default_factory=list)
    router: subprocess.Popen[bytes] | None = None
    keep: bool = False
    gone: set[int] = field(default_factory=set)  # replicas whose process exited, taken out of vllm-router's list

    @classmethod
    def create_pool(cls, pool: PoolSpec, *, view: LogView | None = None, keep: bool = False) -> PoolHandle:
        pool.front.run_dir.mkdir(parents=True, exist_ok=False)
        members = [ServeHandle.create(spec, view=view if i == 0 else LogView(), keep=keep)
                   for i, spec in enumerate(pool.replicas)]
        first = members[0]
        return cls(pool.front, first.server, first.view, first.follow, pool=pool, members=members, keep=keep)

    @property
    def spec_pool(self) -> PoolSpec:
        assert self.pool is not None
        return self.pool

    @property
    def pid(self) -> int:
        return self.router.pid if self.router is not None else 0

    @property
    def router_log(self) -> Path:
        return self.spec.run_dir / "vllm-router.log"

    def pids(self) -> dict[str, int]:
        """Every process the pool started: each replica's (its process group) and vllm-router's."""
        out = {f"replica-{i}": m.pid for i, m in enumerate(self.members) if m.pid}
        return out | ({"vllm-router": self.pid} if self.pid else {})

    def launch(self, on_poll: Callable[[], None] | None = None,
               on_started: Callable[[int], None] | None = None) -> PoolHandle:
        """Start every replica, wait for each /health, then start vllm-router and wait for its /health (every
        replica healthy to it); ``on_started`` gets each pid as it starts."""
        for m in self.members:
            m.begin(on_started)
        for m in self.members:
            m.launch(on_poll=on_poll)
        self._start_router()
        if on_started is not None:
            on_started(self.pid)
        self._wait_router(on_poll)
        self.ready = True
        (self.spec.run_dir / "pool.pids").write_text(
            "".join(f"{name} {pid}\n" for name, pid in self.pids().items()))
        return self

    def _start_router(self) -> None:
        with open(self.router_log, "wb") as out:
            self.router = subprocess.Popen(
                self.spec_pool.router_argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "NO_COLOR": "1"}, start_new_session=True,
                preexec_fn=child_setup(cores=None, die_with_parent=not self.keep))

    def _wait_router(self, on_poll: Callable[[], None] | None) -> None:
        deadline = time.monotonic() + 60
        with httpclient.client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if on_poll is not None:
                    on_poll()
                if self.router is None or self.router.poll() is not None:
                    raise ExternalToolError("vllm-router exited at start", hint=f"See {self.router_log}.",
                                            tool="vllm-router")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.spec.base_url}/health").status_code == 200:
                        return
                time.sleep(0.2)
        raise ExternalToolError("vllm-router did not answer /health within 60 s", hint=f"See {self.router_log}.",
                                tool="vllm-router")

    def running(self) -> bool:
        return self.router is not None and self.router.poll() is None and any(m.running() for m in self.members)

    def take_out_dead(self, note: Callable[[str], None] | None = None) -> list[int]:
        """Replicas whose process exited since the last call, removed from vllm-router's list (it already routes
        around them; this makes its /health speak for those still running). Returns their indexes."""
        dead = [i for i, m in enumerate(self.members) if i not in self.gone and m.ready and not m.running()]
        for i in dead:
            self.gone.add(i)
            self.members[i].stop()  # what its process left behind (vLLM's engine core outlives a SIGKILLed API server)
            url = self.members[i].spec.base_url
            with contextlib.suppress(httpx.HTTPError):
                httpclient.post(f"{self.spec.base_url}/remove_worker", params={"url": url}, timeout=5.0)
            left = len(self.members) - len(self.gone)
            line = (f"replica {i} ({url}, pid {self.members[i].pid}) exited; vllm-router took it out, "
                    f"{left} of {len(self.members)} replicas serve")
            log.warning("%s", line)
            if note is not None:
                note(line)
        return dead

    def wait(self, on_poll: Callable[[], None] | None = None) -> None:
        """Until vllm-router or the last replica exits (then raise what ended it); a replica that exits before is
        taken out and noted."""
        while self.running():
            if on_poll is not None:
                on_poll()
            self.take_out_dead(self.view.note)
            self.flush_log()
            time.sleep(0.5)
        self.flush_log()
        if self.router is not None and self.router.poll() is not None:
            raise ExternalToolError(f"vllm-router exited (code {self.router.returncode})",
                                    hint=f"See {self.router_log}.", tool="vllm-router")
        raise ExternalToolError("every replica of the pool exited",
                                hint="See each replica's vllm.log in " + str(self.spec.run_dir), tool="vllm")

    def stop(self, drain_s: float = 0) -> float:
        """Stop vllm-router (it finishes its in-flight requests first), then every replica together; seconds."""
        from qlift.threads import map_unordered

        began = time.monotonic()
        proc = self.router
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=drain_s + 10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        for _ in map_unordered(lambda m: m.server.stop(drain_s=drain_s), self.members, workers=len(self.members),
                               name="qlift-pool-stop"):
            pass
        return time.monotonic() - began


def start_pool(pool: PoolSpec, *, keep: bool = False, view: LogView | None = None,
               on_started: Callable[[int], None] | None = None,
               on_poll: Callable[[], None] | None = None) -> PoolHandle:
    """Start ``pool`` and return once vllm-router answers /health; on any failure what started is stopped."""
    handle = PoolHandle.create_pool(pool, view=view, keep=keep)
    try:
        handle.launch(on_poll=on_poll, on_started=on_started)
    except BaseException:
        handle.stop()
        raise
    return handle

