"""A stage's line of the plan or the run, its key, and the first line of a stage's error."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from pydantic import JsonValue

from qlift.errors import QliftError
from qlift.release.kinds import STAGE_VERSIONS
from qlift.serialize import to_jsonable


class Action(StrEnum):
    """What a stage's line says: in a plan what will happen, after a run what did."""

    RUN = "run"
    SKIP = "skip"
    BLOCKED = "blocked"  # its input is made by a stage the plan runs first
    RAN = "ran"
    SKIPPED = "skipped"
    FAILED = "failed"

    @classmethod
    def skip(cls, dry_run: bool) -> Action:
        """A cached or unneeded stage's action: in a plan, and after a run."""
        return cls.SKIP if dry_run else cls.SKIPPED


@dataclass
class StageReport:
    """One stage's line of the plan, and its result once run."""

    name: str
    kind: str
    action: Action  # plan: run | skip | blocked; after a run: ran | skipped | failed
    reason: str = ""
    key: str = ""
    output: str = ""
    content_hash: str = ""
    seconds: float = 0.0
    result: dict[str, JsonValue] | None = None  # what the journal keeps of it
    warning: str = ""  # what running it will do that its reason does not say (promote moving live traffic)

    def line(self, index: int, total: int) -> str:
        key = f" [{short(self.key)}]" if self.key and short(self.key) not in self.reason else ""
        took = f" in {self.seconds:.1f} s" if self.action is Action.RAN else ""
        where = f" -> {self.output}" if self.output and self.action in (Action.RAN, Action.SKIPPED) else ""
        return f"[{index}/{total}] {self.name} ({self.kind}): {self.action}{took}{key}" + \
            (f": {self.reason}" if self.reason else "") + where + (f"; {self.warning}" if self.warning else "")


def short(key: str) -> str:
    return key.removeprefix("sha256:")[:12]


def stage_key(kind: str, options: object, inputs: Mapping[str, JsonValue]) -> str:
    data = {"stage": kind, "version": STAGE_VERSIONS[kind], "options": to_jsonable(options), "inputs": inputs}
    return "sha256:" + hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def first_line(exc: BaseException) -> str:
    text = exc.one_line() if isinstance(exc, QliftError) else type(exc).__name__
    return text.splitlines()[0] if text else ""
