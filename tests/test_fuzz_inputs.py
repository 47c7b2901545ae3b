"""Property-based probes (hypothesis) over every loader and the CLI's numeric and path arguments.

Whatever the input, qlift answers with an exit code from the documented table (docs/index.md),
never 70; a failure is one line on stderr with no traceback and leaves no output behind. Each
probe counts itself under its family; the counts are printed at the end of the module
(`pytest tests/test_fuzz_inputs.py -s`) and quoted in issue 16's closing note.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_bad_input import (
    ADAPTER_CONFIG,
    BASE_CONFIG,
    DOCUMENTED_EXITS,
    adapter_tensors,
    base_tensors,
    safetensors_bytes,
    write_adapter,
    write_base,
)

from qlift.cli import cli
from qlift.errors import BadInputError, QliftError

PROBES: Counter[str] = Counter()
# QLIFT_FUZZ_SCALE=10 probes ten times as much (a deeper local hunt); CI runs the default.
SCALE = int(os.environ.get("QLIFT_FUZZ_SCALE", "1"))
FAST = settings(max_examples=150 * SCALE, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
CLI = settings(FAST, max_examples=40 * SCALE)
EXPECTED_LIBRARY_ERRORS = QliftError  # each maps to a documented exit code (tests/test_cli.py checks the table)

# --- strategies -------------------------------------------------------------------------------

NASTY_TEXT = st.sampled_from(["~nosuchuser/x", "x" * 300, "a\x00b", "../../etc/passwd", "/", "", "\n", "nan",
                              "/proc/self/fd/0", "${HOME}", "%s%n", "\u202e", "C:\\x"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=8), NASTY_TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                    max_leaves=12)
NUMBER_TEXT = st.one_of(
    st.integers(-10**20, 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=10),
    st.sampled_from(["", " ", "nan", "-nan", "inf", "-inf", "1e309", "-0", "0", "0x10", "1_000", "1.0", "٣",
                     "65535", "65536", "-1", "9" * 40, "2.5", "1e-320"]),
)
# Names a shell can pass (no NUL) and that decode (no lone surrogates); '/' allowed for inputs only.
NAME = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00/"), min_size=1, max_size=16)
INPUT_PATH = st.one_of(
    NAME, st.lists(NAME, min_size=1, max_size=3).map("/".join),
    st.sampled_from(["", ".", "..", "/", "/dev/null", "/proc/self", "/proc/self/fd", "base/config.json",
                     "lora/adapter_model.safetensors", "loop", "dangling", "~", "-", "base/..", "./lora/"]),
)


def _text_of(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


# --- helpers ----------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def _report_counts(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    capture = request.config.pluginmanager.getplugin("capturemanager")
    lines = [f"  {family:<44} {n:>5}" for family, n in sorted(PROBES.items())]
    text = f"\nfuzz probes per family ({sum(PROBES.values())} in all):\n" + "\n".join(lines) + "\n"
    if capture is not None:
        with capture.global_and_fixture_disabled():
            sys.stderr.write(text)
    else:
        sys.stderr.write(text)


@pytest.fixture(scope="module")
def pair() -> Iterator[Path]:
    """A work dir with a hand-built base and adapter that merge cleanly, plus a symlink loop."""
    root = Path(tempfile.mkdtemp(prefix="qlift-fuzz-"))
    write_base(root / "base")
    write_adapter(root / "lora")
    (root / "loop").symlink_to("loop")
    (root / "dangling").symlink_to("nowhere")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def invoke(*args: Any) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def check(r: Any, family: str, *, out: Path | None = None) -> None:
    """The properties every probe asserts."""
    PROBES[family] += 1
    assert r.exit_code != 70 and "internal error" not in r.stderr, r.stderr
    assert r.exit_code in DOCUMENTED_EXITS, (r.exit_code, r.stderr)
    assert "Traceback" not in r.output
    if r.exit_code != 0:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
        if out is not None:
            assert not out.exists(), f"{out} left behind"
            assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")], "temp output left"


def library(family: str, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or None when it refused with a one-line qlift error (anything else fails the probe)."""
    PROBES[family] += 1
    try:
        return fn(*args)
    except EXPECTED_LIBRARY_ERRORS as exc:
        assert "\n" not in exc.one_line()
        return None


