"""Every stage's ``run(inputs, options)`` is the one door its CLI command and ``qlift release`` go through (#22,
#31): each test calls the command or the release with a spy in place of the stage package's ``run`` (``start``
for the long-running serve and router, whose ``run`` is ``start`` held in the foreground)."""

from __future__ import annotations

import functools
import importlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from qlift.errors import QliftError
from qlift.models.ref import ModelRef

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "examples" / "prompts" / "smoke.jsonl"


class Reached(QliftError):
    """What a spy that stops at the door raises: the command got as far as the stage's run."""


@dataclass
class Spy:
    """Stands in for ``package.name``: records each call, then ``then`` (call through, a typed result, or stop)."""

    then: Callable[..., Any]
    calls: list[tuple[Any, Any, dict[str, Any]]] = field(default_factory=list)

    def __call__(self, inputs: Any, options: Any, **kw: Any) -> Any:
        self.calls.append((inputs, options, kw))
        return self.then(inputs, options, **kw)


def _stop(inputs: Any, options: Any, **kw: Any) -> Any:
    raise Reached("reached the stage's run")


def _spy(monkeypatch: pytest.MonkeyPatch, package: str, name: str = "run",
         then: Callable[..., Any] | None = None) -> Spy:
    """Put a spy in place of ``package.name``; ``then(real, inputs, options, **kw)`` runs after it records
    (None: stop there, raising Reached)."""
    pkg = importlib.import_module(package)
    spy = Spy(_stop if then is None else functools.partial(then, getattr(pkg, name)))
    monkeypatch.setattr(pkg, name, spy)
    return spy


# command line -> (package, its entry point, inputs class, options class)
COMMANDS: list[tuple[list[str], str, str, str, str]] = [
    (["download", "org/model", "-o", "{tmp}/dl"], "qlift.hub", "run", "DownloadInputs", "DownloadOptions"),
    (["merge", "{base}", "{adapter}", "-o", "{tmp}/merged"], "qlift.merge", "run", "MergeInputs", "MergeOptions"),
    (["quantize", "{base}", "--fp8", "-o", "{tmp}/q"], "qlift.quantize", "run", "QuantizeInputs", "QuantizeOptions"),
    (["eval", "{base}", "--prompts", str(SMOKE)], "qlift.eval", "run", "EvalInputs", "EvalOptions"),
    (["serve", "{base}", "--recipe", "cpu", "--port", "0"], "qlift.serve", "run", "ServeInputs", "ServeOptions"),
    (["bench", "--endpoint", "http://127.0.0.1:9", "--model", "m"], "qlift.perf", "run", "BenchInputs",
     "BenchOptions"),
    (["batch", "{base}", str(SMOKE), "-o", "{tmp}/out.jsonl"], "qlift.perf", "run", "BatchInputs", "BatchOptions"),
    (["tune", "{base}", "--recipe", "cpu", "--grid", "max_num_seqs=4,8", "-o", "{tmp}/tune"], "qlift.perf", "run",
     "TuneInputs", "TuneOptions"),
    (["router", "--backend", "stable=http://127.0.0.1:9"], "qlift.router", "run", "RouterInputs", "RouterConfig"),
    (["promote", "start", "--router", "http://127.0.0.1:9", "--stable", "a", "--canary", "b", "--journal",
      "{tmp}/j.sqlite"], "qlift.rollout", "run", "RolloutInputs", "RolloutSpec"),
    (["deploy", "k8s", "{base}", "--recipe", "cpu", "-o", "{tmp}/k8s"], "qlift.deploy", "run", "DeployInputs",
     "DeployOptions"),
]


@pytest.mark.parametrize(("argv", "package", "name", "inputs", "options"), COMMANDS,
                         ids=[" ".join(c[0][:2]) if c[0][0] in ("promote", "deploy") else c[0][0] for c in COMMANDS])
