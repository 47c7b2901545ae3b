"""The release's spine (#40): the stage table at the bottom of ``qlift/release/`` holding classes, every kind run by
one door, no import circle inside the package and no import of a module above, and typed outputs (a report is
never a model)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RELEASE = REPO / "qlift" / "release"


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of qlift/release it imports, every import counted (lazy, TYPE_CHECKING ones too)."""
    modules = {p.stem for p in RELEASE.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in RELEASE.glob("*.py"):
        arrows: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module == "qlift.release":
                names = [a.name if a.name in modules else "__init__" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("qlift.release."):
                names = [(node.module or "").split(".")[2]]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[2] for a in node.names if a.name.startswith("qlift.release.")]
            arrows |= set(names)
        graph[path.stem] = arrows - {path.stem}
    return graph


def _layers(graph: dict[str, set[str]]) -> tuple[list[list[str]], set[str]]:
    """The modules in layers, bottom first (each imports only layers below it), and those left in a circle."""
    left = {m: set(a) for m, a in graph.items()}
    layers: list[list[str]] = []
    while ready := sorted(m for m, a in left.items() if not a):
        layers.append(ready)
        for m in ready:
            del left[m]
        for arrows in left.values():
            arrows.difference_update(ready)
    return layers, set(left)


def test_release_imports_form_layers_with_the_table_at_the_bottom() -> None:
    graph = _import_graph()
    layers, circle = _layers(graph)
    assert not circle, {m: graph[m] for m in sorted(circle)}
    assert graph["kinds"] <= {"stage_options"} and graph["stage_options"] == set()  # the table is at the bottom
    assert all("__init__" not in arrows for m, arrows in graph.items())  # nothing imports back up to the package
    below_doors = {"kinds", "stage_options", "journal", "cache", "outputs", "report", "spec", "live", "livecontext"}
    for module in below_doors:  # the table, the spec and the contexts never reach the doors or the runners
        assert not graph[module] & {"doors", "livestages", "liveplan", "pipeline", "status"}, (module, graph[module])


def test_every_stage_kind_has_one_door_and_the_table_holds_classes() -> None:
    from qlift.release.doors import FILE_DOORS
    from qlift.release.kinds import TABLE, StageKind
    from qlift.release.livestages import LIVE_DOORS

    assert set(TABLE) == set(StageKind)
    assert not set(FILE_DOORS) & set(LIVE_DOORS) and set(FILE_DOORS) | set(LIVE_DOORS) == set(StageKind)
    for kind, row in TABLE.items():
        assert isinstance(row.options, type), kind
        assert row.live == (kind in LIVE_DOORS), kind
        assert not (row.makes_model and row.checks), kind  # an output is a model or a report, never both


def test_the_stage_table_imports_no_torch() -> None:
    code = ("import sys, qlift.release.kinds, qlift.release.spec; "
            "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_journaled_output_is_a_model_only_where_the_stage_makes_one(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from qlift.models import ref
    from qlift.release.outputs import EvalOutput, ModelOutput, journaled_output

    hashed: list[Path] = []
    real = ref.dir_hash
    monkeypatch.setattr(ref, "dir_hash", lambda path, memo=None: hashed.append(Path(path)) or real(path, memo))
    report = tmp_path / "eval-0123"
    report.mkdir()
    (report / "report.md").write_text("passed\n", encoding="utf-8")

    output = EvalOutput.of(report)
    assert journaled_output(report, output.content_hash, makes_model=False) == output
    model = journaled_output(tmp_path / "merge-0123", "sha256:1", makes_model=True)
    assert isinstance(model, ModelOutput) and model.ref.content_hash == "sha256:1" and model.ref.adapters == ()
    assert hashed == []  # neither is hashed as a model
    (report / "report.md").write_text("failed\n", encoding="utf-8")
    assert EvalOutput.of(report).content_hash != output.content_hash  # the report's own files are its identity
