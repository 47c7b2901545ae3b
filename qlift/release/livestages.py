"""What each live stage kind does in the release's live plan, as the stage table names it: what its key is made
of, and how it starts (serve: ``qlift.serve.start``; router: ``qlift.router.start``; promote: ``qlift.rollout.run``,
with chat traffic through the router where the file asks for it).

A ``key_inputs`` function gets the plan being made (the servers' keys are known before the router's and
promote's); a ``start`` function gets the run so far (the servers' URLs, the router's) and returns what the
journal keeps of the stage. ``LIVE_DOORS`` is keyed by the stage table's kinds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from pydantic import JsonValue

from qlift.errors import GateFailedError
from qlift.models.ref import ModelRef
from qlift.release import live
from qlift.release.journal import StageStatus
from qlift.release.kinds import StageKind
from qlift.release.livecontext import LivePlan, LiveRun, rollout_journal
from qlift.release.spec import RouterStageOptions, ServeStageOptions, Stage
from qlift.release.stage_options import CANARY, STABLE
from qlift.rollout.spec import PromoteOptions
from qlift.serialize import to_jsonable

if TYPE_CHECKING:
    from pathlib import Path

    from qlift.rollout.train import NextVersion
    from qlift.router.config import RouterConfig
    from qlift.router.handle import RouterHandle
    from qlift.serve.handle import ServeHandle


def serve_key(plan: LivePlan, stage: Stage) -> dict[str, JsonValue]:
    """The model it serves: a running server's own where its admin answers, else the one the pipeline chose
    for this machine (its input, or its fallback where vLLM cannot run the input here)."""
    o = stage.opts(ServeStageOptions)
    if o.url:
        from qlift.rollout.evalgate import served_model_dir

        served = served_model_dir(o.url)
        ref = ModelRef.of(served) if served is not None else plan.made[stage.input]
        problem = live.server_problem(o.url)  # said in the plan; the run stops there (liveplan._check_urls)
        plan.notes[stage.name] = f"a running server: {o.url}" if problem is None else \
            f"{problem}: the run stops here unless a server answers there first"
    else:
        name, plan.notes[stage.name] = plan.choices[stage.name]
        ref = plan.made[name]
    plan.models[stage.name] = ref
    return {"model": ref.content_hash}


def start_serve(run: LiveRun, stage: Stage) -> dict[str, JsonValue]:
    """Start its server in the background (journaled by pid), or take the running one its url names."""
    o, model = stage.opts(ServeStageOptions), run.plan.models[stage.name]
    run.hashes[o.role] = model.content_hash
    if o.url:
        run.urls[o.role] = o.url
        result: dict[str, JsonValue] = {"url": o.url, "started": False}
    else:
        server = run.procs.start(stage.name, _serve(model, o), lambda h: h.base_url, keep=o.keep_running)
        run.urls[o.role] = server.base_url
        result = {"url": server.base_url, "started": True, "pid": server.pid}
    return result | {"model": str(model.base), "content_hash": model.content_hash, "role": o.role}


def _serve(model: ModelRef, o: ServeStageOptions) -> Callable[[Callable[[int], None]], ServeHandle]:
    from qlift import serve

    inputs, options = live.serve_request(model, o)
    return lambda started: serve.start(inputs, options, keep=o.keep_running, on_started=started)


def router_key(plan: LivePlan, stage: Stage) -> dict[str, JsonValue]:
    o = stage.opts(RouterStageOptions)
    if o.url:
        problem = live.router_problem(o.url)
        plan.notes[stage.name] = f"a running router: {o.url}" if problem is None else \
            f"{problem}: the run stops here unless a router answers there first"
    servers: list[JsonValue] = [*plan.serve_keys()]
    return {"servers": servers}


def start_router(run: LiveRun, stage: Stage) -> dict[str, JsonValue]:
    """Start the router in front of the stable and candidate servers (all traffic on stable), or take the
    running one its url names."""
    o = stage.opts(RouterStageOptions)
    run.public_model = o.public_model
    if o.url:
        run.router_url = o.url
        return {"url": o.url, "started": False}
    config = live.router_config(o, {STABLE: run.urls["stable"], CANARY: run.urls["candidate"]}, stage=stage.name,
                                model_hashes={STABLE: run.hashes["stable"], CANARY: run.hashes["candidate"]})
    log = run.plan.release.out / "logs" / f"{stage.name}.log"
    router = run.procs.start(stage.name, _router(config, run.token, log), lambda h: h.url, keep=o.keep_running)
    run.router_url, run.router_started = router.url, True
    return {"url": router.url, "started": True, "public_model": o.public_model}


def _router(config: RouterConfig, token: str, log: Path) -> Callable[[Callable[[int], None]], RouterHandle]:
    from qlift import router

    return lambda started: router.start(router.RouterInputs(token), config, log_path=log, on_started=started)


def promote_key(plan: LivePlan, stage: Stage) -> dict[str, JsonValue]:
    """The servers, the candidate's eval, the load, the router it drives (its key holds its options) and the next
    version it adds to that router (``next:``): a router changed, or the next release, runs promote again."""
    routers: list[JsonValue] = [plan.keys[s.name] for s in plan.stages if isinstance(s.options, RouterStageOptions)]
    servers: list[JsonValue] = [*plan.serve_keys()]
    key: dict[str, JsonValue] = {"servers": servers, "eval": plan.eval_key, "load": to_jsonable(stage.load),
                                 "router": routers}
    return key | ({"next": stage.next} if stage.next is not None else {})


def next_version(run: LiveRun, stage: Stage) -> NextVersion:
    """The version a ``next:`` promote adds to the router: NAME=URL[#MODEL] as written, or NAME at the candidate
    serve stage's server, pinned to the model it serves (a running server's: the one it lists first, unless the
    stage names it)."""
    from qlift.rollout.train import NextVersion, parse_next

    assert stage.next is not None
    if stage.next_url:
        return parse_next(stage.next)
    o = next(s.opts(ServeStageOptions) for s in run.plan.stages
             if isinstance(s.options, ServeStageOptions) and s.options.role == "candidate")
    model = o.served_model_name or (None if o.url else f"qlift-{o.role}")  # as live.serve_request names it
    return NextVersion(stage.next, run.urls["candidate"].rstrip("/").removesuffix("/v1"), model)


def run_promote(run: LiveRun, stage: Stage) -> dict[str, JsonValue]:
    """The rollout of the candidate through the router, judged against the eval stage's report, with the file's
    chat traffic through the router while it runs; a rollout that does not promote raises GateFailedError
    after its result is journaled."""
    from qlift.rollout import train
    from qlift.rollout.api import raise_for_outcome, status

    plan = run.plan
    candidate = plan.candidate()
    assert candidate is not None or stage.next_url, "a promote stage follows a router, which needs a candidate"
    token = run.router_token()
    nxt = next_version(run, stage) if stage.next is not None else None
    stable, canary = (STABLE, CANARY) if nxt is None else \
        (train.stable_for(run.router_url, nxt.name, token, flag="next:"), nxt.name)
    spec = stage.opts(PromoteOptions).rollout_spec(
        stable=stable, canary=canary, router=run.router_url, eval_report=plan.eval_report,
        **({"canary_model": candidate.base, "canary_hash": candidate.content_hash} if candidate else {}))
    journal = rollout_journal(plan.release.out, run.run_id)
    if stage.load is not None:
        with live.Traffic(run.router_url, run.public_model, stage.load) as traffic:
            traffic.wait_measurable()  # the window-sizing check sees the load's own rate
            final = live.promote(spec, journal, token, nxt)
        load: dict[str, JsonValue] | None = traffic.summary()
        run.echo(f"{stage.name}: {traffic.sent} requests through the router, {traffic.failed} failed")
    else:
        final, load = live.promote(spec, journal, token, nxt), None
    result: dict[str, JsonValue] = {"state": final.state, "reason": final.reason, "journal": str(journal),
                                    **({"traffic": load} if load else {}), "rollout": status(journal)}
    try:
        raise_for_outcome(final, journal)
    except GateFailedError:
        run.journal.end(stage.name, plan.keys[stage.name], StageStatus.FAILED, result=result)
        raise
    return result


@dataclass(frozen=True)
class LiveDoor:
    """How a live stage runs in the release's live plan: what its key is made of (given the plan so far: the
    servers are keyed before the rest) and ``start``, which starts it (or runs it to its end) and returns what
    the journal keeps of it."""

    key_inputs: Callable[[LivePlan, Stage], dict[str, JsonValue]]
    start: Callable[[LiveRun, Stage], dict[str, JsonValue]]


LIVE_DOORS: Mapping[StageKind, LiveDoor] = MappingProxyType({
    StageKind.SERVE: LiveDoor(serve_key, start_serve),
    StageKind.ROUTER: LiveDoor(router_key, start_router),
    StageKind.PROMOTE: LiveDoor(promote_key, run_promote),
})