def test_each_command_goes_through_its_stage_run(run_cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 tiny_qwen2_tied: Path, tiny_lora_tied: Path, argv: list[str],
                                                 package: str, name: str, inputs: str, options: str) -> None:
    spy = _spy(monkeypatch, package, name)
    args = [a.format(tmp=tmp_path, base=tiny_qwen2_tied, adapter=tiny_lora_tied) for a in argv]
    r = run_cli(*args)
    assert r.exit_code == 1 and "reached the stage's run" in r.stderr, (r.exit_code, r.stderr)
    [(given_inputs, given_options, _)] = spy.calls
    pkg = importlib.import_module(package)
    assert type(given_inputs).__name__ == inputs and isinstance(given_inputs, getattr(pkg, inputs))
    assert type(given_options).__name__ == options and isinstance(given_options, getattr(pkg, options))


@dataclass
class _Handle:
    """A started server as the release holds it: its pid, URL and stop (no vLLM here)."""

    pid: int
    base_url: str
    stopped: bool = False

    def stop(self) -> None:
        self.stopped = True


def test_the_release_goes_through_each_stage_run(run_cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 tiny_qwen2_tied: Path, tiny_lora_tied: Path) -> None:
    """merge runs for real (tiny), quantize copies its input, eval passes without generating, the servers are
    handles without vLLM, the router is a real one in front of them, and promote stops at its door."""
    import os

    from qlift.eval.generation import CacheStats, EvalModel, Sampling
    from qlift.eval.run import EvalResult
    from qlift.quantize.api import QuantizeResult

    def copy_model(real: Any, inputs: Any, options: Any, **kw: Any) -> QuantizeResult:
        shutil.copytree(inputs.model.base, inputs.output)
        return QuantizeResult(str(inputs.output), options.method, "FP8_DYNAMIC", "float-quantized", "cpu", None,
                              None, None, None, [], [], 0, 0, 0.0, "-", "-", False, "")

    def passing_report(real: Any, inputs: Any, options: Any, **kw: Any) -> EvalResult:
        options.report_dir.mkdir(parents=True)
        (options.report_dir / "report.md").write_text("passed\n")
        candidate = EvalModel("candidate", str(inputs.candidate.base), ref=inputs.candidate)
        return EvalResult(candidate, None, str(options.prompts), 0, "-", Sampling(),
                          [], [], {}, [], True, [], CacheStats(), {})

    handles: list[_Handle] = []
    routers: list[Any] = []

    def real_router(real: Any, inputs: Any, options: Any, **kw: Any) -> Any:
        routers.append(real(inputs, options, **kw))
        return routers[-1]

    def serve_handle(real: Any, inputs: Any, options: Any, **kw: Any) -> _Handle:
        kw["on_started"](os.getpid())
        handles.append(_Handle(os.getpid(), "http://127.0.0.1:9/v1"))
        return handles[-1]

    spies = {"merge": _spy(monkeypatch, "qlift.merge", then=lambda real, i, o, **kw: real(i, o)),
             "quantize": _spy(monkeypatch, "qlift.quantize", then=copy_model),
             "eval": _spy(monkeypatch, "qlift.eval", then=passing_report),
             "serve": _spy(monkeypatch, "qlift.serve", "start", then=serve_handle),
             "router": _spy(monkeypatch, "qlift.router", "start", then=real_router),
             "promote": _spy(monkeypatch, "qlift.rollout")}
    evaluate = {"prompts": str(SMOKE), "baseline": "base", "gates": ["exact_match >= 0"]}
    doc = {"name": "doors", "out": "out", "base": {"path": str(tiny_qwen2_tied)},
           "adapters": [{"name": "lora", "path": str(tiny_lora_tied)}],
           "stages": [{"stage": "merge", "options": {"verify": False}},
                      {"stage": "quantize", "options": {"method": "fp8"}},
                      {"stage": "eval", "options": evaluate},
                      {"stage": "serve", "name": "stable", "options": {"role": "stable", "recipe": "cpu"}},
                      {"stage": "serve", "name": "canary", "options": {"role": "candidate", "recipe": "cpu"}},
                      {"stage": "router", "options": {}},
                      {"stage": "promote", "options": {"steps": [100]}}]}
    f = tmp_path / "release.yaml"
    f.write_text(yaml.safe_dump(doc), encoding="utf-8")
    r = run_cli("release", "run", f, "--json")
    assert r.exit_code == 1 and "reached the stage's run" in r.stderr, r.stderr

    from qlift import eval as eval_stage
    from qlift import merge, quantize, rollout, router, serve

    kinds = {"merge": (merge.MergeInputs, merge.MergeOptions), "quantize": (quantize.QuantizeInputs,
             quantize.QuantizeOptions), "eval": (eval_stage.EvalInputs, eval_stage.EvalOptions),
             "serve": (serve.ServeInputs, serve.ServeOptions), "router": (router.RouterInputs, router.RouterConfig),
             "promote": (rollout.RolloutInputs, rollout.RolloutSpec)}
    for kind, (inputs_cls, options_cls) in kinds.items():
        calls = spies[kind].calls
        assert len(calls) == (2 if kind == "serve" else 1), (kind, calls)
        assert all(isinstance(i, inputs_cls) and isinstance(o, options_cls) for i, o, _ in calls), kind
    assert [h.stopped for h in handles] == [True, True]  # the release stopped what it started
    [(_, config, _)] = spies["router"].calls
    assert [(b.name, b.url, b.weight) for b in config.backends] == [("stable", "http://127.0.0.1:9", 100),
                                                                      ("canary", "http://127.0.0.1:9", 0)]
    # One identity, carried from stage to stage: each stage's model input is the ref the one before it made.
    [(merged_from, _, _)], [(quantized_from, _, _)] = spies["merge"].calls, spies["quantize"].calls
    [(evaluated, _, _)] = spies["eval"].calls
    served = {o.served_model_name: i.model for i, o, _ in spies["serve"].calls}
    assert isinstance(merged_from.base, ModelRef) and [a.path for a in merged_from.base.adapters] == [tiny_lora_tied]
    assert quantized_from.model.base.name.startswith("merge-")
    assert evaluated.candidate is served["qlift-candidate"] and evaluated.baseline is served["qlift-stable"]
    assert evaluated.candidate.base.name.startswith("quantize-")
    assert [b.model_hash for b in config.backends] == [served["qlift-stable"].content_hash,
                                                       evaluated.candidate.content_hash]
    assert not routers[0].running()  # a real router process, stopped when the release failed
    [(_, spec, _)] = spies["promote"].calls
    assert (spec.stable, spec.canary, spec.steps, spec.router) == ("stable", "canary", [100], routers[0].url)
    assert spec.canary_hash == evaluated.candidate.content_hash


