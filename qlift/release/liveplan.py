"""The live stages' plan and run: serve, router and promote, keyed and journaled together.

Each live stage is journaled ``running`` when it starts and ``done`` or ``failed`` when it ends,
so ``qlift release status`` shows how long each took and, for promote, where its rollout journal is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlift.errors import BadInputError, GateFailedError, QliftError
from qlift.models.ref import ModelRef
from qlift.release import live
from qlift.release.journal import StageStatus
from qlift.release.report import Action, StageReport, first_line, stage_key
from qlift.release.spec import RouterStageOptions, ServeStageOptions, Stage
from qlift.serialize import to_jsonable

if TYPE_CHECKING:
    from qlift.release.pipeline import Pipeline
    from qlift.rollout.states import State
    from qlift.router.config import RouterConfig
    from qlift.router.handle import RouterHandle
    from qlift.serve.handle import ServeHandle


def rollout_journal(out: Path, run_id: int) -> Path:
    """One rollout journal per run: a run killed mid-promote left a rollout whose servers and router
    are gone; the next run starts them again and rolls out from the first step."""
    return out / f"rollout-{run_id}.sqlite"


def rollout_state(result: dict[str, Any]) -> State | None:
    """The final state of the rollout a promote stage's journaled result holds (None: it failed before it began)."""
    from qlift.rollout.states import State

    return State(result["state"]) if "state" in result else None


