"""Every stage package has one entry point of one shape: ``run(inputs, options) -> Result`` (#22)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
from pathlib import Path

import pytest

# package -> (inputs class, options class, result classes): perf's run serves three stages, dispatching on options
STAGES = {
    "qlift.hub": ("DownloadInputs", "DownloadOptions", ["DownloadResult"]),
    "qlift.merge": ("MergeInputs", "MergeOptions", ["MergeResult"]),
    "qlift.quantize": ("QuantizeInputs", "QuantizeOptions", ["QuantizeResult"]),
    "qlift.eval": ("EvalInputs", "EvalOptions", ["EvalResult"]),
    "qlift.serve": ("ServeInputs", "ServeOptions", ["ServeOutcome"]),
    "qlift.perf": ("BenchInputs | BatchInputs | TuneInputs", "BenchOptions | BatchOptions | TuneOptions",
                   ["BenchResult", "BatchResult", "TuneResult"]),
    "qlift.router": ("RouterInputs", "RouterConfig", ["RouterResult"]),
    "qlift.rollout": ("RolloutInputs", "RolloutSpec", ["Rollout"]),
    "qlift.deploy": ("DeployInputs", "DeployOptions", ["DeployResult"]),
}
ALIASES = {"PerfInputs": "BenchInputs | BatchInputs | TuneInputs",
           "PerfOptions": "BenchOptions | BatchOptions | TuneOptions"}


def _names(annotation: str) -> list[str]:
    return [n.strip() for n in ALIASES.get(annotation, annotation).split("|")]


@pytest.mark.parametrize("package", sorted(STAGES))
def test_run_is_the_stage_entry_point(package: str) -> None:
    pkg = importlib.import_module(package)
    inputs, options, results = STAGES[package]
    assert "run" in pkg.__all__
    run = pkg.run
    assert inspect.isfunction(run) and run.__module__ == f"{package}.run"
    sig = inspect.signature(run)
    assert list(sig.parameters) == ["inputs", "options"]
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in sig.parameters.values())
    assert _names(sig.parameters["inputs"].annotation) == _names(inputs)
    assert _names(sig.parameters["options"].annotation) == _names(options)
    assert sorted(_names(sig.return_annotation)) == sorted(results)
    module = importlib.import_module(f"{package}.run")
    for name in _names(inputs):
        cls = getattr(pkg, name)  # exported by the package
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    for name in _names(options):
        assert inspect.isclass(getattr(module, name, None) or getattr(pkg, name))
    for name in results:  # a typed result: a dataclass, whose dump is what --json prints
        cls = getattr(pkg, name, None) or _result_class(package, name)
        assert dataclasses.is_dataclass(cls), name


def _result_class(package: str, name: str) -> type:
    homes = {"Rollout": "qlift.rollout.journal"}
    return getattr(importlib.import_module(homes[name]), name)  # type: ignore[no-any-return]


def test_perf_run_refuses_a_mismatched_pair(tmp_path: Path) -> None:
    from qlift.errors import BadInputError
    from qlift.perf import BenchInputs, TuneOptions, run

    with pytest.raises(BadInputError, match="BenchInputs with TuneOptions"):
        run(BenchInputs("http://127.0.0.1:9", "m"), TuneOptions(recipe="cpu", grid=("max_num_seqs=4,8",)))  # type: ignore[call-overload]


def test_merge_then_deploy_through_run(tmp_path: Path, tiny_qwen2_tied: Path, tiny_lora_tied: Path) -> None:
    from qlift import deploy, merge
    from qlift.serialize import to_jsonable

    merged = tmp_path / "merged"
    m = merge.run(merge.MergeInputs(base=tiny_qwen2_tied, adapters=[tiny_lora_tied], output=merged),
                  merge.MergeOptions(verify=False))
    assert isinstance(m, merge.MergeResult) and m.output == merged and m.modified_tensors > 0
    assert (merged / "qlift.json").is_file()

    out = tmp_path / "k8s"
    d = deploy.run(deploy.DeployInputs(out), deploy.DeployOptions(model=merged, recipe="cpu"))
    assert isinstance(d, deploy.DeployResult) and d.objects
    assert sorted(p.name for p in out.iterdir()) == sorted([*d.objects, "kustomization.yaml", "qlift.json"])
    assert json.dumps(to_jsonable(d))  # the --json dump of the typed result

    rendered = deploy.run(deploy.DeployInputs(), deploy.DeployOptions(model=merged, recipe="cpu"))
    assert rendered.objects == d.objects  # no output: render only
