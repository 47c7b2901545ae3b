"""qlift eval without vLLM: prompt files, gates, bootstrap, metrics, reports, cache (transformers backend)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from qlift.errors import BadInputError
from qlift.eval.compare import summarize
from qlift.eval.gates import parse_gate
from qlift.eval.metrics import Score, parse_json_output, score
from qlift.eval.prompts import Example, load_prompts

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "examples" / "prompts" / "smoke.jsonl"


@pytest.fixture(autouse=True)
def _eval_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_EVAL_CACHE", str(tmp_path / "eval-cache"))


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = '{"id": "a", "messages": [{"role": "user", "content": "hi"}], "reference": "hello"}'


@pytest.mark.parametrize(
    ("bad", "expect"),
    [
        ('{"id": "b", "messages": [', "not valid JSON"),
        ('{"id": "b"}', "exactly one of 'messages' or 'prompt'"),
        ('{"id": "b", "prompt": "x", "checks": {"regex": "("}}', "invalid regular expression"),
        ('{"id": "b", "prompt": "x", "checks": {"json_schema": {"type": 5}}}', "invalid JSON Schema"),
        ('{"id": "b", "messages": [{"role": "robot", "content": "x"}]}', "field 'messages.0.role'"),
        ('{"id": "a", "prompt": "x"}', "duplicate id 'a' (first on line 1)"),
        ('{"id": "b", "prompt": "x", "colour": 1}', "field 'colour'"),
        ('["not", "an", "object"]', "must be a JSON object"),
    ],
)
def test_malformed_prompt_file_one_clear_error(tmp_path: Path, run_cli, bad: str, expect: str) -> None:
    f = _write(tmp_path / "p.jsonl", [GOOD, "", bad])
    r = run_cli("eval", tmp_path / "no-model", "--prompts", f)
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {f}:3: ")
    assert expect in lines[0]
    assert "Traceback" not in r.output


def test_example_prompt_set_loads() -> None:
    examples = load_prompts(SMOKE)
    assert len(examples) == 8
    assert {t for ex in examples for t in ex.tags} == {"qa", "json", "completion"}


@pytest.mark.parametrize(
    ("expr", "baseline", "threshold"),
    [
        ("rougeL >= baseline - 0.02", 0.5, 0.48),
        ("ppl <= baseline * 1.05", 10.0, 10.5),
        ("json_valid >= 0.98", None, 0.98),
        ("chrF > 1.1 * baseline", 50.0, 55.0),
        ("check_pass[json]>=baseline", 0.7, 0.7),
        ("latency < baseline + 1e-1", 1.0, 1.1),
    ],
)
def test_gate_grammar(expr: str, baseline: float | None, threshold: float) -> None:
    g = parse_gate(expr)
    assert g.threshold(baseline) == pytest.approx(threshold)


@pytest.mark.parametrize(
    "expr",
    ["rougeL >= baseline - ", "rougeL => 0.9", "__import__('os') >= 1", "bleu >= 0.3", "ppl <= baseline ** 2", ""],
)
def test_bad_gate_is_bad_input(expr: str) -> None:
    with pytest.raises(BadInputError, match="gate"):
        parse_gate(expr)


def test_bad_gate_fails_before_any_work(run_cli, smollm2_dir: Path, tmp_path: Path) -> None:
    r = run_cli("eval", smollm2_dir, "--baseline", smollm2_dir, "--prompts", SMOKE, "--gate", "rougeL >> 1",
                "--report", tmp_path / "rep")
    assert r.exit_code == 2
    assert "cannot parse the right-hand side '> 1' of gate 'rougeL >> 1'" in r.stderr
    assert not (tmp_path / "rep").exists()
    r = run_cli("eval", smollm2_dir, "--prompts", SMOKE, "--gate", "rougeL >= baseline")
    assert r.exit_code == 2 and "no --baseline was given" in r.stderr
    f = _write(tmp_path / "p.jsonl", ['{"id": "a", "prompt": "x"}'])
    r = run_cli("eval", smollm2_dir, "--prompts", f, "--gate", "json_valid >= 0.9")
    assert r.exit_code == 2 and "no example" in r.stderr and "json_valid" in r.stderr


def test_paired_bootstrap() -> None:
    same = [Score(v, v, 1.0) for v in (0.1, 0.5, 0.9, 0.3, 0.7)]
    s = summarize("rougeL", same, same, resamples=500, seed=0)
    assert (s.diff, s.ci_low, s.ci_high, s.wins, s.ties, s.losses) == (0.0, 0.0, 0.0, 0, 5, 0)
    better = [Score(v + 0.2, v + 0.2, 1.0) for v in (0.1, 0.5, 0.9, 0.3, 0.7)]
    s = summarize("rougeL", better, same, resamples=500, seed=0)
    assert s.ci_low == pytest.approx(0.2) and s.ci_high == pytest.approx(0.2) and s.wins == 5
    noisy = [Score(v, v, 1.0) for v in (0.3, 0.4, 0.9, 0.1, 0.8)]
    a = summarize("rougeL", noisy, same, resamples=500, seed=7)
    b = summarize("rougeL", noisy, same, resamples=500, seed=7)
    assert (a.ci_low, a.ci_high) == (b.ci_low, b.ci_high)  # fixed seed: reproducible
    assert a.ci_low is not None and a.ci_high is not None and a.ci_low < 0 < a.ci_high


def test_ppl_is_token_level() -> None:
    # NLL sums 2 and 8 over 1 and 4 tokens: corpus ppl = exp(10/5), not the mean of exp(2), exp(2).
    cand = [Score(0, 2.0, 1.0), Score(0, 8.0, 4.0)]
    s = summarize("ppl", cand, None, resamples=100, seed=0)
    assert s.candidate == pytest.approx(2.718281828**2)


def test_json_and_checks() -> None:
    from qlift.eval.generation import Generation

    assert parse_json_output('```json\n{"a": 1}\n```') == (True, {"a": 1})
    assert parse_json_output("Sure! {\"a\": 1}")[0] is False
    ex = Example.model_validate({
        "id": "x", "prompt": "p", "checks": {
            "json_schema": {"type": "object", "required": ["a"]}, "contains": ["1"], "max_chars": 20},
    })
    ok, bad = Generation('{"a": 1}', 5, 0.1), Generation('{"b": 1}', 5, 0.1)
    assert score("json_valid", ex, ok).value == 1.0  # type: ignore[union-attr]
    assert score("schema_pass", ex, bad).value == 0.0  # type: ignore[union-attr]
    assert score("check_pass", ex, ok).value == 1.0  # type: ignore[union-attr]
    assert score("rougeL", ex, ok) is None  # no reference: does not apply


class _ReportParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.charts: list[str] = []
        self.bars: list[tuple[str, str]] = []
        self.ci: list[dict[str, str | None]] = []
        self.rows: list[str] = []
        self.scripts = 0
        self._chart = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        cls = a.get("class") or ""
        if tag == "script":
            self.scripts += 1
        if tag == "svg" and "metric-chart" in cls:
            self._chart = a["data-metric"] or ""
            self.charts.append(self._chart)
        if tag == "rect" and cls.startswith("bar "):
            self.bars.append((self._chart, cls.split()[1]))
        if tag == "line" and cls == "ci" and "data-low" in a:
            self.ci.append(a)
        if tag == "tr" and cls == "example":
            self.rows.append(a["data-id"] or "")


@pytest.fixture
def hostile_prompts(tmp_path: Path) -> Path:
    lines = SMOKE.read_text(encoding="utf-8").splitlines()
    lines.append(json.dumps({"id": "<script>alert(1)</script>", "prompt": "<b>bold</b> & <script>x()</script>",
                             "reference": "</td></tr><script>", "tags": ["qa"]}))
    return _write(tmp_path / "hostile.jsonl", lines)


def test_transformers_backend_reports_and_cache(
    run_cli, tiny_qwen2_tied: Path, tiny_qwen2_untied: Path, hostile_prompts: Path, tmp_path: Path
) -> None:
    """Two different (random) models: real generations, all three reports, then a cached rerun."""
    rep = tmp_path / "report"
    args = ["eval", tiny_qwen2_untied, "--baseline", tiny_qwen2_tied, "--prompts", hostile_prompts,
            "--backend", "transformers", "--max-tokens", "8", "--bootstrap", "200"]
    r = run_cli(*args, "--gate", "rougeL >= 0", "--report", rep, "--json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["passed"] and data["cache"]["misses"] == 18 and data["cache"]["backend_runs"] == 2
    assert {s["metric"] for s in data["overall"]} >= {"ppl", "rougeL", "chrF", "json_valid", "check_pass"}
    assert set(data["slices"]) == {"qa", "json", "completion"}
    assert sorted(p.name for p in rep.iterdir()) == ["qlift.json", "report.html", "report.json", "report.md"]
    assert json.loads((rep / "report.json").read_text())["overall"] == data["overall"]
    md = (rep / "report.md").read_text()
    assert "| rougeL |" in md and "## Slice `json`" in md and "PASS `rougeL >= 0`" in md

    html = (rep / "report.html").read_text()
    p = _ReportParser()
    p.feed(html)
    assert p.scripts == 0  # the hostile example is escaped, not executed
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    shown = [s["metric"] for s in data["overall"] if s["candidate"] is not None]
    assert p.charts == shown
    assert set(p.bars) == {(m, role) for m in shown for role in ("candidate", "baseline")}
    assert len(p.ci) == len(shown)
    assert p.rows == [ex["id"] for ex in data["examples"]]

    # Another gate, same models and prompts: nothing is generated again; a failing gate exits 10.
    r = run_cli(*args, "--gate", "rougeL >= baseline + 5", "--json")
    assert r.exit_code == 10, r.stderr
    again = json.loads(r.stdout)
    assert again["cache"] == {"hits": 18, "misses": 0, "backend_runs": 0, "shared_models": [], "load": {},
                              "numerics": {}}  # transformers: float32 only, no kernel path to tell
    assert again["overall"] == data["overall"]
    assert r.stderr.strip().splitlines()[-1].startswith("error: 1 of 1 gate(s) failed: rougeL >= baseline + 5")

    # The candidate alone (its answers are cached too): absolute numbers, no comparison.
    r = run_cli(*args[:2], *args[4:], "--gate", "check_pass >= 0", "--json")
    assert r.exit_code == 0, r.stderr
    solo = json.loads(r.stdout)
    assert solo["baseline"] is None and solo["cache"]["backend_runs"] == 0
    assert [s["candidate"] for s in solo["overall"]] == [s["candidate"] for s in data["overall"]]
    assert all(s["diff"] is None and s["ci_low"] is None for s in solo["overall"])


def test_existing_report_needs_force(run_cli, tiny_qwen2_tied: Path, tmp_path: Path) -> None:
    (tmp_path / "rep").mkdir()
    r = run_cli("eval", tiny_qwen2_tied, "--prompts", SMOKE, "--backend", "transformers", "--report", tmp_path / "rep")
    assert r.exit_code == 3 and "--force" in r.stderr


def test_unreachable_endpoint_is_an_evaluation_error(run_cli) -> None:
    from qlift.vllm.process import free_port

    url = f"http://127.0.0.1:{free_port()}"
    r = run_cli("eval", "smollm2", "--endpoint", url, "--prompts", SMOKE)
    assert r.exit_code == 8
    assert r.stderr.startswith(f"error: cannot reach {url}") and len(r.stderr.strip().splitlines()) == 1


def test_model_content_hash_is_the_lineage_hash_and_is_remembered(tmp_path: Path) -> None:
    import os

    from qlift.lineage import describe_input
    from qlift.models.ref import dir_hash, hash_memo

    def model_content_hash(d: Path) -> str:  # as eval hashes a local model: remembered in its cache
        return dir_hash(d, memo=hash_memo())

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"x" * 1000)
    h = model_content_hash(d)
    assert h == describe_input("candidate", d)[0].content_hash
    memo = list((tmp_path / "eval-cache" / "hashes").glob("*.json"))
    assert len(memo) == 1 and "model.safetensors" in memo[0].read_text()
    assert model_content_hash(d) == h
    (d / "model.safetensors").write_bytes(b"y" * 1000)
    os.utime(d / "model.safetensors", ns=(1, 1))  # new content, new mtime: hashed again
    assert model_content_hash(d) != h


def test_prompt_rendering_is_the_chat_template_or_plain_text(tiny_qwen2_tied: Path) -> None:
    from transformers import AutoTokenizer

    from qlift.errors import IncompatibleError
    from qlift.models.chat import prompt_token_ids

    tok = AutoTokenizer.from_pretrained(tiny_qwen2_tied)
    chat = prompt_token_ids(tok, {"messages": [{"role": "user", "content": "hi"}], "prompt": None})
    assert tok.decode(chat).endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(prompt_token_ids(tok, {"messages": None, "prompt": "plain hi"})) == "plain hi"
    tok.chat_template = None
    with pytest.raises(IncompatibleError, match="no chat template"):
        prompt_token_ids(tok, {"messages": [{"role": "user", "content": "hi"}], "prompt": None})


def test_vllm_worker_job_and_result_are_checked_on_both_sides() -> None:
    from pydantic import ValidationError

    from qlift.eval.generation import Generation, Request, Sampling
    from qlift.eval.vllm_job import VllmEvalJob, VllmEvalResult

    job = VllmEvalJob(model="/m", requests=[Request(messages=None, prompt="p", reference="r")],
                      sampling=Sampling(max_tokens=8), max_model_len=512)
    wire = json.loads(json.dumps({**job.model_dump(mode="json"), "result": "/tmp/result.json"}))
    assert VllmEvalJob.model_validate(wire) == job  # the worker machinery's "result" key is not the job's
    with pytest.raises(ValidationError, match="sampling"):
        VllmEvalJob.model_validate({k: v for k, v in wire.items() if k != "sampling"})
    result = VllmEvalResult(generations=[Generation(text="a", output_tokens=1, latency_s=0.1)], load_s=1.0,
                            generate_s=2.0, vllm_version="0.32.0")
    assert VllmEvalResult.model_validate(json.loads(json.dumps(result.model_dump(mode="json")))) == result
    with pytest.raises(ValidationError, match="output_tokens"):
        VllmEvalResult.model_validate({**result.model_dump(mode="json"), "generations": [{"text": "a"}]})


def test_messages_for_a_model_without_chat_template_fail_before_any_work(run_cli, tiny_qwen2_tied: Path,
                                                                           tmp_path: Path) -> None:
    import shutil

    model = tmp_path / "no-template"
    shutil.copytree(tiny_qwen2_tied, model)
    (model / "chat_template.jinja").unlink()
    tok_cfg = json.loads((model / "tokenizer_config.json").read_text())
    tok_cfg.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    chats = _write(tmp_path / "chats.jsonl", [json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]})])
    for backend in ("transformers", "vllm"):
        r = run_cli("eval", model, "--prompts", chats, "--backend", backend, "--max-tokens", "2", "--no-cache")
        assert r.exit_code == 6, r.stderr
        assert r.stderr.strip().splitlines() == [
            f"error: the candidate model {model} has no chat template, so the prompt file's 'messages' cannot be "
            "rendered. Use 'prompt' instead of 'messages' for this model."]
    plain = _write(tmp_path / "plain.jsonl", [json.dumps({"id": "a", "prompt": "hi"})])
    r = run_cli("eval", model, "--prompts", plain, "--backend", "transformers", "--max-tokens", "2", "--no-cache")
    assert r.exit_code == 0, r.stderr


def test_progress_lines_when_no_bar_can_be_drawn(caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    """Without a terminal the endpoint backend reports progress as log lines: a tenth at a time, or every 30 s."""
    from qlift import progress

    clock = iter([0.0, 1.0, 2.0, 40.0, 41.0, 42.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    with caplog.at_level("INFO", logger="qlift.progress"):
        lines = progress.ProgressLines("endpoint candidate", 50, unit="answers")
        for _ in range(5):
            lines.step()
    said = [r.getMessage() for r in caplog.records]
    # answers 1-4 are under a tenth and under 30 s: silent; the 3rd waited 38 s, the 5th is a tenth
    assert said == ["endpoint candidate: 3/50 answers (40 s, ~627 s left)",
                    "endpoint candidate: 5/50 answers (42 s, ~378 s left)"]


def test_transformers_backend_answers_the_same_in_batches_as_one_at_a_time(
        smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Left-padded batches: each row keeps its own answer up to its own stop token (rows that stop early
    are padded to the batch's longest), the same text, count and finish reason as alone."""
    from qlift.eval import hf_backend
    from qlift.eval.generation import EvalModel, Request, Sampling
    from qlift.models.ref import ModelRef

    reqs = [Request.of(e) for e in load_prompts(SMOKE)]
    model = EvalModel(role="candidate", name="smollm2", ref=ModelRef(base=smollm2_dir, content_hash="0"))
    runs = {}
    for batch in (1, 4):
        monkeypatch.setattr(hf_backend, "BATCH", batch)
        gens = hf_backend.TransformersBackend().generate(model, reqs, Sampling(max_tokens=24))
        runs[batch] = [(g.text, g.output_tokens, g.finish_reason, round(g.ref_logprob or 0, 3)) for g in gens]
    assert runs[4] == runs[1]
    assert {f for _, _, f, _ in runs[1]} == {"stop", "length"}  # both kinds of row shared a batch
