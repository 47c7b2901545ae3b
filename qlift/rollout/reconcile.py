"""Reconcile: the data plane's weights converged to the journal's, every tick a controller checks.

A plane that drifted (a restarted router, a hand-edited nginx.conf, a reverted HTTPRoute) gets the
journal's last weights again, and the drift is journaled as an event. A plane that cannot be read
or set raises ``Drift``: the controller's run loop retries with back-off.
"""

from __future__ import annotations

import logging

from qlift.errors import QliftError
from qlift.rollout.dataplane import DataPlane, WeightsSplit, plane_generation
from qlift.rollout.journal import Journal
from qlift.rollout.states import EventKind

log = logging.getLogger("qlift.rollout.controller")


class Drift(QliftError):
    """The data plane cannot be read or set: the run loop retries with back-off."""


class Reconciler:
    def __init__(self, journal: Journal, rollout_id: int, plane: DataPlane) -> None:
        self.journal, self.rid, self.plane = journal, rollout_id, plane
        self.drifts = 0
        self._generation: str | None = None

    def desired(self) -> dict[str, int] | None:
        last = self.journal.last_change(self.rid)
        return None if last is None else last.weights

    def reconcile(self) -> bool:
        """Converge the plane to the journal's last weights; True when it had drifted (re-applied and journaled).
        Raises Drift when the plane cannot be read or set."""
        want = self.desired()
        if want is None:
            return False
        split: dict[str, dict[str, int]] | None = None
        try:
            gen = plane_generation(self.plane)
            actual = self.plane.weights()
        except WeightsSplit as exc:  # its parts disagree (a router missed a write): every part gets the journal's
            actual, split = None, exc.found
        except QliftError as exc:
            raise Drift(f"could not read the data plane's weights: {exc.one_line()}") from None
        restarted = gen is not None and self._generation is not None and gen != self._generation
        self._generation = gen if gen is not None else self._generation
        if actual is not None and all(actual.get(k, 0) == v for k, v in want.items()) and not restarted:
            return False
        try:
            with self.journal.weights_lock():
                if self.journal.abort_marker.exists():  # an abort the full journal could not hold: 100% stable stands
                    return False
                log.warning("data plane weights %s differ from the journal's %s%s: setting the journal's",
                            split or actual, want, " (it restarted)" if restarted else "")
                want = self.desired() or want  # an abort may have journaled new weights meanwhile
                self.plane.set_weights(want)
            self._generation = plane_generation(self.plane) or self._generation
        except QliftError as exc:
            raise Drift(f"could not re-apply the journal's weights {want}: {exc.one_line()}") from None
        self.drifts += 1
        self.journal.log_event(self.rid, EventKind.DRIFT, {"found": split or actual, "journaled": want,
                                                           "restarted": restarted,
                                                           "action": "re-applied the journal's weights"})
        return True
