"""The CLI generated from each stage's typed options (qlift/cli/options.py): every generated flag is a
field and every field a flag (but those a command spells its own way), with the field's doc as its help
and the field's default; a bad value is exit 2 and one line naming the flag."""

from __future__ import annotations

import dataclasses
from typing import Any

import click
import pytest
from test_bad_input import one_line

from qlift.cli import cli
from qlift.cli.batch import batch_cmd
from qlift.cli.bench import bench_cmd
from qlift.cli.deploy import k8s_cmd
from qlift.cli.download import download_cmd
from qlift.cli.eval import eval_cmd
from qlift.cli.merge import merge_cmd
from qlift.cli.quantize import quantize_cmd
from qlift.cli.serve import serve_cmd
from qlift.cli.tune import tune_cmd
from qlift.deploy.options import DeployOptions
from qlift.eval.options import EvalOptions
from qlift.hub.options import DownloadOptions
from qlift.merge.options import MergeOptions
from qlift.options import field_docs, field_flag
from qlift.perf.options import BatchOptions, BenchOptions, TuneOptions
from qlift.quantize.options import QuantizeOptions
from qlift.serve.options import ServeOptions

# command: (its options class, fields it spells its own way, its own parameters, the least it runs with)
COMMANDS: dict[str, tuple[click.Command, type, set[str], set[str], list[str]]] = {
    "merge": (merge_cmd, MergeOptions, set(), {"base", "adapters", "output"}, ["b", "a", "-o", "o"]),
    "quantize": (quantize_cmd, QuantizeOptions, {"method"}, {"model", "awq", "fp8", "output"},
                 ["m", "--awq", "-o", "o"]),
    "eval": (eval_cmd, EvalOptions, set(), {"candidate"}, ["c", "--prompts", "p.jsonl"]),
    "bench": (bench_cmd, BenchOptions, set(), {"endpoint", "model", "baseline", "plot", "out", "force"},
              ["--endpoint", "http://127.0.0.1:9", "--model", "m"]),
    "tune": (tune_cmd, TuneOptions, set(), {"model", "out", "force", "plot"},
             ["m", "-r", "cpu", "--grid", "max_num_seqs=4", "-o", "t.yaml"]),
    "download": (download_cmd, DownloadOptions, set(), {"repo_id"}, ["org/m"]),
    "batch": (batch_cmd, BatchOptions, set(), {"model", "input_path", "out"}, ["m", "in.jsonl", "-o", "o.jsonl"]),
    "deploy": (k8s_cmd, DeployOptions, {"model", "loras"}, {"model", "loras", "out", "force"},
               [".", "--recipe", "cpu", "-o", "o"]),  # MODEL must be a directory
    "serve": (serve_cmd, ServeOptions, {"loras"}, {"model", "loras"}, ["m"]),
}


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


@pytest.mark.parametrize("name", COMMANDS)
def test_every_field_is_a_flag_with_its_doc_as_help(name: str) -> None:
    cmd, cls, excluded, own, _ = COMMANDS[name]
    docs = field_docs(cls)
    params = {p.name: p for p in cmd.params if p.expose_value}
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in excluded}
    assert set(params) - own == set(fields), "a generated flag without a field, or a field without a flag"
    assert own <= set(params)
    for field_name, f in fields.items():
        p = params[field_name]
        assert docs.get(field_name), f"{cls.__name__}.{field_name} has no docstring"
        assert field_flag(f) in p.opts + getattr(p, "secondary_opts", []), (field_name, p.opts)
        assert p.help == docs[field_name], field_name
    for hand in excluded & set(params):  # spelled by hand, but its help is still the field's doc
        if isinstance(params[hand], click.Option):
            assert params[hand].help == docs[hand], hand