def scratch(pair: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=pair, prefix="case-"))


# --- each loader over arbitrary bytes and JSON -------------------------------------------------

@FAST
@given(st.one_of(st.binary(max_size=64), JSON.map(_text_of), st.sampled_from([b"[" * 5000, b"\xef\xbb\xbf{}"])),
       st.sampled_from(["read_json", "read_json_object", "read_yaml", "iter_jsonl"]))
def test_generic_loaders(pair: Path, raw: bytes, loader: str) -> None:
    from qlift import loaders

    f = scratch(pair) / "f"
    f.write_bytes(raw)
    library(f"loader {loader}", lambda: list(loaders.iter_jsonl(f)) if loader == "iter_jsonl"
            else getattr(loaders, loader)(f))


TENSOR_ENTRY = st.fixed_dictionaries({}, optional={
    "dtype": st.one_of(st.sampled_from(["F32", "BF16", "F16", "I8", "F4", "BOOL", "Q4", ""]), SCALARS),
    "shape": st.one_of(st.lists(st.integers(-2, 6), max_size=3), JSON),
    "data_offsets": st.one_of(st.lists(st.integers(-4, 64), min_size=2, max_size=2), JSON),
})
HEADER = st.one_of(JSON, st.dictionaries(st.text(max_size=6), st.one_of(TENSOR_ENTRY, JSON), max_size=4))


@FAST
@given(HEADER, st.binary(max_size=80), st.integers(-4, 64))
@example({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, b"\0" * 16, 0)
def test_safetensors_header(pair: Path, header: Any, payload: bytes, length_skew: int) -> None:
    from qlift.models.safetensors_header import read_header

    head = json.dumps(header, allow_nan=True).encode()
    f = scratch(pair) / "w.safetensors"
    f.write_bytes(struct.pack("<Q", max(0, len(head) + length_skew)) + head + payload)
    PROBES["safetensors header"] += 1
    try:
        tensors, _ = read_header(f)
    except BadInputError:
        return
    end = max((t.offset + t.nbytes for t in tensors.values()), default=8 + len(head))
    assert end <= f.stat().st_size  # what a reader trusts is inside the file


PROMPT_LINE = st.one_of(JSON, st.fixed_dictionaries({}, optional={
    "id": SCALARS, "prompt": SCALARS, "reference": SCALARS, "tags": JSON,
    "messages": st.one_of(JSON, st.lists(st.fixed_dictionaries({}, optional={"role": st.sampled_from(
        ["user", "assistant", "system", "tool", 1]), "content": SCALARS}), max_size=3)),
    "checks": st.one_of(JSON, st.fixed_dictionaries({}, optional={
        "regex": SCALARS, "json_schema": JSON, "max_chars": SCALARS, "contains": JSON, "json": SCALARS})),
    "text": SCALARS,
}))


@FAST
@given(st.lists(st.one_of(PROMPT_LINE.map(_text_of), st.binary(max_size=12)), max_size=4))
def test_prompts_and_calibration(pair: Path, lines: list[bytes]) -> None:
    from qlift.eval.prompts import load_prompts
    from qlift.quantize.calib import load_calibration

    f = scratch(pair) / "set.jsonl"
    f.write_bytes(b"\n".join(lines))
    library("loader eval prompts", load_prompts, f)
    library("loader calibration set", load_calibration, f)


@FAST
@given(st.one_of(JSON, st.fixed_dictionaries({}, optional={
    "operation": SCALARS, "outputs": st.one_of(JSON, st.dictionaries(NAME, JSON, max_size=3)),
    "parents": JSON, "files": st.one_of(JSON, st.lists(st.dictionaries(
        st.sampled_from(["path", "size", "sha256", "repo_path"]), SCALARS), max_size=3)),
    "source": SCALARS, "endpoint": SCALARS, "repo": SCALARS, "revision": SCALARS, "commit": SCALARS,
    "schema": SCALARS})))
def test_manifest_and_lockfile(pair: Path, data: Any) -> None:
    from qlift.hub.lock import read_lock
    from qlift.lineage import lineage_chain, read_manifest, recorded_hashes

    d = scratch(pair)
    (d / "qlift.json").write_bytes(_text_of(data))
    (d / "qlift.lock.json").write_bytes(_text_of(data))
    library("loader qlift.json manifest", lambda: (lineage_chain(read_manifest(d)), recorded_hashes(d)))
    library("loader qlift.lock.json", read_lock, d)


@FAST
@given(st.one_of(JSON, st.fixed_dictionaries({"name": st.just("r")}, optional={
    "description": SCALARS, "workload": SCALARS, "hardware": JSON, "engine": JSON, "env": JSON})))
def test_recipe_yaml(pair: Path, data: Any) -> None:
    import yaml

    from qlift.serve.recipes import load_recipe_file

    f = scratch(pair) / "r.yaml"
    f.write_text(yaml.safe_dump(data))
    library("loader recipe YAML", load_recipe_file, f)


# --- config.json, adapter_config.json, generation_config.json, weights: through the CLI ---------

CONFIG_FIELDS = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "intermediate_size", "max_position_embeddings", "sliding_window",
                 "tie_word_embeddings", "torch_dtype", "architectures", "quantization_config", "text_config"]


