"""What `promote start` checks on the live data plane before it writes any weight.

A rollout starts from one state: the stable has every user (the canary 0%) and no shadow runs. A second
`start` against a router a promotion left at the canary's 100% (from a fresh journal, say) would send 90% of
users back to the old model at its first step; one against a router another rollout is moving would fight
it. Both are refused, naming what the router serves and the command that fits (``--force`` starts anyway).
A resumed rollout must find the router at weights of its own journal (or back at the starting state, as a
restarted router without a state file comes back).

The canary must answer before any user is sent to it: its server lists the model the router asks it for.

A new rollout's windows must be able to reach their minimum at the traffic the router serves now (traffic.py's
one rule, weight x requests/s x interval >= min_requests; a fleet's traffic is the sum of its routers'): one that
cannot would hold, then pause, so it is refused up front (``--allow-small-windows`` starts anyway); a router with
no traffic yet only gets a warning.
"""

from __future__ import annotations

import logging
import shlex
import time
from pathlib import Path

from qlift.errors import BadInputError, ExternalToolError, QliftError
from qlift.fsutil import lock_holder
from qlift.rollout.dataplane import DataPlane, KnowsServers, ReportsDown, mirroring_now
from qlift.rollout.fleet import RouterFleet, not_answering
from qlift.rollout.journal import Journal, Rollout, default_journal
from qlift.rollout.spec import RolloutSpec, flag_name
from qlift.rollout.states import State
from qlift.rollout.traffic import PlannedWindow, forecast
from qlift.rollout.windows import WindowPolicies
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
    for url in dict.fromkeys([*([spec.router] if spec.router else []), *(
            spec.routers if isinstance(spec.routers, list) else [])]):
        argv += ["--router", url]
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
            hint = _other_rollout_hint(journal.path)
    elif shadow is not None:
        problem = (f"the router mirrors {shadow.percent:g}% of requests to {shadow.version} (a shadow phase of "
                   "another rollout?)")
        hint = _other_rollout_hint(journal.path)
    if problem is None:
        return
    if force:
        log.warning("%s: starting anyway (--force)", problem)
        return
    raise BadInputError(problem, hint=hint)


def running_controllers(near: Path) -> list[tuple[Path, int]]:
    """(journal, pid) of each rollout controller running on this host with its journal beside ``near`` (not
    ``near`` itself) or in the default folder: who may be moving a router (a controller holds its journal's
    ``.controller.lock``)."""
    near = near.expanduser().absolute()
    found = []
    for folder in sorted({near.parent, default_journal().expanduser().absolute().parent}):
        for lock in sorted(folder.glob("*.controller.lock")):
            journal = lock.with_name(lock.name.removesuffix(".controller.lock"))
            pid = lock_holder(lock)
            if pid is not None and journal != near:
                found.append((journal, pid))
    return found


def _other_rollout_hint(journal: Path) -> str:
    """Where another rollout moves the router: its journal where a controller here runs one, else how to find it;
    never --force, which would run a second controller against the same router."""
    running = running_controllers(journal)
    if running:
        return "Let that rollout finish, or abort it: " + ", ".join(
            f"`qlift promote abort --journal {shlex.quote(str(path))}` (its controller, pid {pid}, runs it)"
            for path, pid in running)
    return ("Let that rollout finish, or abort it: `qlift promote abort --journal FILE` with the --journal FILE of "
            "the `qlift promote start` (or `resume`) process driving it (`ps -ef | grep 'qlift promote'` shows it; "
            "without --journal it is $QLIFT_HOME/rollouts/journal.sqlite); weights set by hand: set them back to "
            "100% stable with the router's admin API")


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


# -- window sizing ---------------------------------------------------------------------------------------------

RATE_LOOKBACKS_S = (60.0, 300.0)  # the busier of the router's last minute and last 5 minutes sizes the windows
RATE_RECORDS = 1000  # at most this many of its latest request records are read (their span bounds the rate)
# fewer requests than this, or over less time (a load that just started), in either: no rate to size by (a
# warning, never a refusal)
MIN_RATE_SAMPLE = 5
MIN_RATE_SPAN_S = 3.0


def planned_windows(spec: RolloutSpec) -> list[PlannedWindow]:
    """The windows of each kind with the canary's smallest share: the shadow phase's, the first step's (a step at
    100% is not judged) and the bake's."""
    policies = WindowPolicies.of(spec)
    min_requests = flag_name("analysis", "min_requests")
    out = []
    if policies.shadow is not None and spec.shadow is not None:
        out.append(PlannedWindow(f"the shadow phase ({spec.shadow.percent}% mirrored)", spec.shadow.percent / 100,
                                 policies.shadow.min_count, flag_name("shadow", "min_pairs"), "pairs",
                                 policies.shadow.max_holds + 1))
    if spec.steps[0] < 100:
        out.append(PlannedWindow(f"step 1 (canary {spec.steps[0]}%)", spec.steps[0] / 100, policies.step.min_count,
                                 min_requests, "requests", policies.step.max_holds + 1))
    if policies.bake is not None:
        out.append(PlannedWindow("the bake (canary 100%)", 1.0, policies.bake.min_count, min_requests, "requests",
                                 policies.bake.max_holds + 1))
    return out


