"""Offline tool environments: a wheelhouse built for a target that already has some packages, an env
built from it with pip --no-index, and PYTHONPATH kept behind the env's own pins. Real pip, on wheels
this test writes itself (a few pure-Python packages of a few hundred bytes)."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from qlift.errors import BadInputError, ExternalToolError
from qlift.toolenv import ToolEnv, ToolEnvSpec, tool_environ
from qlift.wheelhouse import download_wheelhouse, expand_platforms, marker_environment, plan, read_have


def make_wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A real, installable pure-Python wheel: module ``name`` with ``__version__``."""
    mod, info = name.replace("-", "_"), f"{name.replace('-', '_')}-{version}.dist-info"
    files = {
        f"{mod}/__init__.py": f"__version__ = {version!r}\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
            name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def digest(text: str) -> str:
        raw = hashlib.sha256(text.encode()).digest()
        return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    files[f"{info}/RECORD"] = "".join(f"{f},{digest(t)},{len(t)}\n" for f, t in files.items()) + f"{info}/RECORD,,\n"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for arc, text in files.items():
            zf.writestr(arc, text)
    return path


@pytest.fixture
def offline_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    """No package index and no find-links from this machine's pip config: only what a test names."""
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)


def test_wheelhouse_for_a_target_leaves_out_what_it_has(tmp_path: Path, offline_pip: None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    index = tmp_path / "index"  # stands in for the package index
    make_wheel(index, "qp-tool", "1.0", ("qp-lib>=2.0", "qp-base"))
    for name, version in (("qp-lib", "1.0"), ("qp-lib", "2.0"), ("qp-base", "1.0"), ("qp-base", "1.5")):
        make_wheel(index, name, version)
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    have = tmp_path / "freeze.txt"
    have.write_text("# the target's pip freeze\nqp-base==1.0\nqp-lib==1.0\n-e git+https://example.invalid/x#egg=x\n")

    dest = tmp_path / "wh"
    result = download_wheelhouse(["qp-tool==1.0"], dest, python_version="3.12",
                                 platforms=["manylinux_2_28_x86_64"], have=read_have(have))
    # qp-lib 1.0 is too old for the tool: the target's versions could not all be kept, so it resolved
    # again; qp-base 1.0 fits and stays out.
    assert not result.constrained
    assert result.wheels == ["qp_lib-2.0-py3-none-any.whl", "qp_tool-1.0-py3-none-any.whl"]
    assert result.kept_from_target == {"qp-base": "1.0"}

    make_wheel(index, "qp-gpu", "1.0", ("torch>=2.10",))  # torch is never downloaded, even where the index has it
    make_wheel(index, "torch", "2.11.0")
    with pytest.raises(BadInputError, match="has no torch"):  # a --have list without torch
        download_wheelhouse(["qp-gpu"], tmp_path / "wh3", python_version="3.12", platforms=[], have={"qp-base": None})


def test_plan_keeps_what_fits_and_never_downloads_torch() -> None:
    def item(name: str, version: str, *requires: str) -> dict:
        return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}

    items = [item("qp-tool", "1.0", "qp-lib>=2.0", "torch>=2.10", "qp-win; sys_platform == 'win32'"),
             item("qp-lib", "2.1"), item("torch", "2.11.0+have"), item("qp-win", "1.0")]
    env = marker_environment("3.12", ["manylinux_2_28_x86_64"])
    have = {"qp-lib": "2.0", "torch": "2.11.0", "qp-win": "0.1"}  # qp-win's requirement is not for linux
    assert plan(items, ["qp-tool==1.0"], have, env) == (["qp-tool==1.0"], {"qp-lib": "2.0", "torch": "2.11.0",
                                                                             "qp-win": "0.1"})
    have = {"qp-lib": "1.0", "torch": "2.9.0"}
    with pytest.raises(BadInputError, match="has torch 2.9.0"):
        plan(items, ["qp-tool==1.0"], have, env)
    # The target's packages unknown (no --have): everything but torch's family
    assert plan(items, ["qp-tool==1.0"], None, env) == (["qp-tool==1.0", "qp-lib==2.1", "qp-win==1.0"],
                                                        {"torch": "assumed"})


