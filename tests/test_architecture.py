"""The shape of the house, read from the code (issue #53): packages import only those below them, the rollout's
state is written at one site, SQL lives in the journal modules, and data planes are told apart by their table,
never by name."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

QLIFT = Path(__file__).resolve().parent.parent / "qlift"

# Lower first; a package may import those of its own rank or below (and never one that imports it back).
LAYERS = [("models", "vllm", "gates"), ("quality",), ("hub", "merge"), ("serve",), ("quantize", "perf"), ("eval",),
          ("router",), ("rollout",), ("deploy", "release"), ("cli",)]
RANK = {pkg: i for i, names in enumerate(LAYERS) for pkg in names}

JOURNAL_MODULES = {"rollout/journal.py", "rollout/journal_file.py", "rollout/adapter_journal.py",
                   "release/journal.py", "schema_version.py"}
PLANE_NAMES = {"builtin", "nginx", "gateway-api", "inference-ext"}


def modules() -> Iterator[tuple[str, ast.Module]]:
    for f in sorted(QLIFT.rglob("*.py")):
        yield f.relative_to(QLIFT).as_posix(), ast.parse(f.read_text(), str(f))


def package_imports() -> set[tuple[str, str, str]]:
    """(from package, to package, where) for every import between two packages, function-local ones included."""
    out = set()
    for rel, tree in modules():
        if "/" not in rel:
            continue
        src = rel.split("/")[0]
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            for name in names:
                parts = name.split(".")
                if parts[0] == "qlift" and len(parts) > 1 and (QLIFT / parts[1]).is_dir() and parts[1] != src:
                    out.add((src, parts[1], f"{rel}:{node.lineno}"))
    return out


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in QLIFT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(RANK), f"give these packages a layer in LAYERS: {sorted(packages - set(RANK))}"


def test_no_package_imports_one_above_it() -> None:
    up = sorted(f"{src} -> {dst} ({where})" for src, dst, where in package_imports() if RANK[dst] > RANK[src])
    assert up == []


def test_no_two_packages_import_each_other() -> None:
    edges = {(src, dst) for src, dst, _ in package_imports()}
    assert sorted(e for e in edges if (e[1], e[0]) in edges) == []


def calls(tree: ast.Module, attr: str) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attr:
            yield node


def test_sql_lives_in_the_journal_modules() -> None:
    outside = []
    for rel, tree in modules():
        for call in [*calls(tree, "execute"), *calls(tree, "executemany"), *calls(tree, "executescript")]:
            first = call.args[0] if call.args else None
            if isinstance(first, ast.Constant | ast.JoinedStr) and rel not in JOURNAL_MODULES:
                outside.append(f"{rel}:{call.lineno}")
    assert outside == []


def test_a_rollouts_state_is_written_at_one_site() -> None:
    sites = sorted({rel for rel, tree in modules() for _ in calls(tree, "transition")})
    assert sites == ["rollout/persist.py"]


def test_no_branch_on_a_plane_name_outside_the_table() -> None:
    branches = []
    for rel, tree in modules():
        if rel == "rollout/planes.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                sides = (node.left, *node.comparators)
                names = {c.value for c in sides if isinstance(c, ast.Constant) and isinstance(c.value, str)}
                about_planes = any("plane" in ast.unparse(c) for c in sides if not isinstance(c, ast.Constant))
                if names & PLANE_NAMES and about_planes:  # ("builtin" is also an evidence provider's name)
                    branches.append(f"{rel}:{node.lineno}")
    assert branches == []


HTTPX_CALLS = {"get", "post", "put", "delete", "request", "stream", "Client", "AsyncClient"}


def test_http_calls_share_one_tls_context() -> None:
    """httpx builds an SSL context for each client and each module-level call (~20 ms of CPU): qlift calls through
    qlift.httpclient, which passes the one it built (tests/test_httpclient.py)."""
    bare = [f"{rel}:{node.lineno}" for rel, tree in modules() if rel != "httpclient.py" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in HTTPX_CALLS
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "httpx"]
    assert bare == []