@CLI
@given(st.dictionaries(st.sampled_from(CONFIG_FIELDS), JSON, min_size=1, max_size=3))
def test_config_json(pair: Path, change: dict[str, Any]) -> None:
    model = write_base(scratch(pair) / "m", config={**BASE_CONFIG, **change})
    check(invoke("inspect", model), "cli config.json: inspect")
    check(invoke("plan", model, "--recipe", "cpu"), "cli config.json: plan")


SIDE_FILES = ["tokenizer.json", "tokenizer_config.json", "vocab.json", "chat_template.json", "qlift.json",
              "model.safetensors.index.json", "generation_config.json"]
SIDE_JSON = st.one_of(JSON, st.fixed_dictionaries({}, optional={
    "model": st.one_of(JSON, st.fixed_dictionaries({}, optional={"vocab": JSON})), "added_tokens": JSON,
    "added_tokens_decoder": JSON, "chat_template": JSON, "weight_map": st.one_of(JSON, st.dictionaries(
        st.text(max_size=6), st.one_of(st.just("model.safetensors"), NASTY_TEXT, SCALARS), max_size=3)),
    "outputs": JSON, "parents": JSON, "operation": SCALARS}))


@settings(CLI, max_examples=140 * SCALE)
@given(st.sampled_from(SIDE_FILES), st.one_of(SIDE_JSON.map(_text_of), st.binary(max_size=24)))
def test_side_files_of_a_model(pair: Path, name: str, raw: bytes) -> None:
    d = scratch(pair)
    model = write_base(d / "base")
    (model / name).write_bytes(raw)
    check(invoke("inspect", model), f"cli {name}: inspect")
    out = d / "out"
    check(invoke("merge", model, pair / "lora", "-o", out, "--no-verify"), f"cli {name}: merge", out=out)


ADAPTER_FIELDS = {
    "r": st.one_of(st.integers(-3, 5), JSON), "lora_alpha": st.one_of(st.floats(), JSON),
    "rank_pattern": st.one_of(JSON, st.dictionaries(st.sampled_from(["q_proj", "layers.0.self_attn.q_proj"]),
                                                    st.one_of(st.integers(-1, 4), SCALARS), max_size=2)),
    "alpha_pattern": st.one_of(JSON, st.dictionaries(st.sampled_from(["q_proj"]), SCALARS, max_size=1)),
    "use_rslora": SCALARS, "fan_in_fan_out": SCALARS, "use_dora": SCALARS, "peft_type": SCALARS,
    "trainable_token_indices": JSON, "base_model_name_or_path": SCALARS, "target_modules": JSON,
}