def test_expand_platforms_and_read_have(tmp_path: Path) -> None:
    tags = expand_platforms(["manylinux_2_28_x86_64"])
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux2014_x86_64" in tags and "manylinux1_x86_64" in tags
    assert "manylinux_2_29_x86_64" not in tags and expand_platforms(["win_amd64"]) == ["win_amd64"]
    f = tmp_path / "have.txt"
    f.write_text("torch==2.11.0+cu130\nPyYAML\nqlift @ file:///src/qlift\n")
    assert read_have(f) == {"torch": "2.11.0", "pyyaml": None, "qlift": None}
    f.write_text("not a requirement!\n")
    with pytest.raises(BadInputError, match="cannot read the line"):
        read_have(f)


def test_env_from_wheelhouse_keeps_its_pins_ahead_of_pythonpath(tmp_path: Path, offline_pip: None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    wheelhouse = tmp_path / "wh"
    make_wheel(wheelhouse, "qp-pinned", "2.0", ("qp-extra",))
    # An older copy on PYTHONPATH (as vLLM's compressed-tensors 0.17 in /tmp/site on the GPU machine),
    # and a module found only there, which the env must still see.
    shadow = tmp_path / "pythonpath"
    with zipfile.ZipFile(make_wheel(tmp_path / "old", "qp-pinned", "1.0")) as zf:
        zf.extractall(shadow)
    (shadow / "only_on_pythonpath.py").write_text("X = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow))
    spec = ToolEnvSpec(name="offline", requirements=("qp-pinned==2.0",),
                       pinned={"qp_pinned": ("qp-pinned", "2.0")},
                       # a module from a source checkout on PYTHONPATH has no metadata (qlift on the GPU machine)
                       shared={"qlift": "qlift", "only_on_pythonpath": "only-on-pythonpath"})
    env = ToolEnv(spec, tmp_path / "envs")

    with pytest.raises(ExternalToolError) as err:  # qp-extra is missing: one line naming it
        env.ensure(wheelhouse=wheelhouse)
    assert "has no wheel of qp-extra" in err.value.message and "(needed by qp-pinned" in err.value.message
    assert "pip download --no-deps" in (err.value.hint or "") and not env.path.exists()

    make_wheel(wheelhouse, "qp-extra", "1.0")
    built = env.ensure(wheelhouse=wheelhouse)  # the health check fails if 1.0 from PYTHONPATH wins
    assert built.created
    state = json.loads((env.path / ".qlift-install-state.json").read_text())
    assert state["wheelhouse"] == str(wheelhouse.resolve())
    code = ("import qp_pinned, only_on_pythonpath, sys; "
            "print(qp_pinned.__version__, sys.path.index(sys.argv[1]) > sys.path.index(sys.argv[2]))")
    site = next((env.path / "lib").glob("python3*/site-packages"))
    out = subprocess.run([str(env.python), "-c", code, str(shadow), str(site)], env=tool_environ(),
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["2.0", "True"]


def test_env_quantize_wheelhouse_options_are_checked(run_cli, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QLIFT_CACHE_DIR", str(tmp_path / "cache"))
    r = run_cli("env", "quantize", "--wheelhouse", tmp_path)
    assert r.exit_code == 2 and "--wheelhouse goes with --setup" in r.stderr
    r = run_cli("env", "quantize", "--have", tmp_path / "freeze.txt")
    assert r.exit_code == 2 and "go with --download-wheelhouse" in r.stderr
    (tmp_path / "empty").mkdir()
    r = run_cli("env", "quantize", "--setup", "--wheelhouse", tmp_path / "empty")
    assert r.exit_code != 0 and "holds no .whl files" in r.stderr
    assert not (tmp_path / "cache" / "envs").exists() or not any((tmp_path / "cache" / "envs").iterdir())
