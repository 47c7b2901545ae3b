"""Docs stay in step with the CLI."""

from __future__ import annotations

from pathlib import Path

from qlift.cli.docgen import render
from qlift.cli.main import COMMANDS

DOCS = Path(__file__).resolve().parent.parent / "docs"
README = (DOCS.parent / "README.md").read_text()


def test_cli_reference_is_current() -> None:
    assert (DOCS / "cli.md").read_text() == render(), "run: python -m qlift.cli.docgen > docs/cli.md"


def test_every_command_has_a_page_and_a_readme_row() -> None:
    for name in COMMANDS:
        assert (DOCS / f"{name}.md").is_file(), f"docs/{name}.md is missing"
        assert f"`qlift {name}`" in README, f"README's command table lacks qlift {name}"
