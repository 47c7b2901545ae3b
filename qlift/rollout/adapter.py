"""`qlift promote start --canary-adapter NAME=DIR`: a LoRA adapter rolled out on the stable's own server.

The canary is the stable's vLLM server answering to model NAME: the router has it as a backend
``canary=URL#NAME`` beside ``stable=URL#BASE`` (one server, two model names). Before the
rollout, the adapter is checked against the base the server serves and loaded through vLLM's
runtime endpoint, then made to answer one token; the usual steps and judge follow. After a
rollback or an abort it is unloaded; after a promotion it stays, and the `qlift serve --lora`
line that serves the same state after a restart is printed.

Every load and unload is journaled in the rollout journal's own SQLite file (table
``canary_adapters``) as an intent before the server is touched and as done after, so a
controller killed anywhere is settled by the next `start` (or `resume`): an adapter whose
rollout is still active is kept (re-loaded if the server lost it) and the rollout resumes;
one whose rollout rolled back or was aborted is unloaded; one loaded for a rollout that never
got created is unloaded unless the new `start` promotes the same adapter.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError, IncompatibleError, QliftError
from qlift.rollout.adapter_journal import AdapterJournal, AdapterRecord, adapter_journal, read_adapter
from qlift.rollout.journal import Journal, Rollout
from qlift.rollout.spec import RolloutSpec
from qlift.rollout.states import AdapterState, State

log = logging.getLogger(__name__)

HEALTHY_WAIT_S = 30.0  # the router re-checks its backends every couple of seconds


def restart_command(rec: AdapterRecord) -> list[str]:
    """The `qlift serve` line that brings ``rec``'s server back as it is now: the line `qlift serve` recorded for
    it where qlift started it on this machine (recipe, host, port, --set), else one built from its address and
    base, with every adapter the server serves (``rec``'s included) as --lora."""
    from urllib.parse import urlsplit

    from qlift.serve.lora import serve_command
    from qlift.serve.lora_runtime import list_adapters
    from qlift.serve.restart import find

    try:
        adapters = {a.name: a.path for a in list_adapters(rec.server) if a.path}
    except QliftError as exc:
        log.warning("could not list %s's adapters for its restart line: %s", rec.server, exc.one_line())
        adapters = {}
    adapters[rec.name] = rec.path
    found = find(rec.server)
    if found is not None:
        return found.with_adapters(adapters)
    where = urlsplit(rec.server.rstrip("/").removesuffix("/v1"))
    return serve_command(Path(rec.base_dir or "BASE_DIR"), {n: Path(p) for n, p in adapters.items()},
                         served_name=rec.base_name, runtime=True, host=where.hostname, port=where.port)


@dataclass
class AdapterTarget:
    """Where the adapter goes: the stable's server, and the base it serves there."""

    server: str
    base_name: str
    base_dir: Path | None


def resolve_target(spec: RolloutSpec, name: str, *, router_token: str | None) -> AdapterTarget:
    """The stable's server, checked to be the canary's too with model ``name`` (builtin data plane only; the
    router's admin token ``router_token``, None: none)."""
    from qlift.rollout.planes import PLANES

    plane = PLANES[spec.data_plane]
    if plane.adapter_refusal is not None:
        raise IncompatibleError(plane.adapter_refusal.message, hint=plane.adapter_refusal.hint)
    if not plane.at_router or not spec.router:
        raise IncompatibleError(
            f"--canary-adapter loads the adapter at runtime through the builtin router; the {spec.data_plane} "
            "data plane has no runtime loading (on Kubernetes the Deployment serves adapters with --lora)",
            hint="For Kubernetes render the Inference Extension objects: `qlift deploy k8s BASE --lora NAME=DIR "
                 "--gateway-api` (docs/lora.md).")
    from qlift.router.client import RouterClient
    from qlift.serve.lora_runtime import find_served, served_models

    state = RouterClient(spec.router, router_token).state()
    try:
        stable, canary = state.backend(spec.stable), state.backend(spec.canary)
    except KeyError as exc:
        raise BadInputError(f"the router at {spec.router} has no backend {exc}",
                            hint="Start it with --backend stable=URL#BASE --backend canary=URL#ADAPTER.") from None
    if canary.url.rstrip("/") != stable.url.rstrip("/") or canary.served_model != name:
        raise BadInputError(
            f"--canary-adapter {name}: the router's {spec.canary} backend is {canary.url}#{canary.served_model}, "
            f"not the stable's server {stable.url} with model {name}", field="--canary-adapter",
            hint=f"Start the router with --backend {spec.canary}={stable.url}#{name}.")
    base = next((m for m in served_models(stable.url) if not m.is_adapter), None)
    if base is None or find_served(stable.url, stable.served_model) is None:
        raise BadInputError(f"the stable's server {stable.url} does not list {stable.served_model}",
                            hint="Check the router's stable backend.")
    base_dir = Path(base.root) if base.root and Path(base.root).is_dir() else None
    return AdapterTarget(server=stable.url, base_name=base.id, base_dir=base_dir)


def _unload(aj: AdapterJournal, rec: AdapterRecord, why: str) -> AdapterRecord:
    from qlift.serve.lora_runtime import unload

    rec = aj.move(rec, AdapterState.UNLOADING)
    try:
        was = unload(rec.server, rec.name, missing_ok=True)
    except QliftError as exc:  # the next start, resume or abort tries again; the record stays open
        log.warning("could not unload adapter %s from %s (%s): %s", rec.name, rec.server, why, exc.one_line())
        return rec
    log.info("unloaded adapter %s from %s (%s)%s", rec.name, rec.server, why, "" if was else ": it was not loaded")
    return aj.move(rec, AdapterState.UNLOADED)


def _load(aj: AdapterJournal, rec: AdapterRecord, base_dir: Path | None) -> AdapterRecord:
    from qlift.serve.lora_runtime import load

    rec = aj.move(rec, AdapterState.LOADING)
    load(rec.server, rec.name, Path(rec.path), base_dir=base_dir)
    log.info("adapter %s loaded into %s and answering", rec.name, rec.server)
    return aj.move(rec, AdapterState.LOADED)


def settle(journal_path: Path, *, keep: tuple[str, str] | None = None) -> list[AdapterRecord]:
    """Bring every journaled adapter in line with its rollout: kept while the rollout is active or
    promoted, unloaded once it rolled back or was aborted. ``keep`` (name, path): an adapter loaded
    for a rollout that never got created, which the caller is about to use again."""
    settled: list[AdapterRecord] = []
    with Journal(journal_path) as journal, adapter_journal(journal_path) as aj:
        latest = journal.latest()
        for rec in aj.open_records():
            rollout = _rollout_of(journal, aj, rec, latest)
            if rollout is None:
                if keep is not None and (rec.name, str(Path(keep[1]).resolve())) == (keep[0], rec.path):
                    continue
                settled.append(_unload(aj, rec, "its rollout was never started"))
            elif rollout.state.active:
                continue
            elif rollout.state in (State.PROMOTED, State.FINISHED):
                rec = aj.keep_command(rec, restart_command(rec))
                settled.append(aj.move(rec, AdapterState.KEPT))
            else:
                settled.append(_unload(aj, rec, f"rollout {rollout.id} {rollout.state}"))
    return settled


def _rollout_of(journal: Journal, aj: AdapterJournal, rec: AdapterRecord, latest: Rollout | None) -> Rollout | None:
    if rec.rollout_id is not None:
        return journal.get(rec.rollout_id)
    # Loaded before its rollout was created: the rollout is the one created after the load, of this canary.
    if latest is not None and latest.created_at >= rec.created_at and aj.for_rollout(latest.id) is None:
        aj.link(rec, latest.id)
        return latest
    return None


def prepare(spec: RolloutSpec, journal_path: Path, name: str, path: Path, *, router_token: str | None) -> AdapterRecord:
    """Check, journal and load the adapter (or find it loaded by a killed `start`); returns its record."""
    from qlift.lineage import describe_input
    from qlift.serve.lora import check_lora_name
    from qlift.serve.lora_runtime import check_for_server

    check_lora_name(name, flag="--canary-adapter")
    target = resolve_target(spec, name, router_token=router_token)
    checked = check_for_server(target.server, name, path, base_dir=target.base_dir)  # refused before any journal
    settle(journal_path, keep=(name, str(checked.path)))
    with Journal(journal_path) as journal, adapter_journal(journal_path) as aj:
        active = journal.active()
        rec = next((r for r in aj.open_records() if r.name == name and r.server == target.server), None)
        if rec is not None and rec.path != str(checked.path):
            raise BadInputError(f"adapter {name} on {target.server} is journaled from {rec.path}, not {checked.path}",
                                field="--canary-adapter",
                                hint="Finish that rollout first (`qlift promote status`, `qlift promote abort`).")
        if rec is None:
            if active is not None:
                raise BadInputError(f"{journal_path} has rollout {active.id} in progress without adapter {name}",
                                    hint="Resume it with `qlift promote resume`, or abort it first.")
            rec = aj.add(name=name, path=checked.path, server=target.server,
                         content_hash=describe_input("adapter", checked.path)[0].content_hash,
                         base_dir=str(target.base_dir) if target.base_dir else None, base_name=target.base_name,
                         rollout_id=None)
        else:
            log.info("adapter %s was journaled by an earlier start (%s): resuming with it", name, rec.state)
        rec = _load(aj, rec, target.base_dir)
    _wait_router_healthy(spec, router_token)
    return rec


def _wait_router_healthy(spec: RolloutSpec, router_token: str | None) -> None:
    """The router takes a backend into rotation at its next health check (once the model is listed)."""
    from qlift.router.client import RouterClient

    assert spec.router is not None
    client = RouterClient(spec.router, router_token)
    deadline = time.monotonic() + HEALTHY_WAIT_S
    while time.monotonic() < deadline:
        if client.state().backend(spec.canary).healthy:
            return
        time.sleep(0.5)
    log.warning("the router has not taken %s into rotation after %gs; its windows hold until it does", spec.canary,
                HEALTHY_WAIT_S)


def finish(journal_path: Path, r: Rollout) -> AdapterRecord | None:
    """After the controller returns: link the record to rollout ``r`` and settle it (unload or keep)."""
    with adapter_journal(journal_path) as aj:
        # A record younger than ``r`` was not loaded for it (`start` after a promotion may start nothing).
        rec = next((x for x in aj.open_records() if x.rollout_id == r.id
                    or (x.rollout_id is None and x.created_at <= r.created_at)), None)
        if rec is not None and rec.rollout_id is None:
            aj.link(rec, r.id)
    settle(journal_path)
    with adapter_journal(journal_path) as aj:
        return aj.for_rollout(r.id)


def adapter_status(journal_path: Path, rollout_id: int) -> dict[str, Any] | None:
    """The adapter of rollout ``rollout_id`` as `qlift promote status` shows it (None without one)."""
    rec = read_adapter(journal_path, rollout_id)
    if rec is None:
        return None
    out = {"name": rec.name, "path": rec.path, "server": rec.server, "content_hash": rec.content_hash,
           "state": rec.state}
    if rec.state == AdapterState.KEPT or rec.restart_argv:
        from qlift.serve.lora import command_line

        out["serve_command"] = command_line(rec.serve_command())
    return out


def adapter_matches_report(report: dict[str, Any], adapter_dir: Path, base_dir: Path | None) -> str | None:
    """How an eval report covers base + adapter, by lineage hash; None when it does not.

    The report evaluated the adapter dir itself (its content hash), or a `qlift merge` output whose
    manifest records this adapter as its only adapter input and, when ``base_dir`` is known, this
    base as its base input: the merge is the same weights the server applies unmerged."""
    from qlift.lineage import describe_input, read_manifest

    candidate = report.get("candidate") or {}
    want = candidate.get("content_hash")
    adapter_hash = describe_input("adapter", adapter_dir)[0].content_hash
    if want == adapter_hash:
        return f"the report evaluated the adapter {adapter_dir} itself"
    path = candidate.get("path")
    if not want or not path or not Path(path).is_dir():
        return None
    if describe_input("candidate", Path(path))[0].content_hash != want:
        return None  # the evaluated dir changed since
    manifest = read_manifest(Path(path)) or {}
    if manifest.get("operation") != "merge":
        return None
    inputs = {i.get("role"): i.get("content_hash") for i in manifest.get("inputs", []) if isinstance(i, dict)}
    adapters = [h for role, h in inputs.items() if str(role).startswith("adapter")]
    if adapters != [adapter_hash]:
        return None
    if base_dir is not None and inputs.get("base") != describe_input("base", base_dir)[0].content_hash:
        return None
    return f"the report evaluated {path}, the merge of this {'base and ' if base_dir else ''}adapter"
