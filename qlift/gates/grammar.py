"""Release gates such as ``rougeL >= baseline - 0.02``, parsed by a small grammar (no eval).

    gate   := metric [ "[" tag "]" ] op rhs
    op     := ">=" | "<=" | ">" | "<" | "=="
    rhs    := number | "baseline" [ ("+" | "-" | "*") number ] | number "*" "baseline"

The metric is the candidate's aggregate (overall, or on the tag's slice); ``baseline``
is the baseline's aggregate of the same metric on the same slice. Which metrics exist is eval's to say
(``qlift.eval.gates.parse_gate``); ``parse`` checks the names it is given.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

from qlift.errors import BadInputError

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq,
}
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_GATE = re.compile(
    r"^\s*(?P<metric>[A-Za-z_]\w*)\s*(?:\[\s*(?P<tag>[^\]]+?)\s*\])?\s*(?P<op>>=|<=|==|>|<)\s*(?P<rhs>.+?)\s*$"
)
_RHS_NUM = re.compile(rf"^(?P<n>{_NUM})$")
_RHS_BASE = re.compile(rf"^baseline(?:\s*(?P<op>[-+*])\s*(?P<n>{_NUM}))?$")
_RHS_SCALED = re.compile(rf"^(?P<n>{_NUM})\s*\*\s*baseline$")
_HINT = (
    "Write METRIC OP VALUE, e.g. 'rougeL >= baseline - 0.02', 'json_valid >= 0.98', "
    "'ppl <= baseline * 1.05' or 'check_pass[json] >= 0.9'."
)


@dataclass(frozen=True)
class Gate:
    expr: str
    metric: str
    tag: str | None
    op: str
    number: float
    base_op: str | None  # None: absolute threshold; else "+", "-" or "*" applied to baseline

    @property
    def uses_baseline(self) -> bool:
        return self.base_op is not None

    def threshold(self, baseline: float | None) -> float:
        if self.base_op is None:
            return self.number
        assert baseline is not None
        if self.base_op == "+":
            return baseline + self.number
        if self.base_op == "-":
            return baseline - self.number
        return baseline * self.number

    def check(self, value: float, baseline: float | None) -> bool:
        return _OPS[self.op](value, self.threshold(baseline))


def parse(expr: str, *, known_metrics: Collection[str] | None = None) -> Gate:
    """``expr`` as a ``Gate``; ``known_metrics``: the metric names it may use (None: any)."""
    m = _GATE.match(expr)
    if not m:
        raise BadInputError(f"cannot parse gate '{expr}'", hint=_HINT)
    metric, tag, op, rhs = m["metric"], m["tag"], m["op"], m["rhs"]
    if known_metrics is not None and metric not in known_metrics:
        raise BadInputError(
            f"gate '{expr}' names unknown metric '{metric}'",
            hint=f"Choose from: {', '.join(known_metrics)}.",
        )
    if r := _RHS_NUM.match(rhs):
        return Gate(expr, metric, tag, op, float(r["n"]), None)
    if r := _RHS_BASE.match(rhs):
        if r["op"] is None:
            return Gate(expr, metric, tag, op, 0.0, "+")
        return Gate(expr, metric, tag, op, float(r["n"]), r["op"])
    if r := _RHS_SCALED.match(rhs):
        return Gate(expr, metric, tag, op, float(r["n"]), "*")
    raise BadInputError(f"cannot parse the right-hand side '{rhs}' of gate '{expr}'", hint=_HINT)


@dataclass
class GateResult:
    expr: str
    passed: bool
    value: float | None
    threshold: float | None
    baseline: float | None
    detail: str