@dataclass
class LivePlan:
    stages: list[Stage]
    models: dict[str, ModelRef]  # serve stage -> the model it serves
    keys: dict[str, str]
    notes: dict[str, str]
    eval_report: Path | None

    @classmethod
    def of(cls, p: Pipeline, stages: list[Stage]) -> LivePlan:
        models: dict[str, ModelRef] = {}
        keys: dict[str, str] = {}
        notes: dict[str, str] = {}
        for s in stages:
            if not isinstance(s.options, ServeStageOptions):
                continue
            if s.options.url:
                from qlift.rollout.evalgate import served_model_dir

                served = served_model_dir(s.options.url)
                ref = ModelRef.of(served) if served is not None else p.models[s.input]
                notes[s.name] = f"a running server: {s.options.url}"
            else:
                name, notes[s.name] = p.choices[s.name]
                ref = p.models[name]
            models[s.name] = ref
            keys[s.name] = stage_key("serve", s.options, {"model": ref.content_hash})
        candidate = next(m for s, m in models.items() if _role(p.release.stage(s)) == "candidate")
        evals = [e for e in p.evals.values() if e.candidate == candidate.content_hash]
        if p.evals and not evals:
            raise BadInputError(f"no eval stage evaluated the model the candidate serves ({candidate.base})",
                                path=p.release.file, field="stages",
                                hint="Add an eval stage whose input is that model, so promote can check its gates.")
        eval_report = evals[-1].report if evals else None
        serve_keys = sorted(keys.values())
        for s in stages:
            if s.kind == "router":
                keys[s.name] = stage_key("router", s.options, {"servers": serve_keys})
            elif s.kind == "promote":
                inputs = {"servers": serve_keys, "eval": evals[-1].key if evals else None,
                          "load": to_jsonable(s.load)}
                keys[s.name] = stage_key("promote", s.options, inputs)
        return cls(stages, models, keys, notes, eval_report)

    def run(self, p: Pipeline) -> None:
        out = p.release.out
        procs = live.Processes(p.journal, p.run_id)
        urls: dict[str, str] = {}
        router_url = ""
        token = live.new_router_token()
        try:
            for s in self.stages:
                t0 = time.monotonic()
                key = self.keys[s.name]
                p.journal.begin(s.name, key, "")
                result: dict[str, Any]
                if isinstance(s.options, ServeStageOptions):
                    o = s.options
                    model = self.models[s.name]
                    if o.url:
                        urls[o.role] = o.url
                        result = {"url": o.url, "started": False}
                    else:
                        server = procs.start(s.name, self._serve(model, o), lambda h: h.base_url,
                                             keep=o.keep_running)
                        urls[o.role] = server.base_url
                        result = {"url": urls[o.role], "started": True, "pid": server.pid}
                    result |= {"model": str(model.base), "content_hash": model.content_hash, "role": o.role}
                elif isinstance(s.options, RouterStageOptions):
                    o_router = s.options
                    if o_router.url:
                        router_url, result = o_router.url, {"url": o_router.url, "started": False}
                    else:
                        backends = {"stable": urls["stable"], "canary": urls["candidate"]}
                        router = procs.start(s.name, self._router(live.router_config(o_router, backends), token,
                                                                  out / "logs" / f"{s.name}.log"),
                                             lambda h: h.url, keep=o_router.keep_running)
                        router_url = router.url
                        result = {"url": router_url, "started": True, "public_model": o_router.public_model}
                else:
                    result = self._promote(p, s, router_url, token if any(
                        isinstance(x.options, RouterStageOptions) and not x.options.url for x in self.stages) else None)
                p.journal.end(s.name, key, StageStatus.DONE, result=result)
                p._report(StageReport(s.name, s.kind, Action.RAN, self.notes.get(s.name, ""), key,
                                      seconds=round(time.monotonic() - t0, 2), result=result))
        except BaseException as exc:
            row = p.journal.stage(s.name, key)
            if row is not None and row.status is StageStatus.RUNNING:  # promote journals its failure with its result
                p.journal.end(s.name, key, StageStatus.FAILED, result={"error": first_line(exc)})
            if isinstance(exc, QliftError | KeyboardInterrupt):
                p._report(StageReport(s.name, s.kind, Action.FAILED, first_line(exc), key,
                                      seconds=round(time.monotonic() - t0, 2)))
            raise
        finally:
            procs.stop()

    @staticmethod
    def _serve(model: ModelRef, o: ServeStageOptions) -> Callable[[Callable[[int], None]], ServeHandle]:
        from qlift import serve

        inputs, options = live.serve_request(model.base, o)
        return lambda started: serve.start(inputs, options, keep=o.keep_running, on_started=started)

    @staticmethod
    def _router(config: RouterConfig, token: str, log: Path) -> Callable[[Callable[[int], None]], RouterHandle]:
        from qlift import router

        return lambda started: router.start(router.RouterInputs(token), config, log_path=log, on_started=started)

    def _promote(self, p: Pipeline, s: Stage, router_url: str, token: str | None) -> dict[str, Any]:
        from qlift.rollout.api import raise_for_outcome, status
        from qlift.rollout.spec import RolloutSpec

        candidate = next(m for n, m in self.models.items() if _role(p.release.stage(n)) == "candidate")
        data = {**s.opts(RolloutSpec).model_dump(exclude_unset=True), "stable": "stable", "canary": "canary",
                "router": router_url, "canary_model": str(candidate.base), "canary_hash": candidate.content_hash}
        if self.eval_report is not None:
            data["eval_report"] = str(self.eval_report)
        spec = RolloutSpec.model_validate(data)
        journal = rollout_journal(p.release.out, p.run_id)
        if s.load is not None:
            public = next((x.options.public_model for x in self.stages if isinstance(x.options, RouterStageOptions)),
                          "release")
            with live.Traffic(router_url, public, s.load) as traffic:
                final = live.promote(spec, journal, token)
            sent = sum(traffic.status.values())
            load = {"sent": sent, "failed": sent - traffic.status[200],
                    "statuses": {str(k): n for k, n in traffic.status.items()}}
            p.echo(f"{s.name}: {sent} requests through the router, {load['failed']} failed")
        else:
            final, load = live.promote(spec, journal, token), None
        result = {"state": final.state, "reason": final.reason, "journal": str(journal),
                  **({"traffic": load} if load else {}), "rollout": status(journal)}
        try:
            raise_for_outcome(final)
        except GateFailedError:
            p.journal.end(s.name, self.keys[s.name], StageStatus.FAILED, result=result)
            raise
        return result


def _role(stage: Stage) -> str:
    return stage.opts(ServeStageOptions).role
