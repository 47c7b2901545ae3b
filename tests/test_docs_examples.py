"""The docs' examples marked runnable (a `<!-- runnable -->` line right before the code block)
run as written, in order, in one scratch directory: every `qlift ...` line must exit 0.

In a ```console block the lines starting with `$ ` are commands (the rest is sample output,
not compared: timings and paths differ); in a ```bash block every line is one. Pages run in
PAGES order, so a later page may use what an earlier one wrote (smollm2/ from import-gguf).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
PAGES = ["import-gguf.md", "inspect.md", "recipes.md", "plan.md", "deploy.md"]
MARK = "<!-- runnable -->"
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def runnable_commands(text: str) -> list[str]:
    commands: list[str] = []
    for m in _BLOCK.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        if before != MARK:
            continue
        lang, body = m.group(1), m.group(2)
        for raw in body.replace("\\\n", " ").splitlines():
            line = raw.strip()
            if lang == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            line = re.sub(r"\s+#.*$", "", line)  # trailing comments
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def test_every_runnable_block_is_in_a_page_the_test_runs() -> None:
    marked = {p.name for p in DOCS.glob("*.md") if runnable_commands(p.read_text(encoding="utf-8"))}
    assert marked <= set(PAGES), f"add these pages to PAGES: {sorted(marked - set(PAGES))}"
    assert len(marked) >= 4


def test_runnable_examples_run(tmp_path: Path, smollm2_dir: Path) -> None:
    (tmp_path / "examples").symlink_to(REPO / "examples")
    env = {**os.environ, "QLIFT_HOME": str(tmp_path / "home")}
    ran = 0
    for page in PAGES:
        path = DOCS / page
        for cmd in runnable_commands(path.read_text(encoding="utf-8")):
            argv = shlex.split(cmd)
            assert argv[0] == "qlift", f"{page}: runnable lines must be qlift commands: {cmd}"
            proc = subprocess.run([sys.executable, "-m", "qlift", *argv[1:]], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, f"{page}: `{cmd}` exited {proc.returncode}: {proc.stderr[-500:]}"
            ran += 1
    assert ran >= 8


def test_the_parser_reads_console_and_bash_blocks() -> None:
    text = ("x\n<!-- runnable -->\n```console\n$ qlift a --b  # note\nout\n$ qlift c \\\n  d\n```\n"
            "```bash\nqlift skipped\n```\n<!-- runnable -->\n```bash\n# comment\nqlift e\n```\n")
    assert runnable_commands(text) == ["qlift a --b", "qlift c    d", "qlift e"]


@pytest.mark.parametrize("page", PAGES)
def test_pages_exist(page: str) -> None:
    assert (DOCS / page).is_file()
