"""What `promote start` checks on the live data plane before it writes any weight.

A rollout starts from one state: the stable has every user (the canary 0%) and no shadow runs. A second
`start` against a router a promotion left at the canary's 100% (from a fresh journal, say) would send 90% of
users back to the old model at its first step; one against a router another rollout is moving would fight
it. Both are refused, naming what the router serves and the command that fits (``--force`` starts anyway).
A resumed rollout must find the router at weights of its own journal (or back at the starting state, as a
restarted router without a state file comes back).

The canary must answer before any user is sent to it: its server lists the model the router asks it for.
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

from qlift.errors import BadInputError, ExternalToolError, QliftError
from qlift.rollout.dataplane import DataPlane, KnowsServers, ReportsDown, mirroring_now
from qlift.rollout.journal import Journal, Rollout
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.states import State
from qlift.vllm.client import NotAModelList, ServerRefused, ServerUnreachable, VllmClient

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0


def shares(weights: dict[str, int]) -> dict[str, float]:
    """Weights as shares of their sum (a Gateway API route's weights need not sum to 100)."""
    total = sum(weights.values())
    return {k: v / total for k, v in weights.items() if v} if total > 0 else {}


def shown(weights: dict[str, int]) -> str:
    return " / ".join(f"{k} {v}" for k, v in weights.items())


def _start_command(spec: RolloutSpec, journal: Path | None, stable: str, canary: str, *, new: bool,
                   spec_file: Path | None) -> str:
    """The `promote start` line with these roles; the spec file comes along (an nginx or Prometheus plane's
    settings live only there), with the roles swapped by the flags that override it."""
    argv = ["qlift", "promote", "start"]
    if spec_file is not None:
        argv += ["-f", str(spec_file)]
    if journal is not None:
        argv += ["--journal", str(journal)]
    if new:
        argv.append("--new")
    if spec.router:
        argv += ["--router", spec.router]
    argv += ["--stable", stable, "--canary", canary]
    return shlex.join(argv)


def check_start_state(plane: DataPlane, spec: RolloutSpec, journal: Journal, journal_arg: Path | None, *,
                      force: bool, spec_file: Path | None = None) -> None:
    """Refuse a new rollout unless the live plane is at the starting state: the stable 100%, no shadow."""
    live = plane.weights()
    shadow = mirroring_now(plane)
    problem, hint = None, None
    live_shares = shares(live) if live is not None else None
    latest = journal.latest()
    swap_needs_new = latest is not None and latest.state == State.PROMOTED
    if live_shares is not None and live_shares != {spec.stable: 1.0}:
        full = [k for k, v in live_shares.items() if v == 1.0]
        where = spec.router or spec.data_plane
        if full:
            top = full[0]
            problem = (f"the data plane ({where}) serves {top} at 100% (weights {shown(live or {})}), not the stable "
                       f"{spec.stable} a rollout of {spec.canary} starts from: its first step would send "
                       f"{100 - spec.steps[0] if spec.shadow is None else 100}% of users to {spec.stable}")
            if top == spec.canary:
                cmd = _start_command(spec, journal_arg, spec.canary, spec.stable, new=swap_needs_new,
                                     spec_file=spec_file)
                hint = (f"{top} was promoted: roll the next version out from it with the roles swapped, `{cmd}` "
                        "(docs/promote.md, after a promotion), or pass --force")
            else:
                cmd = _start_command(spec, journal_arg, top, spec.canary, new=swap_needs_new, spec_file=spec_file)
                hint = f"Roll out over the version users have, `{cmd}`, or pass --force"
        else:
            problem = (f"the data plane ({where}) splits users {shown(live or {})}, not 100% on the stable "
                       f"{spec.stable}: another rollout may be moving it (from another journal), or the weights "
                       "were set by hand")
            hint = ("Let that rollout finish or `qlift promote abort --journal ITS_JOURNAL` it, or pass --force to "
                    "start from these weights")
    elif shadow is not None:
        problem = (f"the router mirrors {shadow.percent:g}% of requests to {shadow.version} (a shadow phase of "
                   "another rollout?)")
        hint = "Let that rollout finish or `qlift promote abort --journal ITS_JOURNAL` it, or pass --force"
    if problem is None:
        return
    if force:
        log.warning("%s: starting anyway (--force)", problem)
        return
    raise BadInputError(problem, hint=hint)


def check_resume_state(plane: DataPlane, journal: Journal, r: Rollout, *, force: bool) -> None:
    """Refuse to resume ``r`` when the live weights are none its journal set (nor the starting state): someone
    or something else moved the plane since, and the controller would move it back without a word."""
    live = plane.weights()
    if live is None:
        return
    own = [c["weights"] for c in journal.history(r.id)["weight_changes"]] + [r.weights_for(0)]
    if any(shares(live) == shares(w) for w in own):
        return
    problem = (f"the data plane's weights are {shown(live)}, none that rollout {r.id} in {journal.path} set "
               f"(it last journaled {shown(own[-2] if len(own) > 1 else own[-1])}): another rollout or an operator "
               "moved them since")
    if force:
        log.warning("%s: resuming anyway (--force), the journal's weights go back", problem)
        return
    raise BadInputError(problem, hint="See what serves users now, then `qlift promote abort` this rollout, or "
                                      "pass --force to put the journal's weights back")


def probe_models(url: str) -> tuple[list[str] | None, str]:
    """The model ids a server lists at ``GET /v1/models``, or None and why it did not answer with a list."""
    try:
        ids = [m.id for m in VllmClient(url, timeout_s=PROBE_TIMEOUT_S).models()]
    except ServerUnreachable as exc:
        cause = exc.cause
        return None, f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
    except ServerRefused as exc:
        return None, f"HTTP {exc.status}"
    except NotAModelList:
        return None, "its answer is not a model list"
    return ids, "" if ids else "it lists no model"


def check_serves(url: str, model: str | None, *, what: str, router_view: str | None = None) -> None:
    """Refuse unless the server at ``url`` answers ``GET /v1/models`` listing ``model`` (any, when None)."""
    ids, why = probe_models(url)
    if ids and (model is None or model in ids):
        return
    base = url.partition("#")[0]
    seen = f"; the router reports it DOWN ({router_view})" if router_view else ""
    if not ids:
        message = f"{what} at {base} does not answer GET /v1/models ({why}){seen}"
    else:
        message = f"{what} at {base} does not list model {model!r} (it lists {', '.join(ids)}){seen}"
    raise ExternalToolError(message, tool="vllm", hint="Start (or fix) its server, then run the command again; "
                                                       "no weight was changed")


def check_canary_serves(plane: DataPlane, spec: RolloutSpec) -> None:
    """The canary's server answers and lists its model, before the first weight moves, where the plane knows
    its address (the router's backend, nginx's --backend URL); with the plane's own health view, where it has one."""
    address = plane.server(spec.canary) if isinstance(plane, KnowsServers) else None
    if address is None:
        return
    view = plane.down(spec.canary) if isinstance(plane, ReportsDown) else None
    if address.url is None:  # shown redacted (credentials): the plane's own view is all there is
        if view is not None:
            raise ExternalToolError(f"the router reports the canary {spec.canary} DOWN ({view})", tool="router",
                                    hint="Start (or fix) its server, then run the command again")
        return
    check_serves(address.url, address.model, what=f"the canary {spec.canary}", router_view=view)


def out_of_rotation(plane: DataPlane, version: str) -> str | None:
    """The router's reason for keeping ``version`` out of rotation now; None while it is in, or where the plane
    cannot tell (no health view, or unreachable: the reconcile loop deals with that)."""
    if not isinstance(plane, ReportsDown):
        return None
    try:
        why = plane.down(version)
    except (QliftError, KeyError):
        return None
    return None if why is None else str(why)
