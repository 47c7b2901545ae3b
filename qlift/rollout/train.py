"""`qlift promote start --next NAME=URL[#MODEL]`: the next release through a running qlift router, no restart.

The stable is whatever holds 100% of the router now; the canary is NAME, added to the router at weight 0 through
its admin API (or re-pointed, where a backend of that name is there at weight 0) and journaled as an event of the
new rollout. When the rollout ends, the version it leaves unserved is retired from the router: the old stable once
the canary is promoted (or finished after a bake), the canary once it rolled back or was aborted, so the router
holds only the version serving. The retirement is journaled as an intent (``backend_retiring``), done through
the admin API, then journaled done (``backend_retired``); a process killed in between leaves the intent, and the
next `start`, `resume`, `abort` or `finish` settles it (``settle``), as adapter.py settles a --canary-adapter.

A backend added by a `start` that is then refused (the canary does not answer, the eval gate) is retired again
before the refusal is raised. One added by a process killed before its rollout was journaled stays at weight 0:
the next `start --next` of that name re-points it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qlift.errors import BadInputError, IncompatibleError, NotFoundError, QliftError
from qlift.rollout.journal import Journal, Rollout, default_journal, journal_flag
from qlift.rollout.spec import RolloutSpec, build_spec
from qlift.rollout.states import EventKind, State

if TYPE_CHECKING:
    from qlift.router.client import BackendChange, RouterClient
    from qlift.router.wire import RouterState

log = logging.getLogger(__name__)

FLAG = "--next"
EXAMPLE = "Example: --next v3=http://127.0.0.1:8003#smollm2-v3"
# The version each final state leaves unserved, and why it goes.
RETIRES = {State.PROMOTED: ("stable", "promoted"), State.FINISHED: ("stable", "finished"),
           State.ROLLED_BACK: ("canary", "rolled back"), State.ABORTED: ("canary", "aborted")}


@dataclass(frozen=True)
class NextVersion:
    """The next release: the router backend ``name`` at ``url`` (without /v1), serving ``model`` (None: the
    first model its server lists, unpinned)."""

    name: str
    url: str
    model: str | None = None

    def __str__(self) -> str:
        from qlift.router.config import redact_url

        return f"{self.name}={redact_url(self.url)}{'#' + self.model if self.model else ''}"


def parse_next(text: str) -> NextVersion:
    """``NAME=URL[#MODEL]`` -> NextVersion, checked as the router checks a backend (BadInputError naming --next)."""
    from pydantic import ValidationError

    from qlift.router.config import BackendConfig, redact_url, split_url_model

    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise BadInputError(f"{FLAG} {redact_url(text)!r} is not NAME=URL[#MODEL]", field=FLAG, hint=EXAMPLE)
    try:
        url, model = split_url_model(rest)
        backend = BackendConfig(name=name, url=url, served_model=model or None)
    except ValidationError as exc:
        raise BadInputError(str(exc.errors()[0]["msg"]).removeprefix("Value error, "), field=FLAG,
                            hint=EXAMPLE) from None
    except ValueError as exc:
        raise BadInputError(str(exc), field=FLAG, hint=EXAMPLE) from None
    return NextVersion(backend.name, backend.url, backend.served_model)


def serving(state: RouterState) -> str | None:
    """The backend that holds 100% of the router's traffic; None when the weights are split."""
    return next((name for name, weight in state.weights.items() if weight == 100), None)


def _client(spec: RolloutSpec, router_token: str | None) -> RouterClient:
    from qlift.router.client import RouterClient

    assert spec.router is not None  # a plane at the router needs one (RolloutSpec's validation)
    return RouterClient(spec.router, router_token)


def next_spec(file_data: dict[str, Any], overrides: dict[str, Any], nxt: NextVersion, *,
              journal_path: Path | None, router_token: str | None, path: Path | None = None) -> RolloutSpec:
    """The spec of the next release: the flags and the file (``build_spec``'s), with the stable the version that
    holds 100% of the router now and the canary ``nxt.name``. Refused with one line: --stable or --canary
    given, a data plane that is not the qlift router, a rollout in progress in the journal, a router whose weights
    are split, or ``nxt.name`` serving 100% already."""
    from qlift.rollout.planes import PLANES

    given = [f"--{k}" for k in ("stable", "canary") if overrides.get(k) is not None]
    if given:
        raise BadInputError(f"{FLAG} picks both versions (the stable: the one that holds 100% of the router now; "
                            f"the canary: NAME), so {' and '.join(given)} cannot be given with it", field=given[0],
                            hint=f"Drop {' and '.join(given)}.")
    # The plane first (the spec's own checks of it would name versions not known yet); a name it does not have is
    # refused by build_spec.
    plane_name = overrides.get("data_plane") or file_data.get("data_plane") or \
        RolloutSpec.model_fields["data_plane"].default
    plane = PLANES.get(str(plane_name))
    if plane is not None and not plane.at_router:
        raise IncompatibleError(f"{FLAG} adds the next version to the qlift router through its admin API; the "
                                f"{plane.name} data plane has no backends to add",
                                hint="Add the version to that data plane yourself, then `qlift promote start "
                                     "--stable OLD --canary NEW --new`.")
    first = build_spec(file_data, {**overrides, "stable": "(the version at 100%)", "canary": nxt.name}, path=path)
    journal = Path(journal_path or default_journal())
    if journal.is_file():
        with Journal(journal) as j:
            active = j.active()
        if active is not None:
            raise BadInputError(f"{journal} has rollout {active.id} of {active.canary} over {active.stable} in "
                                f"progress ({active.state}): the next release starts once it ends",
                                hint=f"Resume it with `qlift promote resume{journal_flag(journal)}`, or `qlift "
                                     f"promote abort{journal_flag(journal)}` it first.")
    assert first.router is not None  # a plane at the router needs one (RolloutSpec's validation)
    stable = stable_for(first.router, nxt.name, router_token)
    if stable != first.stable and "stable" in file_data:
        log.info("%s: the stable is %s, which holds 100%% of the router (the file names %s)", FLAG, stable,
                 file_data["stable"])
    return build_spec(file_data, {**overrides, "stable": stable, "canary": nxt.name}, path=path)


def stable_for(router: str, name: str, router_token: str | None, *, flag: str = FLAG) -> str:
    """The version that holds 100% of the router at ``router`` now: the next release's stable, over which ``name``
    rolls out. Refused with one line (``flag`` names what asked): no version at 100%, or ``name`` there already."""
    from qlift.router.client import RouterClient

    state = RouterClient(router, router_token).state()
    stable = serving(state)
    if stable is None:
        split = ", ".join(f"{k} {v}%" for k, v in state.weights.items())
        raise BadInputError(f"no version holds 100% of the router at {router} ({split}): {flag} rolls the "
                            "next version out over the one that does",
                            hint="Let the rollout moving them end (`qlift promote status`), or put one version at "
                                 "100% first.")
    if stable == name:
        raise BadInputError(f"{name} already holds 100% of the router at {router}", field=flag,
                            hint="Name the next release's version: a new backend name (e.g. v3).")
    return stable


def unretired(journal_path: Path) -> str | None:
    """The backend the journal's last `--next` rollout left unserved and not yet retired from the router (the
    retirement ``settle`` still owes); None where there is none."""
    if not journal_path.is_file():
        return None
    with Journal(journal_path, readonly=True) as journal:
        r = journal.latest()
        if r is None or r.state not in RETIRES or not _pending(journal, r):
            return None
    return r.stable if RETIRES[r.state][0] == "stable" else r.canary


def _add_or_repoint(client: RouterClient, nxt: NextVersion) -> BackendChange:
    """The next version's backend at weight 0: added, or re-pointed where one of its name sits at weight 0."""
    state = client.state()
    if nxt.name not in state.weights:
        return client.add_backend(nxt.name, nxt.url, nxt.model)
    if state.weights[nxt.name] > 0:
        raise IncompatibleError(f"the router's backend {nxt.name} has weight {state.weights[nxt.name]}: {FLAG} "
                                "adds a version no user is sent to yet",
                                hint="Name the next release with a new backend name, or move that backend's "
                                     "weight away first.")
    return client.repoint_backend(nxt.name, nxt.url, nxt.model, unpin=nxt.model is None)


@contextlib.contextmanager
def next_backend(journal: Journal, spec: RolloutSpec, nxt: NextVersion | None,
                 router_token: str | None) -> Iterator[Callable[[Rollout], None]]:
    """Around a new rollout's checks and creation (api.start): the next version's backend added (or re-pointed)
    first; the function yielded journals that on the rollout once it is created. A refusal before that retires a
    backend added here again. Without ``nxt``: nothing, and the function does nothing."""
    if nxt is None:
        yield lambda r: None
        return
    from qlift.router.config import redact_url

    client = _client(spec, router_token)
    change = _add_or_repoint(client, nxt)
    log.info("%s", change.message)
    created = False

    def journal_added(r: Rollout) -> None:
        nonlocal created
        created = True
        journal.log_event(r.id, EventKind.BACKEND_ADDED, {
            "backend": nxt.name, "url": redact_url(nxt.url), "model": change.backend_state().served_model,
            "change": change.change, "stable": spec.stable, "message": change.message})

    try:
        yield journal_added
    except BaseException:
        if not created and change.change == "added":
            with contextlib.suppress(QliftError):
                client.retire_backend(nxt.name)
                log.info("retired backend %s again: the rollout was not started", nxt.name)
        raise


def settle(journal_path: Path | None, router_token: str | None) -> str | None:
    """Retire the version the journal's last `--next` rollout left unserved, where that is not done yet: its old
    stable once promoted or finished, its canary once rolled back or aborted. Returns the backend retired (None:
    nothing to do, or the router refused; the intent stays journaled and the next call tries again)."""
    path = Path(journal_path or default_journal())
    if not path.is_file():
        return None
    with Journal(path) as journal:
        r = journal.latest()
        if r is None or r.state not in RETIRES or not _pending(journal, r):
            return None
        role, why = RETIRES[r.state]
        name = r.stable if role == "stable" else r.canary
        with journal.weights_lock():  # a controller ending and an operator's abort may settle at once
            if not _pending(journal, r):
                return None
            if journal.last_event(r.id, (EventKind.BACKEND_RETIRING,)) is None:
                journal.log_event(r.id, EventKind.BACKEND_RETIRING, {"backend": name, "why": why})
            return _retire(journal, r, name, why, router_token)


def _pending(journal: Journal, r: Rollout) -> bool:
    return (journal.last_event(r.id, (EventKind.BACKEND_ADDED,)) is not None
            and journal.last_event(r.id, (EventKind.BACKEND_RETIRED,)) is None)


def _retire(journal: Journal, r: Rollout, name: str, why: str, router_token: str | None) -> str | None:
    from qlift.rollout.aborts import spec_of

    try:
        message = _client(spec_of(r), router_token).retire_backend(name).message
    except NotFoundError:
        message = f"backend {name} was gone from the router already"
    except QliftError as exc:
        log.warning("rollout %d %s: could not retire backend %s from the router yet: %s; the next `qlift promote "
                    "start`, `resume` or `finish` tries again", r.id, why, name, exc.one_line())
        return None
    journal.log_event(r.id, EventKind.BACKEND_RETIRED, {"backend": name, "why": why, "message": message})
    log.info("rollout %d %s: %s", r.id, why, message)
    return name


def start_next(spec: RolloutSpec, journal_path: Path | None, nxt: NextVersion, *, router_token: str | None = None,
               **start_options: Any) -> Rollout:
    """`qlift promote start --next`: settle the last release's leftover backend, run the rollout of ``nxt`` over
    the version at 100% (``spec``: ``next_spec``'s) with its backend added first, then retire the version its end
    leaves unserved. ``start_options`` go to ``qlift.rollout.api.start``."""
    from qlift import settings
    from qlift.rollout.api import start

    token = settings.router_token(router_token)
    settle(journal_path, token)
    final = start(spec, journal_path, new=True, next_version=nxt, router_token=token, **start_options)
    settle(journal_path, token)
    return final
