"""Recipe schema: the shipped recipes load; bad ones fail naming file and field."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from qlift.errors import BadInputError, NotFoundError
from qlift.serve.recipes import apply_overrides, list_recipes, load_recipe, recipes_dir

SHIPPED = {
    "chat-4090", "chat-t4", "chat-v100", "chat-a10g", "chat-l4", "chat-a100-80g", "long-doc-a100-40g",
    "multi-tenant-a100x2", "chat-h100", "chat-h200", "cpu",
}
GOOD = {
    "name": "mine",
    "description": "test recipe",
    "workload": "chat",
    "hardware": {"device": "gpu", "gpu_names": ["RTX 4090"], "min_memory_gib": 20, "min_compute_capability": 8.9},
    "engine": {"dtype": "bfloat16", "max_model_len": 4096},
}


def write(tmp_path: Path, data: dict, name: str = "mine") -> Path:  # type: ignore[type-arg]
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_shipped_recipes_load_and_follow_the_hardware_rules() -> None:
    recipes = {r.name: r for r in list_recipes()}
    assert set(recipes) >= SHIPPED
    for r in recipes.values():
        assert r.description and r.sources, r.name
        if r.hardware.device == "gpu" and r.hardware.min_compute_capability < 8.0:
            assert r.engine.dtype == "float16", r.name
        assert "swap_space" not in r.engine.args()
    assert recipes["multi-tenant-a100x2"].tensor_parallel_size == 2
    assert recipes["chat-t4"].engine.dtype == recipes["chat-v100"].engine.dtype == "float16"
    assert recipes["cpu"].hardware.device == "cpu"


def test_recipe_by_path_and_dashed_names(tmp_path: Path) -> None:
    data = {**GOOD, "engine": {"max-model-len": 2048, "enable-chunked-prefill": False, "max-num-seqs": 8}}
    r = load_recipe(str(write(tmp_path, data)))
    assert r.engine.args() == {"max_model_len": 2048, "enable_chunked_prefill": False, "max_num_seqs": 8}


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"engine": {"gpu_memory_utilization": 1.5}}, "engine.gpu_memory_utilization", "less than or equal to 1"),
        ({"engine": {"max_num_seq": 8}}, "engine.max_num_seq", "did you mean 'max_num_seqs'"),
        ({"engine": {"swap_space": 4}}, "engine.swap_space", "no longer has the option 'swap_space'"),
        ({"engine": {"api_key": "x"}}, "engine.api_key", "--api-key-env"),
        ({"engine": {"kv_cache_dtype": "int3"}}, "engine.kv_cache_dtype", "fp8"),
        ({"workload": "gaming"}, "workload", "chat"),
        ({"hardware": {"gpu_names": ["("]}}, "hardware.gpu_names", "regular expression"),
        ({"hardware": {"device": "tpu"}}, "hardware.device", "'gpu' or 'cpu'"),
        ({"extra": 1}, "extra", "not permitted"),
        ({"hardware": {"min_compute_capability": 7.5}}, "engine.dtype", "compute capability 8.0"),
        ({"engine": {"tensor_parallel_size": 2}}, "engine.tensor_parallel_size", "gpu_count 1"),
        ({"name": "other"}, "name", "file name"),
    ],
)
def test_bad_recipe_names_file_and_field(tmp_path: Path, change: dict, field: str, words: str) -> None:  # type: ignore[type-arg]
    data = json.loads(json.dumps(GOOD))
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    path = write(tmp_path, data)
    with pytest.raises(BadInputError) as err:
        load_recipe(str(path))
    msg = err.value.one_line()
    assert msg.startswith(f"{path}: field '{field}'"), msg
    assert words.lower() in msg.lower(), msg


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\nengine: {dtype: [\n")
    with pytest.raises(BadInputError, match=r"broken\.yaml:\d+: invalid YAML"):
        load_recipe(str(path))


def test_unknown_recipe_suggests_a_name() -> None:
    with pytest.raises(NotFoundError) as err:
        load_recipe("chat-409")
    assert "Did you mean 'chat-4090'?" in err.value.one_line()


def test_overrides_are_vllm_names_with_typed_values() -> None:
    r = apply_overrides(load_recipe("chat-4090"), ["max-model-len=4096", "enforce_eager=true",
                                                    "gpu_memory_utilization=0.8", "seed=7"])
    args = r.engine.args()
    assert args["max_model_len"] == 4096 and args["enforce_eager"] is True
    assert args["gpu_memory_utilization"] == 0.8 and args["seed"] == 7
    for bad, words in (("swap_space=4", "swap_space"), ("max_model_len=lots", "max_model_len"),
                       ("novalue", "key=value"), ("port=1", "--port")):
        with pytest.raises(BadInputError) as err:
            apply_overrides(r, [bad])
        assert words in err.value.one_line()


def test_recipes_dir_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, GOOD)
    monkeypatch.setenv("QLIFT_RECIPES_DIR", str(tmp_path))
    assert recipes_dir() == tmp_path
    assert [r.name for r in list_recipes()] == ["mine"]
    monkeypatch.setenv("QLIFT_RECIPES_DIR", str(tmp_path / "nope"))
    with pytest.raises(NotFoundError, match="QLIFT_RECIPES_DIR"):
        recipes_dir()


def test_recipes_list_marks_what_suits_the_hardware(run_cli) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("recipes", "list", "--gpu", "A100-40GB", "--gpus", "2", "--json")
    assert res.exit_code == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    suits = {n for n, r in rows.items() if r["suits_this_machine"]}
    assert suits == {"long-doc-a100-40g", "multi-tenant-a100x2"}
    assert "76 GiB" in rows["chat-a100-80g"]["why_not"]
    res = run_cli("recipes", "list")
    assert res.exit_code == 0 and "* cpu" in res.stdout  # this test machine has no GPU


def test_recipes_show(run_cli) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("recipes", "show", "chat-h200")
    assert res.exit_code == 0 and "max_num_batched_tokens: 16384" in res.stdout
    data = json.loads(run_cli("recipes", "show", "cpu", "--json").stdout)
    assert data["engine"]["enforce_eager"] is True and data["hardware"]["device"] == "cpu"
    res = run_cli("recipes", "show", "nope")
    assert res.exit_code == 4 and res.stderr.count("\n") == 1


def test_h200_recipe_carries_its_measurements() -> None:
    r = load_recipe("chat-h200")
    m = r.measurements
    assert m is not None and m["vllm_version"] == "0.26.0" and m["workload"] == "chat"
    points = {p["label"]: p for p in m["points"]}
    chosen, defaults = points[m["chosen"]], points["vllm-defaults"]
    assert chosen["status"] == "measured" and defaults["status"] == "measured"
    # the recipe serves the chosen point's settings, never its random weights
    engine = r.engine.args()
    assert "load_format" not in engine
    assert all(engine[k] == v for k, v in chosen["engine"].items() if k != "load_format")
    # chat: more API servers, per-token streaming (stream_interval batches tokens ~200 ms apart)
    assert engine["api_server_count"] > 1 and engine.get("stream_interval", 1) == 1
    # >= 1.15x `vllm serve` defaults through the server, by the client and by the server's own counter
    for figure in ("output_tokens_per_s", "server_output_tokens_per_s"):
        assert chosen[figure] >= 1.15 * defaults[figure], figure


def test_front_end_keys_in_a_recipe_reach_vllm_serve(run_cli, tmp_path: Path, smollm2_dir: Path) -> None:
    """api_server_count / stream_interval are checked against vLLM's arguments and land in the config;
    a recipe's api_server_count is lowered to this host's cores, a --set one is kept."""
    recipe = yaml.safe_load(Path(load_recipe("cpu").path).read_text())  # type: ignore[arg-type]
    recipe["name"] = "cpu-fe"
    recipe["engine"].update(api_server_count=64, stream_interval=4)
    path = tmp_path / "cpu-fe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = json.loads(run_cli("serve", smollm2_dir, "--recipe", path, "--dry-run", "--json").stdout)
    config = yaml.safe_load(out["config"])
    assert config["stream-interval"] == 4 and config["api-server-count"] < 64
    assert any("api_server_count lowered from 64" in n for n in out["notes"])
    assert out["argv"][1:4] == ["-m", "qlift.vllm.cli_main", "serve"]
    kept = json.loads(run_cli("serve", smollm2_dir, "--recipe", path, "--set", "api_server_count=3", "--dry-run",
                              "--json").stdout)
    assert yaml.safe_load(kept["config"])["api-server-count"] == 3
    recipe["engine"]["api_servers"] = 2
    path.write_text(yaml.safe_dump(recipe))
    bad = run_cli("serve", smollm2_dir, "--recipe", path, "--dry-run")
    assert bad.exit_code == 2 and "api_servers" in bad.stderr and "api_server_count" in bad.stderr


def test_false_engine_args_reach_vllm_on_the_command_line(tmp_path: Path) -> None:
    """vLLM 0.26's --config loader drops `KEY: false`; the command line carries it for every version."""
    from qlift.serve.launch import config_yaml
    from qlift.vllm.engine_args import false_flags

    engine = {"enable_prefix_caching": False, "enforce_eager": True, "disable_log_stats": False, "max_num_seqs": 8}
    flags = false_flags(engine)
    assert flags == ["--no-enable-prefix-caching"]  # disable_log_stats has no --no- form; false is its default
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(config_yaml(tmp_path, "127.0.0.1", 8000, "m", engine))
    # vLLM's own parser, in a process of its own: importing vLLM here depends on what pytest imported
    # before (setuptools' distutils hack refuses a distutils already loaded).
    parse = ("import json, sys\n"
             "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
             "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
             "a = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])\n"
             "print(json.dumps([a.enable_prefix_caching, a.enforce_eager, a.max_num_seqs]))\n")
    done = subprocess.run([sys.executable, "-c", parse, "--config", str(cfg), *flags], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [False, True, 8]


def test_attention_backend_reaches_vllm_as_its_engine_argument(run_cli, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                               smollm2_dir: Path) -> None:
    """`attention_backend` (vLLM 0.26's `--attention-backend`; it has no VLLM_ATTENTION_BACKEND) is a recipe
    engine field and a --set key like any vLLM argument: the config carries it and vLLM's parser reads it."""
    recipe = yaml.safe_load(Path(load_recipe("cpu").path).read_text())  # type: ignore[arg-type]
    recipe["name"] = "cpu-attn"
    recipe["engine"]["attention_backend"] = "FLASH_ATTN"
    path = tmp_path / "cpu-attn.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert load_recipe(str(path)).engine.args()["attention_backend"] == "FLASH_ATTN"
    out = json.loads(run_cli("serve", smollm2_dir, "--recipe", path, "--set", "attention_backend=CPU_ATTN",
                             "--dry-run", "--json").stdout)
    assert yaml.safe_load(out["config"])["attention-backend"] == "CPU_ATTN"  # --set wins over the recipe
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    parse = ("import sys\n"
             "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
             "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
             "from vllm.config import AttentionConfig\n"
             "a = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])\n"
             "print(AttentionConfig(backend=a.attention_backend).backend.name)\n")  # the name checked, as vLLM does
    cfg = tmp_path / "config.yaml"
    cfg.write_text(out["config"])
    done = subprocess.run([sys.executable, "-c", parse, "--config", str(cfg)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "CPU_ATTN"


def test_the_offline_engine_leaves_a_recipes_server_arguments_out() -> None:
    """chat-h200 carries api_server_count, a `vllm serve` argument: `qlift batch` with it must not hand
    that to LLM(...) (a TypeError), and keeps every engine argument."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    engine = load_recipe("chat-h200").engine.args()
    code = ("import json, sys\nfrom qlift.perf.batch_worker import offline_args\n"
            "print(json.dumps(offline_args(json.loads(sys.argv[1]))))\n")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(engine)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    kept = json.loads(done.stdout.strip().splitlines()[-1])
    assert kept == {k: v for k, v in engine.items() if k != "api_server_count"}
    assert "server arguments not used by the offline engine: api_server_count" in done.stdout