@CLI
@given(st.fixed_dictionaries({}, optional=ADAPTER_FIELDS))
def test_adapter_config_json(pair: Path, change: dict[str, Any]) -> None:
    d = scratch(pair)
    ad = write_adapter(d / "lora", config={**ADAPTER_CONFIG, **change})
    out = d / "out"
    check(invoke("merge", pair / "base", ad, "-o", out, "--no-verify"), "cli adapter_config.json: merge", out=out)


@CLI
@given(st.one_of(JSON, st.fixed_dictionaries({}, optional={
    k: JSON for k in ["temperature", "top_p", "top_k", "min_p", "do_sample", "max_new_tokens", "max_length",
                      "eos_token_id", "pad_token_id", "repetition_penalty"]})))
def test_generation_config_json(pair: Path, gen: Any) -> None:
    d = scratch(pair)
    ad = write_adapter(d / "lora")
    (ad / "generation_config.json").write_bytes(_text_of(gen))
    out = d / "out"
    check(invoke("merge", pair / "base", ad, "-o", out, "--no-verify"), "cli generation_config.json: merge",
          out=out)


@CLI
@given(st.sampled_from(["adapter", "base"]), st.integers(0, 2000), st.sampled_from(
    [None, float("nan"), float("inf"), 1e38]), st.booleans())
def test_weights_cut_or_poisoned(pair: Path, which: str, keep: int, value: float | None, cut: bool) -> None:
    d = scratch(pair)
    if which == "adapter":
        tensors = adapter_tensors() if value is None else adapter_tensors(value)
        raw = safetensors_bytes(tensors)
        ad = write_adapter(d / "lora", weights=raw[:keep] if cut else raw)
        base = pair / "base"
    else:
        raw = safetensors_bytes(base_tensors())
        base = write_base(d / "base", weights=raw[:keep] if cut else raw)
        ad = pair / "lora"
    out = d / "out"
    r = invoke("merge", base, ad, "-o", out, "--no-verify")
    check(r, f"cli {which} weights cut/NaN: merge", out=out)
    if which == "adapter" and value is not None and not math.isfinite(value):
        assert r.exit_code == 2


@CLI
@given(HEADER, st.binary(max_size=64), st.sampled_from(["adapter_model.safetensors", "model.safetensors"]))
def test_weight_headers_through_merge(pair: Path, header: Any, payload: bytes, name: str) -> None:
    d = scratch(pair)
    head = json.dumps(header, allow_nan=True).encode()
    raw = struct.pack("<Q", len(head)) + head + payload
    base = write_base(d / "base", weights=raw) if name == "model.safetensors" else pair / "base"
    ad = write_adapter(d / "lora", weights=raw) if name != "model.safetensors" else pair / "lora"
    out = d / "out"
    check(invoke("merge", base, ad, "-o", out, "--no-verify"), f"cli {name} header: merge", out=out)


# --- numeric arguments -------------------------------------------------------------------------

