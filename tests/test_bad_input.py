"""Bad input gets exit 2 and one line, never exit 70 (issue 16): one test per family the
adversarial pass found, on a hand-built model and adapter small enough to merge in well
under a second. tests/test_fuzz_inputs.py runs the same families with hypothesis."""

from __future__ import annotations

import json
import shutil
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from qlift.errors import EXIT_CODES

DOCUMENTED_EXITS = {0} | {code for _, code in EXIT_CODES}
HIDDEN, LAYERS, VOCAB, RANK = 8, 2, 16, 2
Q_PROJ = "model.layers.{}.self_attn.q_proj.weight"


# --- builders ---------------------------------------------------------------------------

def safetensors_bytes(tensors: dict[str, tuple[str, list[int], bytes]], *, header: Any = None,
                      tail: bytes = b"") -> bytes:
    """A safetensors file from raw parts; ``header`` replaces the computed one (to break it)."""
    computed, data, pos = {}, b"", 0
    for name, (dtype, shape, raw) in tensors.items():
        computed[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + len(raw)]}
        data += raw
        pos += len(raw)
    head = json.dumps(computed if header is None else header).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + data + tail


def f32(shape: list[int], value: float = 0.01) -> tuple[str, list[int], bytes]:
    n = 1
    for d in shape:
        n *= d
    return "F32", shape, struct.pack(f"<{n}f", *([value] * n))


def base_tensors() -> dict[str, tuple[str, list[int], bytes]]:
    t = {"model.embed_tokens.weight": f32([VOCAB, HIDDEN])}
    for i in range(LAYERS):
        t[Q_PROJ.format(i)] = f32([HIDDEN, HIDDEN])
    t["model.norm.weight"] = f32([HIDDEN], 1.0)
    return t


BASE_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
               "hidden_size": HIDDEN, "intermediate_size": 16, "num_hidden_layers": LAYERS,
               "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 128,
               "tie_word_embeddings": True, "torch_dtype": "float32"}
ADAPTER_CONFIG = {"peft_type": "LORA", "r": RANK, "lora_alpha": 4, "target_modules": ["q_proj"],
                  "base_model_name_or_path": "base"}


def write_base(path: Path, *, config: Any = None, weights: bytes | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(BASE_CONFIG if config is None else config))
    (path / "model.safetensors").write_bytes(safetensors_bytes(base_tensors()) if weights is None else weights)
    return path


def adapter_tensors(value: float = 0.01) -> dict[str, tuple[str, list[int], bytes]]:
    t = {}
    for i in range(LAYERS):
        name = "base_model.model." + Q_PROJ.format(i).removesuffix(".weight")
        t[f"{name}.lora_A.weight"] = f32([RANK, HIDDEN], value)
        t[f"{name}.lora_B.weight"] = f32([HIDDEN, RANK], value)
    return t


def write_adapter(path: Path, *, config: Any = None, weights: bytes | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps(ADAPTER_CONFIG if config is None else config))
    weights = safetensors_bytes(adapter_tensors()) if weights is None else weights
    (path / "adapter_model.safetensors").write_bytes(weights)
    return path


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


UNDECODABLE = b'{"a": "\xff\xfe\xc3"}'
DEEP = nested(100_000).encode()


# --- assertions -----------------------------------------------------------------------

