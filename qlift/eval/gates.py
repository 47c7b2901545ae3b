"""Eval's gates: the gate grammar (``qlift.gates.grammar``) over the metrics eval computes."""

from __future__ import annotations

from qlift.eval.metrics import METRICS
from qlift.gates.grammar import Gate, parse


def parse_gate(expr: str) -> Gate:
    """``expr`` as a ``Gate``; a metric eval does not compute is bad input."""
    return parse(expr, known_metrics=METRICS)