NUMERIC = [  # (family, argv with {v}, {base}, {lora}, {out})
    ("merge --tolerance", ["merge", "{base}", "{lora}", "-o", "{out}", "--no-verify", "--tolerance", "{v}"]),
    ("merge --max-shard-size", ["merge", "{base}", "{lora}", "-o", "{out}", "--no-verify", "--max-shard-size",
                                "{v}"]),
    ("serve --port", ["serve", "{base}", "--gpu", "RTX 4090", "-r", "chat-4090", "--dry-run", "--port", "{v}"]),
    ("serve --timeout", ["serve", "{base}", "--gpu", "RTX 4090", "-r", "chat-4090", "--dry-run", "--timeout",
                         "{v}"]),
    ("plan --gpus", ["plan", "{base}", "--gpu", "A100-80GB", "--gpus", "{v}"]),
    ("eval --concurrency", ["eval", "m", "--prompts", "{out}", "--concurrency", "{v}"]),
    ("eval --max-tokens", ["eval", "m", "--prompts", "{out}", "--max-tokens", "{v}"]),
    ("eval --bootstrap", ["eval", "m", "--prompts", "{out}", "--bootstrap", "{v}"]),
    ("eval --seed", ["eval", "m", "--prompts", "{out}", "--seed", "{v}"]),
    ("eval --max-model-len", ["eval", "m", "--prompts", "{out}", "--max-model-len", "{v}"]),
    ("eval --gate", ["eval", "m", "--prompts", "{out}", "--gate", "rougeL >= baseline {v}"]),
    ("eval --metrics", ["eval", "m", "--prompts", "{out}", "--metrics", "{v}"]),
    ("download --max-workers", ["download", "org/model", "-o", "{out}", "--dry-run", "--max-workers", "{v}"]),
    ("quantize --num-samples", ["quantize", "{out}", "--awq", "-o", "{out}q", "--num-samples", "{v}"]),
    ("quantize --seq-len", ["quantize", "{out}", "--awq", "-o", "{out}q", "--seq-len", "{v}"]),
    ("quantize --ignore re:", ["quantize", "{out}", "--awq", "-o", "{out}q", "--ignore", "re:{v}"]),
]
URL_TEXT = st.one_of(st.text(max_size=20), st.builds(
    "{}://{}{}{}".format, st.sampled_from(["http", "https", "ftp", "", "HTTP"]),
    st.sampled_from(["127.0.0.1", "localhost", "[::1]", "", " ", "127.0.0.1 "]),
    st.one_of(st.just(""), NUMBER_TEXT.map(lambda p: f":{p}")), st.sampled_from(["", "/", "/v1", "?x"])))


@settings(CLI, max_examples=300 * SCALE)
@given(st.sampled_from(NUMERIC), NUMBER_TEXT)
def test_numeric_arguments(pair: Path, case: tuple[str, list[str]], value: str) -> None:
    family, argv = case
    d = scratch(pair)
    out = d / "out"
    args = [a.format(v=value, base=pair / "base", lora=pair / "lora", out=out) for a in argv]
    check(invoke(*args), f"cli {family}", out=out)


@settings(CLI, max_examples=80 * SCALE)
@given(st.sampled_from(["eval", "download"]), URL_TEXT)
def test_url_arguments(pair: Path, command: str, url: str) -> None:
    d = scratch(pair)
    argv = (["eval", "m", "--prompts", d / "none.jsonl", "--endpoint", url] if command == "eval"
            else ["download", "org/model", "-o", d / "out", "--dry-run", "--endpoint", url])
    check(invoke(*argv), f"cli {command} --endpoint")


@settings(CLI, max_examples=80 * SCALE)
@given(st.sampled_from(["max_model_len", "gpu_memory_utilization", "max_num_seqs", "dtype", "kv_cache_dtype",
                        "tensor_parallel_size", "enforce_eager", "no_such_arg", "", "=", "max-model-len"]),
       st.one_of(NUMBER_TEXT, st.text(max_size=12), st.sampled_from(["[1, 2]", "{a: 1}", "null", "*x", "!!python"])),
       st.sampled_from(["cpu", "chat-4090"]))
def test_set_overrides_and_gpu_names(pair: Path, key: str, value: str, recipe: str) -> None:
    gpu = ["--gpu", "RTX 4090"] if recipe != "cpu" else []
    check(invoke("plan", pair / "base", "--recipe", recipe, *gpu, "--set", f"{key}={value}"), "cli plan --set")
    check(invoke("plan", pair / "base", "--gpu", value or " "), "cli plan --gpu NAME")


# --- path arguments ----------------------------------------------------------------------------

