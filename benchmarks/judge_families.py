"""Every failure family in every disguise, and every healthy style, through the real router and `qlift promote start`.

For each case of ``tests/judge_families.py`` (9 families x 5 disguises, broken tool calls x 6, 9 healthy styles):
two small OpenAI-style backends on 127.0.0.1 (the stable's answers, and the canary's: the same content, changed
in one way; tool calls streamed in pieces like vLLM's), the qlift router in front at 100/0, three clients sending
the multilingual deck (every third request streamed), then

    qlift promote start --router URL --stable stable --canary canary --steps 10,50,100 --interval 2s \\
        --min-requests 10 [--shadow 30% --shadow-min-pairs 20 --shadow-windows 2]

with default limits. Printed per case and phase: the outcome (a bad canary must be rolled back, a healthy one
promoted), the checks that failed, how many changed answers users read before the end, client errors, seconds.
Then the table per family that docs/promote-checks.md quotes. Minutes per case on 2 cores (no model runs: the
backends script their answers, as the hidden canaries do); ``--only FAMILY`` and ``--phase`` narrow it.

    .venv/bin/python benchmarks/judge_families.py [--only deflection] [--phase split] [--json out.json]
        [--interval 10s] [--no-early-answer-checks]   # the exposure figure: bad answers read, looks on and off
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from faults import RouterProcess, ScriptedBackend  # noqa: E402
from judge_families import Case, cases, deck, stable  # noqa: E402

TOKEN = "judge-families-token"


def stable_length(body: dict[str, Any], text: str) -> int:
    """Completion tokens as the stable's answer to the same request counts them: every canary is as long as the
    stable, so only what it says differs."""
    same_text, _, same_calls = stable(body)
    return max(1, len(same_text) // 4 + sum(len(c["function"]["arguments"]) // 4 for c in same_calls or []))


def _read(body: dict[str, Any], status: int, payload: str) -> tuple[str, list[dict[str, Any]] | None]:
    """The text and tool calls a client read (streamed chunks assembled)."""
    if not body.get("stream"):
        msg = json.loads(payload)["choices"][0]["message"]
        return msg.get("content") or "", msg.get("tool_calls")
    text, calls = "", {}
    for line in payload.split("\n"):  # not splitlines: misdecoded text holds U+0085, which it splits on
        if not line.startswith("data: {"):
            continue
        for c in json.loads(line[6:]).get("choices") or []:
            delta = c.get("delta") or {}
            text += delta.get("content") or ""
            for t in delta.get("tool_calls") or []:
                got = calls.setdefault(t["index"], {"name": "", "arguments": ""})
                f = t.get("function") or {}
                got["name"] += f.get("name") or ""
                got["arguments"] += f.get("arguments") or ""
    return text, [{"function": v} for _, v in sorted(calls.items())] or None


class Load:
    """Three clients sending the deck in a seeded order until stopped (at most ``limit`` requests); counts the
    changed answers users read (not the stable's answer to that request) and every client error."""

    def __init__(self, url: str, *, per_thread_rps: float = 30.0, limit: int = 20000) -> None:
        import httpx

        self.httpx = httpx
        self.url, self.pause_s, self.limit = url, 1.0 / per_thread_rps, limit
        self.bodies = [p.body for p in deck()]
        self.order = random.Random(0).choices(range(len(self.bodies)), k=limit)
        self.read = self.changed = 0
        self.errors: list[str] = []
        self._next = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(3)]

    def _one(self, client: Any, i: int) -> None:
        body = {**self.bodies[self.order[i]], "model": "pub", "max_tokens": 256, "stream": i % 3 == 0}
        r = client.post(f"{self.url}/v1/chat/completions", json=body)
        if r.status_code != 200:
            self.errors.append(f"{r.status_code} {r.text[:160]}")
            return
        text, calls = _read(body, r.status_code, r.text)
        want, _, want_calls = stable(body)
        same = text == want and [c["function"]["arguments"] for c in calls or []] == [
            c["function"]["arguments"] for c in want_calls or []]
        with self._lock:
            self.read += 1
            self.changed += not same

    def _run(self) -> None:
        with self.httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                with self._lock:
                    if self._next >= self.limit:
                        return
                    i, self._next = self._next, self._next + 1
                t0 = time.monotonic()
                try:
                    self._one(client, i)
                except (self.httpx.HTTPError, ValueError, KeyError) as exc:
                    self.errors.append(repr(exc)[:160])
                time.sleep(max(0.0, self.pause_s - (time.monotonic() - t0)))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