@pytest.mark.parametrize("name", COMMANDS)
def test_no_flag_given_is_the_fields_default(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QLIFT_EVAL_API_KEY", raising=False)
    cmd, cls, excluded, _, least = COMMANDS[name]
    with click.Context(cli, info_name="qlift", **cli.context_settings) as parent:  # -h as well as --help
        given = cmd.make_context(name, list(least), parent=parent).params
    for f in dataclasses.fields(cls):
        if f.name not in excluded and _default(f) is not dataclasses.MISSING:
            assert given[f.name] == _default(f), f.name


DEPLOY = ["deploy", "k8s", ".", "--recipe", "cpu", "-o", "{out}"]  # MODEL must be a directory
BAD_VALUES = [
    (["merge", "b", "a", "-o", "{out}", "--dtype", "int8"], "--dtype"),
    (["quantize", "m", "--awq", "-o", "{out}", "--group-size", "48"], "--group-size"),
    (["quantize", "m", "--awq", "-o", "{out}", "--threads", "0"], "--threads"),
    (["quantize", "m", "--awq", "-o", "{out}", "--num-samples", "2000000"], "--num-samples"),
    (["quantize", "m", "--awq", "-o", "{out}", "--device", "tpu"], "--device"),
    (["eval", "c", "--prompts", "p.jsonl", "--bootstrap", "10"], "--bootstrap"),
    (["eval", "c", "--prompts", "p.jsonl", "--backend", "ollama"], "--backend"),
    (["eval", "c", "--prompts", "p.jsonl", "--endpoint", "ftp://x"], "--endpoint"),
    (["eval", "c", "--prompts", "p.jsonl", "--max-model-len", "8"], "--max-model-len"),
    (["bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--concurrency", "0,2"], "--concurrency"),
    (["bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--timeout", "0"], "--timeout"),
    (["bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--slo", "ttft=0ms"], "--slo"),
    (["bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--seed", str(2**31)], "--seed"),
    (["tune", "m", "-r", "cpu", "--grid", "max_num_seqs=4", "-o", "{out}", "--workload", "batch"], "--workload"),
    (["tune", "m", "-r", "cpu", "--grid", "max_num_seqs=4", "-o", "{out}", "--point-budget", "0"], "--point-budget"),
    (["tune", "m", "-r", "cpu", "--grid", "max_num_seqs=4", "-o", "{out}", "--slo", "gap=0ms"], "--slo"),
    (["tune", "m", "-r", "cpu", "--grid", "max_num_seqs", "-o", "{out}"], "--grid"),
    (["download", "org/m", "-o", "{out}", "--max-workers", "65"], "--max-workers"),
    (["download", "org/m", "-o", "{out}", "--source", "gitlab"], "--source"),
    (["download", "org/m", "-o", "{out}", "--endpoint", "ftp://x"], "--endpoint"),
    (["download", "org/m", "-o", "{out}", "--token-env", "QLIFT_TEST_UNSET_TOKEN"], "--token-env"),
    (["batch", "m", "in.jsonl", "-o", "{out}", "--max-tokens", "0"], "--max-tokens"),
    (["batch", "m", "in.jsonl", "-o", "{out}", "--temperature", "-1"], "--temperature"),
    (["batch", "m", "in.jsonl", "-o", "{out}", "--timeout", "0"], "--timeout"),
    ([*DEPLOY, "--replicas", "0"], "--replicas"),
    ([*DEPLOY, "--queue-target", str(2**31)], "--queue-target"),
    ([*DEPLOY, "--replicas", "3", "--max-replicas", "2"], "--max-replicas"),
    ([*DEPLOY, "--rollout", "flagger"], "--rollout"),
    ([*DEPLOY, "--name", "Bad_Name"], "--name"),
    ([*DEPLOY, "--canary", "no/such/dir"], "--canary"),
    ([*DEPLOY, "--prometheus-url", "ftp://x"], "--prometheus-url"),
    ([*DEPLOY, "--rollout", "argo", "--gateway-api"], "--gateway-api"),
    (["serve", "m", "--port", "65536"], "--port"),
    (["serve", "m", "--workload", "training"], "--workload"),
    (["serve", "m", "--timeout", "0"], "--timeout"),
    (["serve", "m", "--gpu", "T4", "--gpus", "0", "--dry-run"], "--gpus"),
    (["serve", "m", "--gpu", "T4"], "--gpu"),
    (["serve", "m", "--lora", "tickets"], "--lora"),
]


@pytest.mark.parametrize(("argv", "flag"), BAD_VALUES, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD_VALUES])
def test_a_bad_value_is_exit_2_naming_the_flag(run_cli, tmp_path, argv: list[str], flag: str) -> None:
    one_line(run_cli(*[a.format(out=tmp_path / "out") for a in argv]), 2, flag)
    assert not (tmp_path / "out").exists()