def recent_rate(router: str, token: str | None) -> tuple[float, int, float] | None:
    """(requests/s, requests, seconds) the router served lately, counted as a window counts them (its request log,
    a client gone before the answer left out): the busier of its last minute and last 5 minutes (a load that
    just started is not diluted by an idle hour); None: fewer than ``MIN_RATE_SAMPLE`` requests over at least
    ``MIN_RATE_SPAN_S`` (or a full batch of ``RATE_RECORDS``) in either."""
    from qlift.router.client import RouterClient

    client = RouterClient(router, token)
    batch = client.requests(since=max(client.state().seq - RATE_RECORDS, 0))
    now = time.time()
    times = [r.time for r in batch.requests if not r.client_disconnected]
    # RATE_RECORDS read in under MIN_RATE_SPAN_S is a load too busy for the span guard, not one just begun
    full = len(batch.requests) >= RATE_RECORDS
    rates = []
    for lookback in RATE_LOOKBACKS_S:
        recent = [t for t in times if t >= now - lookback]
        span = now - min(recent, default=now)
        if len(recent) >= MIN_RATE_SAMPLE and (span >= MIN_RATE_SPAN_S or full) and span > 0:
            rates.append((len(recent) / span, len(recent), span))
    return max(rates, default=None)


def window_shortfall(spec: RolloutSpec, rps: float, traffic: str) -> str | None:
    """The one rule of window sizing: the line naming each window that cannot reach its minimum at ``rps``
    requests/s (``traffic`` says whose, e.g. "the router's traffic (N requests in its last Ss)"); None where
    every window can."""
    short = [cause for w in planned_windows(spec) if (cause := forecast(w, rps, spec.interval)) is not None]
    if not short:
        return None
    return f"the windows cannot reach their minimum at {traffic}: " + "; ".join(c.text for c in short)


def check_window_sizing(spec: RolloutSpec, router_token: str | None, *, allow_small: bool = False) -> None:
    """Refuse a new rollout whose windows cannot reach their minimum at the router's traffic now, even over the
    held windows --max-inconclusive allows (it would hold, then pause): one line with the interval and minimum
    that would; ``allow_small``: a warning. Where the router has no traffic yet, one warning. A fleet
    (``routers:``): the sum of its routers' traffic (each sees its share of the clients)."""
    fleet = RouterFleet.of(spec)
    if fleet is not None:
        _check_fleet_window_sizing(spec, fleet, router_token, allow_small=allow_small)
        return
    if not spec.router:
        return
    try:
        rate = recent_rate(spec.router, router_token)
    except QliftError as exc:  # the checks before read the router; sizing is advice, never the reason to stop
        log.warning("the router's request log could not be read to size the windows: %s", exc.one_line())
        return
    if rate is None:
        _warn_too_little(f"the router at {spec.router} has")
        return
    rps, count, seconds = rate
    _refuse_small_windows(spec, rps, f"the router's traffic ({count} requests in its last {seconds:.0f}s)",
                          allow_small=allow_small)


def _warn_too_little(who_has: str, *, at_each: bool = False) -> None:
    """The one warning for traffic too thin to size the windows by (``who_has``: "the router at URL has")."""
    log.warning("%s too little traffic yet to size the windows by (fewer than %d requests, or less than %.0fs of "
                "them, in the last %.0fs%s): each needs weight x requests/s x interval >= min_requests "
                "(docs/promote.md, window sizing)", who_has, MIN_RATE_SAMPLE, MIN_RATE_SPAN_S, RATE_LOOKBACKS_S[-1],
                ", at each" if at_each else "")


def _refuse_small_windows(spec: RolloutSpec, rps: float, traffic: str, *, allow_small: bool,
                          partial: str | None = None) -> None:
    """Refuse (``allow_small``, or a rate ``partial`` says was measured on part of the fleet: warn) when a window
    cannot reach its minimum at ``rps``."""
    problem = window_shortfall(spec, rps, traffic)
    if problem is None:
        return
    if partial is not None:
        log.warning("%s (a lower bound: %s): starting anyway; its windows may hold, then pause", problem, partial)
        return
    if allow_small:
        log.warning("%s: starting anyway (--allow-small-windows); its windows will hold, then pause", problem)
        return
    raise BadInputError(problem, hint="Size the windows by weight x requests/s x interval >= min_requests "
                                      "(docs/promote.md, window sizing), send more traffic, or pass "
                                      "--allow-small-windows to start anyway (they hold, then pause)")


def _check_fleet_window_sizing(spec: RolloutSpec, fleet: RouterFleet, router_token: str | None, *,
                               allow_small: bool) -> None:
    """check_window_sizing on a fleet: every router's recent rate, summed. A router whose log cannot be read is
    named in a warning, and a shortfall on the rest is a warning too (their sum is a lower bound)."""
    try:
        urls = fleet.urls()
    except QliftError as exc:
        log.warning("the fleet's routers could not be listed to size the windows: %s", exc.one_line())
        return
    rates, failed = fleet.each(urls, lambda url: recent_rate(url, router_token))
    unread = None
    if failed:
        unread = f"the request log of {len(failed)} of {len(urls)} routers could not be read: " + \
            not_answering(failed)
        log.warning("sizing the windows by the routers that answer; %s", unread)
    measured = {url: r for url, r in rates.items() if r is not None}
    if not measured:
        if rates:
            _warn_too_little(f"the routers ({', '.join(sorted(rates))}) have", at_each=True)
        return
    rps = sum(r[0] for r in measured.values())

    def told(url: str) -> str:
        r = measured.get(url)
        return f"too few requests at {url}" if r is None else f"{r[1]} requests in its last {r[2]:.0f}s at {url}"

    each = "; ".join(told(url) for url in sorted(rates))
    _refuse_small_windows(spec, rps, f"the traffic of {len(rates)} routers summed ({each})", allow_small=allow_small,
                          partial=unread)
