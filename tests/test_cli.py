"""The CLI surface: help, version, global options, the one error handler."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from qlift import __version__
from qlift.cli.main import COMMANDS, QliftGroup, cli
from qlift.errors import (
    EXIT_CODES,
    BadInputError,
    GateFailedError,
    NotFoundError,
    OutputExistsError,
    QliftError,
    Terminated,
    exit_code_for,
)


def test_help_lists_every_command_with_examples(run_cli) -> None:
    result = run_cli("--help")
    assert result.exit_code == 0
    for name in COMMANDS:
        assert name in result.stdout
    assert "Examples:" in result.stdout


def test_every_command_has_help_with_examples_and_json(run_cli) -> None:
    for name in COMMANDS:
        result = run_cli(name, "--help")
        assert result.exit_code == 0, (name, result.output)
        assert "Examples:" in result.stdout, name
        group = cli.get_command(click.Context(cli), name)
        leaves = [name] if not isinstance(group, click.Group) else [f"{name} {sub}" for sub in group.commands]
        for leaf in leaves:
            sub = run_cli(*leaf.split(), "--help")
            assert sub.exit_code == 0 and "--json" in sub.stdout, leaf


def test_help_imports_no_heavy_library() -> None:
    code = (
        "import sys; from click.testing import CliRunner; from qlift.cli import cli;"
        "CliRunner().invoke(cli, ['--help']);"
        "heavy = [m for m in ('torch', 'vllm', 'transformers', 'llmcompressor') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_version(run_cli) -> None:
    result = run_cli("--version")
    assert result.exit_code == 0 and __version__ in result.stdout


def test_error_table_is_ordered_most_specific_first() -> None:
    classes = [cls for cls, _ in EXIT_CODES]
    for i, cls in enumerate(classes):
        for later in classes[i + 1 :]:
            assert not issubclass(later, cls), f"{later.__name__} is shadowed by {cls.__name__}"
    codes = [code for _, code in EXIT_CODES]
    assert len(codes) == len(set(codes))


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (BadInputError("x"), 2),
        (OutputExistsError(__import__("pathlib").Path("/o")), 3),
        (NotFoundError("x"), 4),
        (GateFailedError("x"), 10),
        (QliftError("x"), 1),
        (Terminated(), 143),
        (KeyboardInterrupt(), 130),
        (RuntimeError("bug"), 70),
    ],
)
def test_exit_codes(exc: BaseException, code: int) -> None:
    assert exit_code_for(exc) == code


def _group_raising(exc: BaseException) -> click.Group:
    @click.group(cls=QliftGroup)
    def g() -> None:
        pass

    @g.command()
    def boom() -> None:
        raise exc

    return g


def test_qlift_error_is_one_line_with_hint(run_cli) -> None:
    from click.testing import CliRunner

    g = _group_raising(BadInputError("bad thing", hint="Do this instead.", path="f.jsonl", line=3))
    result = CliRunner().invoke(g, ["boom"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: f.jsonl:3: bad thing. Do this instead."
    assert "Traceback" not in result.output


def test_internal_error_is_one_line_and_debug_shows_traceback() -> None:
    from click.testing import CliRunner

    from qlift.cli.output import STATE

    g = _group_raising(ZeroDivisionError("oops"))
    result = CliRunner().invoke(g, ["boom"])
    assert result.exit_code == 70
    assert len(result.stderr.strip().splitlines()) == 1
    assert "internal error: ZeroDivisionError: oops" in result.stderr
    STATE.debug = True
    try:
        result = CliRunner().invoke(g, ["boom"])
    finally:
        STATE.debug = False
    assert "Traceback" in result.stderr


def test_bad_path_to_inspect_is_one_clear_line(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "qlift", "inspect", str(tmp_path / "missing")], capture_output=True, text=True
    )
    assert out.returncode == 4
    assert out.stderr.strip().splitlines() == [
        f"error: model directory {tmp_path / 'missing'} does not exist. "
        "Check the path, or create one with `qlift download` or `qlift import-gguf`."
    ]


def test_global_json_flag(run_cli, tiny_qwen2_tied) -> None:
    result = run_cli("--json", "inspect", tiny_qwen2_tied)
    assert result.exit_code == 0
    assert json.loads(result.stdout)["architecture"] == "Qwen2ForCausalLM"
    assert cli.name is not None


def _leaves() -> list[list[str]]:
    out = []
    for name in COMMANDS:
        cmd = cli.get_command(click.Context(cli), name)
        out += [[name, sub] for sub in cmd.commands] if isinstance(cmd, click.Group) else [[name]]
    return out


@pytest.mark.parametrize("words", _leaves(), ids=" ".join)
def test_usage_errors_are_one_line_naming_the_help_to_read(run_cli, words: list[str]) -> None:
    r = run_cli(*words, "--no-such-flag")
    assert r.exit_code == 2
    assert r.stderr.strip() == f"error: no such option '--no-such-flag'. See `qlift {' '.join(words)} --help`."
    assert r.stdout == ""


@pytest.mark.parametrize(("args", "line"), [
    (["merge"], "error: missing argument 'BASE'. See `qlift merge --help`."),
    (["nosuch"], "error: no such command 'nosuch'. See `qlift --help`."),
    (["promote", "nosuch"], "error: no such command 'nosuch'. See `qlift promote --help`."),
    (["inspect", "a", "b"], "error: got unexpected extra argument (b). See `qlift inspect --help`."),
    (["--forc"], "error: no such option '--forc'. See `qlift --help`."),
    (["merge", "--forc", "a", "b"],
     "error: no such option '--forc'. Did you mean '--force'? See `qlift merge --help`."),
    (["plan", "m", "--workload", "x"], "error: invalid value for '--workload': 'x' is not one of 'chat', "
                                      "'long-doc', 'multi-tenant', 'batch'. See `qlift plan --help`."),
])
def test_usage_error_lines(run_cli, args: list[str], line: str) -> None:
    r = run_cli(*args)
    assert (r.exit_code, r.stderr.strip()) == (2, line)


def test_usage_error_from_the_console_script_is_one_line() -> None:
    out = subprocess.run([sys.executable, "-m", "qlift", "eval"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.splitlines() == ["error: missing argument 'CANDIDATE'. See `qlift eval --help`."]


@pytest.mark.skipif(any(__import__("pathlib").Path("/dev").glob("nvidia*")), reason="an NVIDIA machine asks torch")
def test_plan_on_a_machine_without_an_nvidia_gpu_imports_no_torch(smollm2_dir) -> None:
    """Asking torch for CUDA GPUs where there is no NVIDIA device node was 10-15 s of every `qlift plan`."""
    code = (
        "import sys; from click.testing import CliRunner; from qlift.cli import cli;"
        f"r = CliRunner().invoke(cli, ['plan', {str(smollm2_dir)!r}, '--recipe', 'cpu', '--json']);"
        "assert r.exit_code == 0, r.output; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