PATH_CASES = [
    ("inspect MODEL", ["inspect", "{p}"]),
    ("plan MODEL", ["plan", "{p}", "--recipe", "cpu"]),
    ("verify DIR", ["verify", "{p}"]),
    ("import-gguf FILE", ["import-gguf", "{p}", "-o", "{out}"]),
    ("merge BASE", ["merge", "{p}", "lora", "-o", "{out}", "--no-verify"]),
    ("merge ADAPTER", ["merge", "base", "{p}", "-o", "{out}", "--no-verify"]),
    ("eval --prompts", ["eval", "m", "--prompts", "{p}"]),
    # -o in a missing directory: a path that happens to be a model must not start a real quantization
    ("quantize MODEL", ["quantize", "{p}", "--fp8", "-o", "/nonexistent-qlift-dir/out"]),
    ("recipes show FILE", ["recipes", "show", "{p}.yaml"]),
]


@settings(CLI, max_examples=200 * SCALE)
@given(st.sampled_from(PATH_CASES), INPUT_PATH)
def test_path_arguments(pair: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[str, list[str]],
                        path: str) -> None:
    family, argv = case
    monkeypatch.chdir(pair)  # relative inputs resolve among base/, lora/ and the odd links
    if path.startswith("-"):  # as on a shell: a name that looks like an option is written ./-name
        path = "./" + path
    out = scratch(pair) / "out"
    check(invoke(*[a.format(p=path, out=out) for a in argv]), f"cli path {family}", out=out)


@settings(CLI, max_examples=40 * SCALE)
@given(NAME)
def test_output_path_names(pair: Path, name: str) -> None:
    d = scratch(pair)
    out = d / name
    r = invoke("merge", pair / "base", pair / "lora", "-o", out, "--no-verify")
    check(r, "cli path merge -o", out=out if name not in (".", "..") else None)


# --- qlift batch: the input reader and --resume over arbitrary bytes ---------------------------

BATCH_ROW = st.one_of(
    JSON,
    st.fixed_dictionaries({"id": SCALARS}, optional={"prompt": SCALARS, "messages": JSON, "max_tokens": SCALARS,
                                                     "temperature": SCALARS, "top_p": SCALARS, "stop": JSON,
                                                     "seed": SCALARS}),
    st.fixed_dictionaries({"custom_id": SCALARS, "body": JSON}, optional={"url": SCALARS, "method": SCALARS}),
)
BATCH_LINE = st.one_of(BATCH_ROW.map(_text_of), st.binary(max_size=40),
                       st.sampled_from([b"", b"\xef\xbb\xbf", b"\xff\xfe", b"42", b"null", b"[", b'{"id": "a"',
                                        b"\r", b"\x00", "\u2028".encode()]))


@settings(FAST)
@given(st.lists(BATCH_LINE, max_size=6), st.sampled_from([b"", b"\xef\xbb\xbf", b"\xff\xfe"]))
def test_batch_input_reader(pair: Path, lines: list[bytes], prefix: bytes) -> None:
    from qlift.perf.batch_rows import BatchRow, read_input

    d = scratch(pair)
    src = d / "in.jsonl"
    src.write_bytes(prefix + b"\n".join(lines))
    parsed = library("batch input reader", read_input, src)
    if parsed is None:
        return
    assert all(isinstance(r, BatchRow) and r.id for r in parsed.rows)
    assert len({r.id for r in parsed.rows}) == len(parsed.rows) == len(parsed.order)
    assert all(e.line >= 1 for e in parsed.errors)