def test_perf_run_refuses_a_mismatched_pair(tmp_path: Path) -> None:
    from qlift.errors import BadInputError
    from qlift.perf import BenchInputs, TuneOptions, run

    with pytest.raises(BadInputError, match="BenchInputs with TuneOptions"):
        run(BenchInputs("http://127.0.0.1:9", "m"), TuneOptions(recipe="cpu", grid=("max_num_seqs=4,8",)))  # type: ignore[call-overload]


def test_merge_then_deploy_through_run(tmp_path: Path, tiny_qwen2_tied: Path, tiny_lora_tied: Path) -> None:
    from qlift import deploy, merge
    from qlift.serialize import to_jsonable

    merged = tmp_path / "merged"
    m = merge.run(merge.MergeInputs(base=ModelRef.at(tiny_qwen2_tied), adapters=[tiny_lora_tied], output=merged),
                  merge.MergeOptions(verify=False))
    assert isinstance(m, merge.MergeResult) and m.output == merged and m.modified_tensors > 0
    assert (merged / "qlift.json").is_file()

    out = tmp_path / "k8s"
    d = deploy.run(deploy.DeployInputs(out), deploy.DeployOptions(model=merged, recipe="cpu"))
    assert isinstance(d, deploy.DeployResult) and d.objects
    assert sorted(p.name for p in out.iterdir()) == sorted([*d.objects, "kustomization.yaml", "qlift.json"])
    dumped = json.loads(json.dumps(to_jsonable(d)))  # the --json dump of the typed result, read back
    assert dumped == {"objects": d.objects, "versions": d.versions, "recipe": d.recipe, "engine_args": d.engine_args,
                      "image": d.image, "promote_spec": d.promote_spec,
                      "recipe_path": None if d.recipe_path is None else str(d.recipe_path), "out": str(out)}

    rendered = deploy.run(deploy.DeployInputs(), deploy.DeployOptions(model=merged, recipe="cpu"))
    assert rendered.objects == d.objects  # no output: render only
