"""The judge model in split windows: a sample of prompts both versions answer.

In a split window each user gets one version's answer, so no pairs come for free. With a judge
(``shadow.judge``) and ``shadow.judge_split_percent`` above 0, the qlift router copies that share
of the requests either version serves to the other one (``partner`` in ``PUT /admin/shadow``); the
copy's answer reaches no user. The window's pairs are judged as the shadow phase's are, and the
verdict joins the window's checks (``Evidence.judged``). Mirroring is on only while a window is
watched: each window turns it on at its start (a restarted router forgets it) and off at its end.
"""

from __future__ import annotations

import logging

from qlift.errors import QliftError
from qlift.quality.judge import JudgeResult
from qlift.rollout.shadow import ShadowSource, judge_window
from qlift.rollout.spec import ShadowSpec

log = logging.getLogger(__name__)


class SplitPairs:
    def __init__(self, source: ShadowSource, spec: ShadowSpec, stable: str, canary: str) -> None:
        self.source, self.spec, self.stable, self.canary = source, spec, stable, canary
        self.failure: str | None = None

    def begin(self) -> None:
        """Turn the sample on and skip the pairs from before this window. A router that refuses leaves the
        window's other evidence alone: only the judge's check goes without verdicts."""
        try:
            self.source.start(self.canary, self.spec.judge_split_percent, self.spec.max_inflight,
                              partner=self.stable)
            self.source.begin()
            self.failure = None
        except QliftError as exc:
            self.failure = exc.one_line()
            log.warning("no judged pairs this window: %s", self.failure)

    def judged(self) -> JudgeResult:
        """The judge model's verdicts on an even sample of the window's pairs; the sample is off after."""
        pairs = None
        if self.failure is None:
            try:
                pairs = self.source.collect()
            except QliftError as exc:
                self.failure = exc.one_line()
        try:
            self.source.stop()
        except QliftError as exc:
            log.warning("could not turn the router's pair sample off: %s", exc.one_line())
        result = judge_window(pairs, self.spec) if pairs is not None else None
        if result is None:
            result = JudgeResult(notes=[f"no pairs: {self.failure}"])
        return result