def test_router_flags_are_its_config_fields() -> None:
    """`qlift router`'s settings flags come from RouterConfig (FLAG_FIELDS): help is the field's description."""
    from qlift.cli.router import router_cmd
    from qlift.router.config import FLAG_FIELDS, RouterConfig

    params = {p.name: p for p in router_cmd.params}
    own = {"backends", "weights", "config_path", "json_output", "take_over"}  # spelled by hand: not RouterConfig's
    assert set(params) - own == set(FLAG_FIELDS), "a settings flag without its field, or a field without its flag"
    for name in FLAG_FIELDS:
        info = RouterConfig.model_fields[name]
        assert info.description and (params[name].help or "").startswith(info.description), name
        assert "--" + name.replace("_", "-") in params[name].opts


def test_router_bad_port_is_one_line_naming_it(run_cli) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("router", "--backend", "a=http://127.0.0.1:9", "--port", "70000")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and "port" in r.stderr, r.stderr


def test_click_and_the_cli_are_imported_only_in_the_cli() -> None:
    """One flag generator, in qlift/cli/: no other module builds Click options or reaches into the CLI."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "qlift"
    pattern = re.compile(r"^\s*(?:import|from)\s+(?:click|qlift\.cli)\b", re.MULTILINE)
    found = [str(p.relative_to(root)) for p in sorted(root.rglob("*.py"))
             if p.parent != root / "cli" and p != root / "__main__.py" and pattern.search(p.read_text("utf-8"))]
    assert not found


def test_the_cli_names_by_its_flag_each_field_an_error_names() -> None:
    """Domain code names fields (in backquotes, beside its ``field``); qlift/cli/options.py says each by its flag,
    leaving what is not a field of the command as it is, and a file's error untouched."""
    from qlift.cli.options import as_flags
    from qlift.errors import BadInputError

    flags = {"judge": "--judge", "baseline": "--baseline", "method=awq": "--awq"}
    exc = BadInputError("`judge` needs `baseline`, as `method=awq` does; `qlift serve` is apart", field="judge",
                        hint="Pass `baseline` MODEL.")
    assert as_flags(exc, flags).one_line() == ("field '--judge': --judge needs --baseline, as --awq does; "
                                               "`qlift serve` is apart. Pass --baseline MODEL.")
    in_file = BadInputError("`judge` needs `baseline`", path="release.yaml", field="options.judge")
    plain = BadInputError("no field named", field="other", hint="Nothing to say.")
    assert as_flags(in_file, flags) is in_file and as_flags(plain, flags) is plain


@pytest.mark.parametrize(("build", "args", "flag"), [
    ("slo", ["bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--slo", "ttft=0ms"], "--slo"),
    ("grid", ["tune", "m", "--recipe", "cpu", "--grid", "max_num_seqs=4", "--grid", "max_num_seqs=8", "-o", "t.yaml"],
     "--grid sets max_num_seqs twice"),
    ("judge", ["eval", "m", "--prompts", "p.jsonl", "--judge", "http://127.0.0.1:9#judge"], "no --baseline was given"),
    ("fp8", ["quantize", "m", "--fp8", "--group-size", "64", "-o", "q"], "--group-size apply to --awq only"),
])
def test_a_domain_error_names_fields_and_the_command_its_flags(run_cli, tmp_path, monkeypatch, build: str,
                                                                 args: list[str], flag: str) -> None:
    from qlift.errors import BadInputError
    from qlift.eval.options import EvalOptions
    from qlift.perf.options import parse_grid
    from qlift.perf.slo import parse_slo
    from qlift.quantize.options import QuantizeOptions

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "x"}\n', encoding="utf-8")
    calls = {"slo": lambda: parse_slo("ttft=0ms"), "grid": lambda: parse_grid(["max_num_seqs=4", "max_num_seqs=8"]),
             "judge": lambda: EvalOptions(prompts=tmp_path / "p.jsonl", judge="http://127.0.0.1:9#judge"),
             "fp8": lambda: QuantizeOptions(method="fp8", group_size=64)}
    with pytest.raises(BadInputError) as err:
        calls[build]()
    assert "--" not in err.value.one_line(), err.value.one_line()
    one_line(run_cli(*args), 2, flag)