@settings(FAST)
@given(st.lists(BATCH_LINE, max_size=5), st.one_of(st.none(), JSON.map(_text_of), st.binary(max_size=30)))
def test_batch_resume_reads_any_output_without_changing_it(pair: Path, lines: list[bytes],
                                                           state: bytes | None) -> None:
    from qlift.perf.batch_rows import read_input
    from qlift.perf.batch_state import BatchFiles, hashes_for, resume

    d = scratch(pair)
    rows = read_input(_write(d / "in.jsonl", b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\n')).rows
    out = _write(d / "out.jsonl", b"\n".join(lines))
    if state is not None:
        _write(BatchFiles.beside(out).state, state)
    before = out.read_bytes()
    library("batch --resume over any OUT", resume, BatchFiles.beside(out), rows, hashes_for(rows, {"max_tokens": 8}))
    assert out.read_bytes() == before


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# --- qlift deploy k8s: every option ------------------------------------------------------------

DNS_ISH = st.one_of(st.from_regex(r"\A[a-z][-a-z0-9.]{0,12}\Z"), st.text(max_size=12), NASTY_TEXT,
                    st.sampled_from(["bad pvc/../x", "Bad Gateway!", "a" * 64, "a" * 254, "-x", "x-", "x..y",
                                     "x.y", "0abc", "ABC"]))
IMAGE = st.one_of(st.from_regex(r"\A[a-zA-Z0-9.:/@_-]{1,30}\Z"), st.text(max_size=20), NASTY_TEXT,
                  st.sampled_from(["vllm/vllm-openai:v0.26.0", "vllm openai", "Host:5000/x", "a:b:c",
                                   "x@sha256:" + "0" * 64, "x" * 300]))
COUNT = st.one_of(st.integers(-5, 10), st.integers(2**31 - 2, 2**31 + 2), st.integers(-2**70, 2**70))


DEPLOY_FIELDS = {"app": DNS_ISH, "namespace": DNS_ISH, "pvc": DNS_ISH, "gateway": DNS_ISH,
                 "gateway_namespace": st.one_of(st.none(), DNS_ISH), "image": st.one_of(st.none(), IMAGE),
                 "public_model": st.one_of(st.none(), st.text(max_size=10), NASTY_TEXT), "replicas": COUNT,
                 "max_replicas": COUNT, "queue_target": COUNT}


@settings(FAST)
@given(st.data(), st.lists(st.sampled_from(sorted(DEPLOY_FIELDS)), min_size=1, max_size=3, unique=True),
       st.sampled_from(["promote", "argo"]))
def test_deploy_options(pair: Path, data: st.DataObject, fields: list[str], rollout: str) -> None:
    """One to three options fuzzed at a time (the rest at their defaults): a refusal is one line; a
    render holds only names and values Kubernetes accepts."""
    import re

    from qlift.deploy import DeployOptions, render_k8s
    from qlift.deploy.render import to_yaml

    drawn = {f: data.draw(DEPLOY_FIELDS[f], label=f) for f in fields}
    # the options check themselves when made: a refusal there is one line as well
    opts = library("deploy k8s options", lambda: DeployOptions(
        model=pair / "base", recipe="cpu", rollout=rollout, **drawn))  # type: ignore[arg-type]
    result = None if opts is None else library("deploy k8s options", render_k8s, opts)
    if result is None:
        return
    PROBES["deploy k8s options rendered"] += 1
    subdomain = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    assert subdomain.match(opts.pvc) and subdomain.match(opts.gateway) and len(opts.pvc) <= 253
    assert not re.search(r"\s", result.image) and 1 <= opts.replicas <= opts.max_replicas <= 2**31 - 1
    assert 1 <= opts.queue_target <= 2**31 - 1
    for obj in result.objects.values():
        meta = obj["metadata"]
        assert subdomain.match(meta["name"]) and len(meta["name"]) <= 63, meta["name"]
        assert subdomain.match(meta["namespace"]) and len(meta["namespace"]) <= 63
        assert to_yaml(obj).startswith(("---\n", "# yamllint"))


@settings(CLI)
@given(st.sampled_from(["--name", "--namespace", "--pvc", "--gateway", "--gateway-namespace", "--image",
                        "--public-model", "--replicas", "--max-replicas", "--queue-target", "--prometheus-url"]),
       st.one_of(DNS_ISH, IMAGE, NUMBER_TEXT))
def test_deploy_cli_options(pair: Path, flag: str, value: str) -> None:
    out = scratch(pair) / "out"
    check(invoke("deploy", "k8s", pair / "base", "--recipe", "cpu", "-o", out, flag, value), f"cli deploy {flag}",
          out=out)