def run_case(case: Case, shadow: bool, tmp: Path, timeout_s: float, interval: str = "2s",
             more: tuple[str, ...] = ()) -> dict[str, Any]:
    journal = tmp / "j.sqlite"
    extra = ["--shadow", "30%", "--shadow-min-pairs", "20", "--shadow-windows", "2"] if shadow else []
    t0 = time.monotonic()
    with ScriptedBackend("m-stable", stable, prompt_tokens=24, completion_tokens=stable_length) as s, \
            ScriptedBackend("m-canary", case.answer, prompt_tokens=24, completion_tokens=stable_length) as c, \
            RouterProcess("--backend", f"stable={s.url}@m-stable", "--backend", f"canary={c.url}@m-canary",
                          "--weight", "stable=100", "--weight", "canary=0", "--public-model", "pub",
                          log_path=tmp / "router.log", token=TOKEN) as router, Load(router.url) as load:
        argv = [sys.executable, "-m", "qlift", "promote", "start", "--router", router.url, "--stable", "stable",
                "--canary", "canary", "--interval", interval, "--min-requests", "10", "--steps", "10,50,100",
                "--journal", str(journal), "--json", *extra, *more]
        env = {**os.environ, "QLIFT_ROUTER_TOKEN": TOKEN}
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s)
            rc, out = done.returncode, done.stdout
        except subprocess.TimeoutExpired:
            rc, out = -1, ""
    took = time.monotonic() - t0
    st = json.loads(out) if out.strip().startswith("{") else {}
    wins = list((st.get("shadow") or {}).get("windows") or []) + [w for step in st.get("steps") or []
                                                                 for w in step.get("windows") or []]
    back = [w for w in wins if w.get("action") == "rollback"]
    failed = sorted({x["name"] for x in back[-1]["checks"] if x["status"] == "fail"}) if back else []
    return {"case": case.name, "family": case.family, "healthy": case.healthy,
            "phase": "shadow" if shadow else "split", "exit": rc, "state": st.get("state", "timeout"),
            "failed": failed, "read_changed": load.changed, "read": load.read, "client_errors": len(load.errors),
            "seconds": round(took, 1)}


def table(rows: list[dict[str, Any]]) -> str:
    """Per family and phase: bad cases rolled back of all (healthy: promoted of all), changed answers read."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[(r["family"], r["phase"])].append(r)
    lines = ["| family | phase | right outcome | checks that failed | changed answers users read (median) |",
             "|---|---|---|---|---|"]
    for (family, phase), rs in sorted(by.items()):
        want = "promoted" if rs[0]["healthy"] else "rolled_back"
        ok = sum(r["state"] == want for r in rs)
        checks = sorted({c for r in rs for c in r["failed"]})
        reads = sorted(r["read_changed"] for r in rs)
        lines.append(f"| {family} | {phase} | {ok}/{len(rs)} {want.replace('_', ' ')} | {', '.join(checks) or '-'} "
                     f"| {reads[len(reads) // 2]} |")
    return "\n".join(lines)


def compare(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    """docs/promote-checks.md's rows: per family and phase, the right outcomes and the median changed answers users
    read, before and after."""
    def by(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
        out: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            out[(r["family"], r["phase"])].append(r)
        return out

    def right(rs: list[dict[str, Any]]) -> str:
        want = "promoted" if rs[0]["healthy"] else "rolled_back"
        return f"{sum(r['state'] == want for r in rs)}/{len(rs)} {want.replace('_', ' ')}"

    def median(rs: list[dict[str, Any]]) -> int:
        reads = sorted(r["read_changed"] for r in rs)
        return int(reads[len(reads) // 2])

    old, new = by(before), by(after)
    lines = []
    for key in sorted(new, key=lambda k: (k[0] == "healthy", k)):
        rs, was = new[key], old.get(key, [])
        checks = ", ".join(sorted({c for r in rs for c in r["failed"]})) or "-"
        lines.append(f"| {key[0]} ({len(rs)}) | {key[1]} | {right(was) if was else '-'} | {right(rs)} | {checks} | "
                     f"{median(was) if was else '-'} | {median(rs)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", action="append", help="a family (repeatable); default: all")
    ap.add_argument("--phase", choices=["split", "shadow", "both"], default="both")
    ap.add_argument("--timeout-s", type=float, default=240)
    ap.add_argument("--interval", default="2s", help="promote's window (default 2s)")
    ap.add_argument("--no-early-answer-checks", action="store_true",
                    help="judge answers only at each window's end (the exposure without sequential looks)")
    ap.add_argument("--json", type=Path, help="write every row here too")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                    help="print the table of two earlier --json runs (docs/promote-checks.md) and exit")
    args = ap.parse_args()
    if args.compare:
        print(compare(*(json.loads(p.read_text()) for p in args.compare)))
        return
    phases = [False, True] if args.phase == "both" else [args.phase == "shadow"]
    rows = []
    for case in cases():
        if args.only and case.family not in args.only:
            continue
        for shadow in phases:
            with tempfile.TemporaryDirectory(prefix="qlift-families-") as tmp:
                more = ("--no-early-answer-checks",) if args.no_early_answer_checks else ()
                row = run_case(case, shadow, Path(tmp), args.timeout_s, args.interval, more)
            rows.append(row)
            want = "promoted" if case.healthy else "rolled_back"
            mark = "ok " if row["state"] == want else "BAD"
            print(f"{mark} {row['case']:<34} {row['phase']:<6} {row['state']:<12} failed={','.join(row['failed'])} "
                  f"read_changed={row['read_changed']}/{row['read']} errors={row['client_errors']} "
                  f"{row['seconds']} s", flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
