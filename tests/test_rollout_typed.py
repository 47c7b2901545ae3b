"""The rollout's typed spine: optional data-plane capabilities asked as protocols (a plane without one is
handled), the journal's and the webhook's enums keeping the strings older journals and receivers hold, and a
discarded window journaled by its typed cause, never by its message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_rollout_journal import MemoryPlane, ScriptedEvidence, healthy, spec

from qlift.errors import BadInputError, ExternalToolError
from qlift.rollout.controller import Controller, Pace, Void
from qlift.rollout.dataplane import (
    ChecksVersions,
    Identifies,
    NamesModels,
    ReportsDown,
    Restarts,
    RouterDataPlane,
    check_stable_up,
    check_versions,
    plane_generation,
)
from qlift.rollout.gateway import GatewayDataPlane
from qlift.rollout.identity import canary_changed, journaled_identity
from qlift.rollout.inference_ext import InferenceExtDataPlane
from qlift.rollout.journal import Journal
from qlift.rollout.nginx import NginxDataPlane
from qlift.rollout.planes import PLANES, SourceName
from qlift.rollout.preflight import out_of_rotation
from qlift.rollout.states import DecisionAction, EventKind, Phase
from qlift.rollout.webhook import WebhookAction

OPTIONAL = (Restarts, ChecksVersions, ReportsDown, Identifies, NamesModels)


def test_each_plane_class_declares_what_it_can_tell() -> None:
    assert all(issubclass(RouterDataPlane, cap) for cap in OPTIONAL)
    assert [issubclass(InferenceExtDataPlane, cap) for cap in OPTIONAL] == [False, False, False, False, True]
    for plain in (NginxDataPlane, GatewayDataPlane):
        assert not any(issubclass(plain, cap) for cap in OPTIONAL), plain


def test_a_plane_without_the_optional_capabilities_is_handled(tmp_path: Path) -> None:
    plane = MemoryPlane()
    assert not any(isinstance(plane, cap) for cap in OPTIONAL)
    assert plane_generation(plane) is None  # type: ignore[arg-type]
    check_versions(plane, ["s", "no-such-version"])  # type: ignore[arg-type]  (cannot tell: nothing refused)
    check_stable_up(plane, "s", allow_down=False)  # type: ignore[arg-type]
    assert out_of_rotation(plane, "c") is None  # type: ignore[arg-type]
    with Journal(tmp_path / "j.sqlite") as journal:
        r = journal.create(spec().model_dump(mode="json"), "s", "c")
        assert canary_changed(journal, r.id, plane, "c") is None  # type: ignore[arg-type]
        assert journal.history(r.id)["events"] == []


class CapablePlane(MemoryPlane):
    def __init__(self) -> None:
        super().__init__()
        self.model = "root /models/ft-v1"

    def identity(self, version: str) -> str | None:
        return self.model if version == "c" else "root /models/base"

    def down(self, version: str) -> str | None:
        return "its /health check fails" if version == "s" else None

    def check_versions(self, versions: list[str]) -> None:
        if "typo" in versions:
            raise BadInputError("router has no backend named typo")


def test_a_plane_with_them_is_asked(tmp_path: Path) -> None:
    plane = CapablePlane()
    with pytest.raises(BadInputError, match="typo"):
        check_versions(plane, ["s", "typo"])  # type: ignore[arg-type]
    assert out_of_rotation(plane, "s") == "its /health check fails"  # type: ignore[arg-type]
    with pytest.raises(ExternalToolError, match="DOWN"):
        check_stable_up(plane, "s", allow_down=False)  # type: ignore[arg-type]
    with Journal(tmp_path / "j.sqlite") as journal:
        r = journal.create(spec().model_dump(mode="json"), "s", "c")
        assert canary_changed(journal, r.id, plane, "c") is None  # type: ignore[arg-type]
        assert journaled_identity(journal, r.id) == "root /models/ft-v1"
        plane.model = "root /models/ft-v2"
        why = canary_changed(journal, r.id, plane, "c")  # type: ignore[arg-type]
        assert why is not None and "ft-v1 -> root /models/ft-v2" in why
        kinds = [e["kind"] for e in journal.history(r.id)["events"]]
        assert kinds == ["canary_identity", "canary_changed"]
        assert journaled_identity(journal, r.id) == "root /models/ft-v2"


def test_the_enums_keep_the_strings_older_journals_and_receivers_hold() -> None:
    assert [str(a) for a in DecisionAction] == ["start", "pause", "resume", "abort", "promote", "promoted", "bake",
                                                "finish", "options"]
    assert [str(k) for k in EventKind] == ["state", "window_discarded", "webhook_failed", "drift", "canary_identity",
                                           "canary_changed", "controller_stopped", "controller_resumed",
                                           "backend_added", "backend_retiring", "backend_retired"]
    assert {str(p) for p in Phase} <= {str(a) for a in WebhookAction}  # a judged window's phase is a webhook action
    assert json.dumps({"action": WebhookAction.ABORT, "source": SourceName.NONE}) == \
        '{"action": "abort", "source": "none"}'
    assert [PLANES[p].evidence for p in ("gateway-api", "inference-ext")] == ["none", "none"]


def test_an_old_journals_string_events_still_read(tmp_path: Path) -> None:
    """A journal an older qlift wrote holds plain strings: the typed readers find them."""
    with Journal(tmp_path / "j.sqlite") as journal:
        r = journal.create(spec().model_dump(mode="json"), "s", "c")
        with journal.tx() as db:
            db.execute("INSERT INTO events (rollout_id, at, kind, detail) VALUES (?, 'then', 'canary_changed', ?)",
                       (r.id, json.dumps({"identity": "root /old", "before": "root /older"})))
        assert journaled_identity(journal, r.id) == "root /old"
        assert journal.last_event(r.id, (EventKind.DRIFT,)) is None


def test_a_discarded_window_is_journaled_by_its_cause_not_its_message(tmp_path: Path) -> None:
    sp = spec()
    with Journal(tmp_path / "j.sqlite") as journal:
        r = journal.create(sp.model_dump(mode="json"), "s", "c")
        ctl = Controller(journal, r.id, sp, MemoryPlane(), ScriptedEvidence([(healthy("c", 20), healthy("s", 80))]),  # type: ignore[arg-type]
                         pace=Pace(tick=0.01))
        ctl._discard(r, Void("window interrupted: rollout is paused", interrupted=True))
        assert journal.history(r.id)["events"] == []
        ctl._discard(r, Void("window interrupted by a router restart: its weights drifted"))
        events = journal.history(r.id)["events"]
        assert [e["kind"] for e in events] == ["window_discarded"]
        assert events[0]["detail"]["reason"].startswith("window interrupted by a router restart")