def one_line(r: Any, code: int = 2, *needles: str) -> str:
    """The run failed with ``code`` and exactly one line on stderr, naming ``needles``."""
    assert r.exit_code == code, (r.exit_code, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.output and "internal error" not in r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def nothing_left(out: Path) -> None:
    assert not out.exists(), f"{out} was written"
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")], "a temp output was left"


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return write_base(tmp_path / "base")


@pytest.fixture
def adapter(tmp_path: Path) -> Path:
    return write_adapter(tmp_path / "lora")


def test_the_hand_built_pair_merges(run_cli, tmp_path: Path, base: Path, adapter: Path) -> None:
    out = tmp_path / "out"
    r = run_cli("merge", base, adapter, "-o", out, "--no-verify")
    assert r.exit_code == 0, r.stderr
    r = run_cli("inspect", out)
    assert r.exit_code == 0 and f"({VOCAB * HIDDEN + LAYERS * HIDDEN * HIDDEN + HIDDEN:,})" in r.stdout, r.output


# --- malformed safetensors headers ------------------------------------------------------

def _broken_headers() -> dict[str, tuple[Any, bytes, str]]:
    good = {n: {"dtype": d, "shape": s, "data_offsets": [0, len(b)]} for n, (d, s, b) in
            {"w": f32([2, 2])}.items()}
    payload = f32([2, 2])[2]
    return {
        "not-an-object": ([1, 2, 3], payload, "not a JSON object"),
        "entry-not-object": ({"w": "F32"}, payload, "field 'w'"),
        "no-data-offsets": ({"w": {"dtype": "F32", "shape": [2, 2]}}, payload, "data_offsets"),
        "shape-strings": ({"w": {**good["w"], "shape": ["2", "2"]}}, payload, "shape must be a list"),
        "shape-float": ({"w": {**good["w"], "shape": [2.0, 2]}}, payload, "shape must be a list"),
        "shape-negative": ({"w": {**good["w"], "shape": [-2, -2]}}, payload, "shape must be a list"),
        "shape-x-dtype": ({"w": {**good["w"], "shape": [4, 4]}}, payload, "is 64 bytes but data_offsets span 16"),
        "unknown-dtype": ({"w": {**good["w"], "dtype": "Q4"}}, payload, "unknown dtype"),
        "offsets-reversed": ({"w": {**good["w"], "data_offsets": [16, 0]}}, payload, "data_offsets must be"),
        "gap": ({"w": {**good["w"], "data_offsets": [4, 20]}}, payload + b"\0" * 4, "unused"),
        "truncated": (good, payload[:8], "truncated"),
        "trailing": (good, payload + b"\0" * 8, "follow the last tensor"),
        "metadata-not-strings": ({**good, "__metadata__": {"format": 1}}, payload, "__metadata__"),
    }


BROKEN = _broken_headers()


def _raw_file(header: Any, payload: bytes) -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + payload


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_malformed_safetensors_header_is_one_line(run_cli, tmp_path: Path, case: str) -> None:
    header, payload, needle = BROKEN[case]
    model = write_base(tmp_path / "m", weights=_raw_file(header, payload))
    one_line(run_cli("inspect", model), 2, "model.safetensors", needle)


@pytest.mark.parametrize("case", ["no-data-offsets", "shape-x-dtype", "truncated"])
def test_merge_never_writes_from_a_malformed_base(run_cli, tmp_path: Path, adapter: Path, case: str) -> None:
    header, payload, _ = BROKEN[case]
    needle = {"no-data-offsets": "data_offsets", "shape-x-dtype": "data_offsets span", "truncated": "truncated"}[case]
    weights = safetensors_bytes(base_tensors())
    if case == "shape-x-dtype":  # the q_proj of layer 0 claims 2x its bytes
        head_len = struct.unpack("<Q", weights[:8])[0]
        head = json.loads(weights[8:8 + head_len])
        head[Q_PROJ.format(0)]["shape"] = [HIDDEN * 2, HIDDEN]
        raw = json.dumps(head).encode()
        weights = struct.pack("<Q", len(raw)) + raw + weights[8 + head_len:]
    elif case == "truncated":
        weights = weights[:-100]
    else:
        weights = _raw_file(header, payload)
    base = write_base(tmp_path / "base", weights=weights)
    out = tmp_path / "out"
    one_line(run_cli("merge", base, adapter, "-o", out, "--no-verify"), 2, "model.safetensors", needle)
    nothing_left(out)


def test_inspect_of_a_half_shard_is_refused_not_half_counted(run_cli, tmp_path: Path, smollm2_dir: Path) -> None:
    model = tmp_path / "half"
    model.mkdir()
    for f in smollm2_dir.glob("*.json"):
        shutil.copyfile(f, model / f.name)
    src = smollm2_dir / "model.safetensors"
    with open(src, "rb") as a, open(model / "model.safetensors", "wb") as b:
        b.write(a.read(src.stat().st_size // 2))
    line = one_line(run_cli("inspect", model), 2, "model.safetensors", "truncated")
    assert "parameters" not in line


# --- undecodable bytes and deep nesting in every file qlift reads ------------------------

def _write_model_file(tmp_path: Path, name: str, content: bytes) -> Path:
    model = write_base(tmp_path / "m")
    (model / name).write_bytes(content)
    return model


@pytest.mark.parametrize("content,needle", [(UNDECODABLE, "not UTF-8"), (DEEP, "nested too deeply"),
                                            (b"[1, 2]", "must be a JSON object")])
@pytest.mark.parametrize("name", ["config.json", "qlift.json", "tokenizer.json", "tokenizer_config.json",
                                  "model.safetensors.index.json"])
def test_model_dir_json_files(run_cli, tmp_path: Path, name: str, content: bytes, needle: str) -> None:
    one_line(run_cli("inspect", _write_model_file(tmp_path, name, content)), 2, name, needle)


@pytest.mark.parametrize("content,needle", [(UNDECODABLE, "not UTF-8"), (DEEP, "nested too deeply"),
                                            (b'"lora"', "must be a JSON object")])
def test_adapter_config_bytes(run_cli, tmp_path: Path, base: Path, content: bytes, needle: str) -> None:
    ad = write_adapter(tmp_path / "lora")
    (ad / "adapter_config.json").write_bytes(content)
    out = tmp_path / "out"
    one_line(run_cli("merge", base, ad, "-o", out, "--no-verify"), 2, "adapter_config.json", needle)
    nothing_left(out)


@pytest.mark.parametrize("content,needle", [(UNDECODABLE, "not UTF-8"), (DEEP, "nested too deeply"),
                                            (b"[]", "must be a JSON object")])
def test_lockfile_bytes(run_cli, tmp_path: Path, content: bytes, needle: str) -> None:
    d = tmp_path / "dl"
    d.mkdir()
    (d / "qlift.lock.json").write_bytes(content)
    one_line(run_cli("verify", d), 2, "qlift.lock.json", needle)


@pytest.mark.parametrize("content,needle", [
    (b'{"id": "a", "prompt": "\xff"}\n', "not UTF-8"),
    (b'{"id": "a", "prompt": "x", "checks": {"json_schema": ' + nested(100_000).encode() + b"}}\n",
     "nested too deeply"),
    (b'{"id": "a", "prompt": "x", "checks": {"json_schema": ' + b'{"items": ' * 400 + b"{}" + b"}" * 400
     + b"}}\n", ":1: "),
])
def test_prompt_file_bytes(run_cli, tmp_path: Path, content: bytes, needle: str) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(content)
    r = run_cli("eval", tmp_path / "no-model", "--prompts", prompts)
    if r.exit_code != 2:  # a schema deep but checkable is valid: the run goes on to the missing model
        assert r.exit_code == 4, r.stderr
        return
    one_line(r, 2, "p.jsonl", needle)


@pytest.mark.parametrize("content,needle", [(b'{"text": "\xc3\x28"}\n', ":1: not UTF-8"),
                                            (b'{"text": "ok"}\n' + DEEP + b"\n", ":2: ")])
def test_calibration_file_bytes(run_cli, tmp_path: Path, smollm2_dir: Path, content: bytes, needle: str) -> None:
    calib = tmp_path / "calib.jsonl"
    calib.write_bytes(content)
    out = tmp_path / "out"
    one_line(run_cli("quantize", smollm2_dir, "--awq", "--calib", calib, "-o", out), 2, "calib.jsonl", needle)
    nothing_left(out)


@pytest.mark.parametrize("content,needle", [(b"name: x\ndescription: \xff\n", "not UTF-8"),
                                            (b"engine: " + b"[" * 5000 + b"]" * 5000, "nested too deeply"),
                                            (b"- a list\n", "YAML mapping")])
def test_recipe_yaml_bytes(run_cli, tmp_path: Path, base: Path, content: bytes, needle: str) -> None:
    recipe = tmp_path / "x.yaml"
    recipe.write_bytes(content)
    one_line(run_cli("recipes", "show", recipe), 2, "x.yaml", needle)
    one_line(run_cli("plan", base, "--recipe", recipe), 2, "x.yaml", needle)


# --- wrong types and values in config.json and adapter_config.json -----------------------

@pytest.mark.parametrize("change,field", [
    ({"vocab_size": 0}, "vocab_size"), ({"vocab_size": -5}, "vocab_size"), ({"vocab_size": "16"}, "vocab_size"),
    ({"vocab_size": 1.5}, "vocab_size"), ({"vocab_size": True}, "vocab_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"), ({"max_position_embeddings": 1e9}, "max_position"),
    ({"hidden_size": [8]}, "hidden_size"), ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
    ({"text_config": {"vocab_size": -1}}, "text_config.vocab_size"), ({"architectures": "Llama"}, "architectures"),
    ({"quantization_config": {"quant_method": "x", "config_groups": {"g": {"weights": {"num_bits": "4"}}}}},
     "num_bits"),
])
def test_wrong_types_in_config(run_cli, tmp_path: Path, change: dict[str, Any], field: str) -> None:
    model = write_base(tmp_path / "m", config={**BASE_CONFIG, **change})
    one_line(run_cli("inspect", model), 2, "config.json", field)
    r = run_cli("plan", model, "--recipe", "cpu")  # plan reads fewer fields; any answer but a crash
    assert r.exit_code in DOCUMENTED_EXITS and "internal error" not in r.stderr, r.stderr


@pytest.mark.parametrize("change,field", [
    ({"r": 0}, "'r'"), ({"r": "abc"}, "'r'"), ({"r": -4}, "'r'"), ({"r": 2.5}, "'r'"), ({"r": None}, "'r'"),
    ({"lora_alpha": None}, "'lora_alpha'"), ({"lora_alpha": "4"}, "'lora_alpha'"),
    ({"rank_pattern": ["q_proj"]}, "'rank_pattern'"), ({"rank_pattern": {"q_proj": "8"}}, "rank_pattern.q_proj"),
    ({"rank_pattern": {"q_proj": 0}}, "rank_pattern.q_proj"), ({"alpha_pattern": {"q_proj": None}}, "alpha_pattern"),
    ({"use_rslora": "yes"}, "use_rslora"), ({"fan_in_fan_out": 1}, "fan_in_fan_out"),
    ({"trainable_token_indices": [-1]}, "trainable_token_indices"),
])
def test_wrong_types_in_adapter_config(run_cli, tmp_path: Path, base: Path, change: dict[str, Any],
                                       field: str) -> None:
    ad = write_adapter(tmp_path / "lora", config={**ADAPTER_CONFIG, **change})
    out = tmp_path / "out"
    one_line(run_cli("merge", base, ad, "-o", out, "--no-verify"), 2, "adapter_config.json", field)
    nothing_left(out)


def test_rank_that_disagrees_with_the_tensors(run_cli, tmp_path: Path, base: Path) -> None:
    ad = write_adapter(tmp_path / "lora", config={**ADAPTER_CONFIG, "r": 4})
    out = tmp_path / "out"
    one_line(run_cli("merge", base, ad, "-o", out, "--no-verify"), 2, "inconsistent rank")
    nothing_left(out)


# --- truncated, empty, non-finite adapter weights -----------------------------------------

@pytest.mark.parametrize("cut", ["empty", "seven-bytes", "half-header", "half-data", "no-tensors"])
def test_truncated_or_empty_adapter_weights(run_cli, tmp_path: Path, base: Path, cut: str) -> None:
    full = safetensors_bytes(adapter_tensors())
    head_len = struct.unpack("<Q", full[:8])[0]
    weights = {"empty": b"", "seven-bytes": full[:7], "half-header": full[:8 + head_len // 2],
               "half-data": full[: (len(full) + 8 + head_len) // 2], "no-tensors": safetensors_bytes({})}[cut]
    ad = write_adapter(tmp_path / "lora", weights=weights)
    out = tmp_path / "out"
    one_line(run_cli("merge", base, ad, "-o", out, "--no-verify"), 2, "adapter_model.safetensors")
    nothing_left(out)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_adapter_weights_are_refused_with_verify_off(run_cli, tmp_path: Path, base: Path,
                                                                value: float) -> None:
    tensors = adapter_tensors()
    bad = next(n for n in tensors if n.endswith("lora_B.weight"))
    tensors[bad] = f32([HIDDEN, RANK], value)
    ad = write_adapter(tmp_path / "lora", weights=safetensors_bytes(tensors))
    out = tmp_path / "out"
    one_line(run_cli("merge", base, ad, "-o", out, "--no-verify"), 2, bad, "NaN or Inf")
    nothing_left(out)


def test_integer_adapter_weights_are_refused(run_cli, tmp_path: Path, base: Path) -> None:
    tensors = adapter_tensors()
    name = next(iter(tensors))
    tensors[name] = ("I32", [RANK, HIDDEN], b"\0" * 4 * RANK * HIDDEN)
    ad = write_adapter(tmp_path / "lora", weights=safetensors_bytes(tensors))
    one_line(run_cli("merge", base, ad, "-o", tmp_path / "out", "--no-verify"), 2, name, "floating point")


def test_pickle_adapter_that_does_not_unpickle(run_cli, tmp_path: Path, base: Path) -> None:
    ad = write_adapter(tmp_path / "lora")
    (ad / "adapter_model.safetensors").unlink()
    (ad / "adapter_model.bin").write_bytes(b"PK\x03\x04 not a zip")
    out = tmp_path / "out"
    one_line(run_cli("merge", base, ad, "-o", out, "--no-verify", "--allow-pickle"), 2, "adapter_model.bin")
    nothing_left(out)


# --- generation_config.json: validated, an invalid one refused (not copied) ----------------

@pytest.mark.parametrize("content,field", [
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"eos_token_id": "</s>"}, "eos_token_id"),
    ({"do_sample": "true"}, "do_sample"), ("[1]", "must be a JSON object"), ("{bad", "invalid JSON"),
])
def test_invalid_generation_config_from_the_adapter(run_cli, tmp_path: Path, base: Path, adapter: Path,
                                                    content: Any, field: str) -> None:
    text = content if isinstance(content, str) else json.dumps(content)
    (adapter / "generation_config.json").write_text(text)
    out = tmp_path / "out"
    one_line(run_cli("merge", base, adapter, "-o", out, "--no-verify"), 2, "generation_config.json", field)
    nothing_left(out)


def test_valid_generation_config_is_carried(run_cli, tmp_path: Path, base: Path, adapter: Path) -> None:
    gen = {"temperature": 0.7, "top_p": 0.9, "eos_token_id": [1, 2], "transformers_version": "5.0"}
    (adapter / "generation_config.json").write_text(json.dumps(gen))
    out = tmp_path / "out"
    assert run_cli("merge", base, adapter, "-o", out, "--no-verify").exit_code == 0
    assert json.loads((out / "generation_config.json").read_text()) == gen


# --- a truncated GGUF ----------------------------------------------------------------------

@pytest.mark.parametrize("keep", [0, 3, 1000, 40_000_000])
def test_truncated_gguf(run_cli, tmp_path: Path, keep: int) -> None:
    from qlift.models.gguf_import import builtin_gguf

    src = builtin_gguf("smollm2")
    bad = tmp_path / "cut.gguf"
    with open(src, "rb") as a, open(bad, "wb") as b:
        b.write(a.read(keep))
    out = tmp_path / "out"
    one_line(run_cli("import-gguf", bad, "-o", out), 2, "cut.gguf")
    nothing_left(out)


# --- URLs, repo ids and a server that does not answer JSON ----------------------------------

@pytest.mark.parametrize("url", ["localhost:8000", "ftp://127.0.0.1", "http://", "http://127.0.0.1:99999",
                                 "http://127.0.0.1:abc", "http://a b", "http://127.0.0.1:0", ""])
def test_invalid_endpoint_urls(run_cli, tmp_path: Path, url: str) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "x"}\n')
    one_line(run_cli("eval", "m", "--endpoint", url, "--prompts", prompts), 2, "--endpoint")
    one_line(run_cli("download", "org/model", "--endpoint", url, "--dry-run"), 2, "--endpoint")


@pytest.mark.parametrize("repo", ["a/b/c", "../etc", "org/..", "org/na me", "/abs", "org/", "Qwen/.", "Qwen/-x",
                                  "Qwen/x-", "Qwen/a--b", "Qwen/x.git", "Qwen/" + "x" * 97])
def test_invalid_repo_ids(run_cli, tmp_path: Path, repo: str) -> None:
    one_line(run_cli("download", repo, "-o", tmp_path / "x", "--dry-run"), 2, "repo id")


class _NotJson(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = b"<html>definitely not an OpenAI server</html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET  # noqa: N815

    def log_message(self, *args: Any) -> None:
        pass


def test_models_endpoint_that_is_not_json(run_cli, tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotJson)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        prompts = tmp_path / "p.jsonl"
        prompts.write_text('{"id": "a", "prompt": "x"}\n')
        url = f"http://127.0.0.1:{server.server_address[1]}"
        r = run_cli("eval", "m", "--endpoint", url, "--prompts", prompts, "--no-cache")
        one_line(r, 8, url)
    finally:
        server.shutdown()
        server.server_close()


# --- flags rejected up front -----------------------------------------------------------------

FLAG_CASES = [
    (["quantize", "{base}", "--awq", "--fp8", "-o", "{out}"], "--awq and --fp8"),
    (["merge", "{base}", "{adapter}", "-o", "{out}", "--tolerance", "nan"], "--tolerance"),
    (["merge", "{base}", "{adapter}", "-o", "{out}", "--tolerance", "-0.1"], "--tolerance"),
    (["merge", "{base}", "{adapter}", "-o", "{out}", "--tolerance", "inf"], "--tolerance"),
    (["merge", "{base}", "{adapter}", "-o", "{out}", "--max-shard-size", "9" * 400 + "GB"], "--max-shard-size"),
    (["serve", "{base}", "--recipe", "cpu", "--port", "65536"], "--port"),
    (["serve", "{base}", "--recipe", "cpu", "--port", "-1"], "--port"),
    (["serve", "{base}", "--recipe", "cpu", "--timeout", "-5"], "--timeout"),
    (["serve", "{base}", "--recipe", "cpu", "--timeout", "0"], "--timeout"),
    (["plan", "{base}", "--gpu", "T4", "--gpus", "0"], "--gpus"),
    (["eval", "{base}", "--prompts", "{out}", "--concurrency", "0"], "--concurrency"),
    (["eval", "{base}", "--prompts", "{out}", "--max-tokens", "-1"], "--max-tokens"),
    (["eval", "{base}", "--prompts", "{out}", "--seed", "-1"], "--seed"),
    (["eval", "{base}", "--prompts", "{out}", "--bootstrap", "10"], "--bootstrap"),
    (["download", "org/m", "--max-workers", "0", "--dry-run"], "--max-workers"),
    (["quantize", "{base}", "--awq", "-o", "{out}", "--num-samples", "0"], "--num-samples"),
    (["quantize", "{base}", "--awq", "-o", "{out}", "--seq-len", "1.5"], "--seq-len"),
    (["quantize", "{base}", "--awq", "-o", "{out}", "--ignore", "re:("], "--ignore"),
]


@pytest.mark.parametrize("argv,needle", FLAG_CASES, ids=[" ".join(a[:1] + a[-2:]) for a, _ in FLAG_CASES])
def test_flags_rejected_up_front(run_cli, tmp_path: Path, base: Path, adapter: Path, argv: list[str],
                                 needle: str) -> None:
    out = tmp_path / "out"
    args = [a.format(base=base, adapter=adapter, out=out) for a in argv]
    one_line(run_cli(*args), 2, needle)
    nothing_left(out)


# --- wrong verdicts --------------------------------------------------------------------------

@pytest.mark.parametrize("gpu,recipe", [("L4", "chat-4090"), ("A100-80GB", "chat-4090"), ("RTX 4090", "chat-h100")])
def test_plan_and_serve_agree_on_a_recipe_for_another_gpu(run_cli, smollm2_dir: Path, gpu: str, recipe: str) -> None:
    plan = run_cli("plan", smollm2_dir, "--gpu", gpu, "-r", recipe)
    serve = run_cli("serve", smollm2_dir, "--gpu", gpu, "-r", recipe, "--dry-run")
    assert plan.exit_code == serve.exit_code == 6, (plan.output, serve.output)
    assert "fits" not in plan.stdout
    assert one_line(plan, 6, "does not suit") == one_line(serve, 6, "does not suit")


def test_plan_still_plans_a_recipe_made_for_the_gpu(run_cli, smollm2_dir: Path) -> None:
    r = run_cli("plan", smollm2_dir, "--gpu", "RTX 4090", "-r", "chat-4090")
    assert r.exit_code == 0 and "fits" in r.stdout, r.output


@pytest.mark.parametrize("name", ["~nosuchuser/model", "x" * 5000, "a\x00b", "/proc/self/fd/0"])
def test_odd_base_model_names_only_warn(run_cli, tmp_path: Path, base: Path, name: str) -> None:
    ad = write_adapter(tmp_path / "lora", config={**ADAPTER_CONFIG, "base_model_name_or_path": name})
    r = run_cli("merge", base, ad, "-o", tmp_path / "out", "--no-verify")
    assert r.exit_code == 0 and "not obviously" in r.stderr, r.stderr


# --- merge --verify of a base without tokenizer files ------------------------------------------

def test_merge_verifies_a_base_without_a_tokenizer_on_token_ids(run_cli, tmp_path: Path,
                                                                 tiny_qwen2_tied: Path) -> None:
    from substrate import build_lora

    base = tmp_path / "base"
    base.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(tiny_qwen2_tied / name, base / name)
    lora = build_lora(base, tmp_path / "lora", target_modules=["q_proj", "v_proj"])
    out = tmp_path / "out"
    r = run_cli("merge", base, lora, "-o", out, "--json")  # --verify is on by default for a model this small
    assert r.exit_code == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["verify"]["passed"] and result["verify"]["inputs"] == "token ids"
    assert result["verify"]["tokens"] == 3 * 24 and result["verify"]["greedy_agreement"] > 0.9
    assert any("no tokenizer" in n for n in result["notes"])


# --- stdout closed early (`qlift recipes list | head`) -----------------------------------------

@pytest.mark.parametrize("argv", [["--help"], ["recipes", "list"], ["recipes", "list", "--json"],
                                  ["recipes", "show", "cpu"], ["bench", "--help"], ["inspect", "{model}"],
                                  ["inspect", "{model}", "--json"], ["plan", "{model}", "--recipe", "cpu"]],
                         ids=lambda a: " ".join(a))
def test_a_closed_stdout_is_a_quiet_exit(argv: list[str], smollm2_dir: Path) -> None:
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte: every write is EPIPE
    try:
        p = subprocess.run([sys.executable, "-m", "qlift", *(a.format(model=smollm2_dir) for a in argv)],
                           stdout=write_end, stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write_end)
    assert p.stderr == b"" and p.returncode == 141, (p.returncode, p.stderr.decode()[-600:])


@pytest.mark.parametrize("content", ["stable: caf\u00e9\ncanary: b\n".encode("latin-1"),
                                     "stable: a\ncanary: b\n".encode("utf-16")], ids=["latin-1", "utf-16"])
def test_rollout_spec_that_is_not_utf8(run_cli, tmp_path: Path, content: bytes) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(content)
    one_line(run_cli("promote", "start", "-f", spec, "--journal", tmp_path / "j.db"), 2, "spec.yaml", "not UTF-8")


DUPLICATE_KEYS = [
    pytest.param(["recipes", "show", "{f}"], "x.yaml", b"name: x\nengine: {max_model_len: 64}\nname: y\n",
                 "key 'name' appears twice (lines 1 and 3)", id="recipe"),
    pytest.param(["promote", "start", "-f", "{f}", "--journal", "{d}/j.db"], "spec.yaml",
                 b"stable: a\ncanary: b\nanalysis:\n  min_requests: 5\n  min_requests: 50\n",
                 "key 'min_requests' appears twice (lines 4 and 5)", id="rollout-spec"),
    pytest.param(["router", "--config", "{f}"], "router.yaml",
                 b"backends:\n  - {name: a, url: 'http://127.0.0.1:1', weight: 100, weight: 0}\n",
                 "key 'weight' appears twice on line 2", id="router-config"),
]


@pytest.mark.parametrize(("argv", "name", "content", "needle"), DUPLICATE_KEYS)
def test_a_yaml_key_given_twice_is_refused_naming_both_lines(run_cli, tmp_path: Path, argv: list[str], name: str,
                                                             content: bytes, needle: str) -> None:
    """Before, PyYAML kept the last value silently."""
    f = tmp_path / name
    f.write_bytes(content)
    line = one_line(run_cli(*(a.format(f=f, d=tmp_path) for a in argv)), 2, needle)
    assert line == f"error: {f}: {needle}. Remove one of them.", line
