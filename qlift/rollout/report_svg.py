"""The rollout report's charts, as inline SVG (no script, nothing fetched): the canary's weight over time
as a step line with the shadow phase shaded, a strip of window verdicts, and canary vs stable lines per
window with the limit the judge held the canary to."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import TYPE_CHECKING, Any

from qlift.rollout.states import EventKind, State

if TYPE_CHECKING:
    from qlift.rollout.status import RolloutStatus

W, H = 760, 210
LEFT, RIGHT, TOP, BOTTOM = 56, 14, 14, 34


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def clock(t: float, like: str) -> str:
    """HH:MM:SS of ``t`` in the journal's own zone (its timestamps are UTC)."""
    return datetime.fromtimestamp(t, datetime.fromisoformat(like).tzinfo).strftime("%H:%M:%S")


def fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.3g}"


@dataclass
class Axes:
    """Maps data to the plot area: x from ``x0..x1``, y from 0 to ``top``."""

    x0: float
    x1: float
    top: float

    def x(self, v: float) -> float:
        span = (self.x1 - self.x0) or 1.0
        return LEFT + (v - self.x0) / span * (W - LEFT - RIGHT)

    def y(self, v: float) -> float:
        return H - BOTTOM - min(max(v, 0.0), self.top) / (self.top or 1.0) * (H - TOP - BOTTOM)


def nice_top(values: list[float]) -> float:
    """The y axis' top: the largest value rounded up to 1, 2 or 5 times a power of ten."""
    big = max([v for v in values if math.isfinite(v)] + [1e-9])
    power = 10 ** math.floor(math.log10(big))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= big)


def y_axis(ax: Axes, unit: str) -> str:
    parts = []
    for frac in (0.0, 0.5, 1.0):
        v = ax.top * frac
        y = ax.y(v)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
                     f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(v)}{unit}</text>')
    return "".join(parts)


def svg(kind: str, label: str, body: str, height: int = H) -> str:
    return (f'<svg class="rollout-chart" data-chart="{kind}" width="{W}" height="{height}" role="img" '
            f'aria-label="{escape(label)}">{body}</svg>')


def weights_chart(st: RolloutStatus, windows: list[dict[str, Any]]) -> str:
    """The canary's weight (percent of users) over time as a step line; the shadow phase shaded with the
    share it mirrored; each judged window a dot in its verdict's colour where it ended."""
    canary = st.canary
    changes = [(ts(c["applied_at"] or c["journaled_at"]), int(c["weights"].get(canary, 0)))
               for c in st.weight_changes]
    start = ts(st.created_at)
    times = [start, ts(st.updated_at)] + [t for t, _ in changes] + [ts(w["ended_at"]) for w in windows]
    end = max(max(times), start + 1.0)
    ax = Axes(start, end + (end - start) * 0.04, 100.0)  # room after the last change: the final weight shows
    parts = [y_axis(ax, "%")]
    shadow = shadow_span(st, end)
    if shadow is not None and st.shadow is not None:
        x1, x2 = ax.x(shadow[0]), ax.x(shadow[1])
        percent = st.shadow.spec["percent"]
        parts.append(f'<rect class="shadow-phase" x="{x1:.1f}" y="{TOP}" width="{max(x2 - x1, 1):.1f}" '
                     f'height="{H - TOP - BOTTOM}"><title>shadow phase: {percent}% of requests mirrored to the '
                     f'canary, users see none of its answers</title></rect>'
                     f'<text x="{x1 + 4:.1f}" y="{TOP + 12}">shadow: {percent}% mirrored</text>')
    baking = bake_span(st, end)
    if baking is not None:
        x1, x2 = ax.x(baking[0]), ax.x(baking[1])
        parts.append(f'<rect class="bake-phase" x="{x1:.1f}" y="{TOP}" width="{max(x2 - x1, 1):.1f}" '
                     f'height="{H - TOP - BOTTOM}"><title>bake: the canary at 100% judged against the stable\'s '
                     f'last figures</title></rect><text x="{x1 + 4:.1f}" y="{TOP + 24}">bake</text>')
    points, weight = [], 0
    for t, w in changes:
        points += [(t, weight), (t, w)]
        weight = w
    points = [(start, 0)] + points + [(end, weight)]
    path = " ".join(f"{ax.x(t):.1f},{ax.y(w):.1f}" for t, w in points)
    parts.append(f'<polyline class="weight canary" points="{path}"/>')
    for t, w in changes:
        parts.append(f'<circle class="change" data-weight="{w}" cx="{ax.x(t):.1f}" cy="{ax.y(w):.1f}" r="3">'
                     f'<title>{clock(t, st.created_at)}: canary {w}%</title></circle>')
    for win in windows:
        t = ts(win["ended_at"])
        parts.append(f'<circle class="verdict {escape(win["action"])}" cx="{ax.x(t):.1f}" cy="{H - BOTTOM + 8}" '
                     f'r="4"><title>{escape(win["action"])} at {win["ended_at"][11:19]}</title></circle>')
    for frac in (0.0, 0.5, 1.0):
        t = start + (end - start) * frac
        anchor = ("start", "middle", "end")[int(frac * 2)]
        parts.append(f'<text x="{ax.x(t):.1f}" y="{H - 6}" text-anchor="{anchor}">{clock(t, st.created_at)}'
                     "</text>")
    return svg("weights", f"{canary}'s weight over time", "".join(parts))


def shadow_span(st: RolloutStatus, end: float) -> tuple[float, float] | None:
    """From the start to the move out of ``shadowing`` (or the last record, if it never left)."""
    if not st.shadow:
        return None
    left = [ts(e["at"]) for e in st.events
            if e["kind"] == EventKind.STATE and State(e["detail"]["from"]) is State.SHADOWING]
    return ts(st.created_at), (left[0] if left else end)


def bake_span(st: RolloutStatus, end: float) -> tuple[float, float] | None:
    """From the move into ``baking`` to the move out of it (or the last record, if it is still baking)."""
    moves = [e for e in st.events if e["kind"] == EventKind.STATE]
    into = [ts(e["at"]) for e in moves if State(e["detail"]["to"]) is State.BAKING]
    if not into:
        return None
    out = [ts(e["at"]) for e in moves if State(e["detail"]["from"]) is State.BAKING and ts(e["at"]) >= into[0]]
    return into[0], (out[-1] if out else end)


def verdict_strip(windows: list[dict[str, Any]], labels: list[str]) -> str:
    """One cell a window, in order, in its verdict's colour, labelled with its phase and verdict."""
    cell = 64
    width = max(W, 8 + cell * len(windows))
    parts = []
    for i, (w, label) in enumerate(zip(windows, labels, strict=True)):
        x = 4 + i * cell
        parts.append(f'<g class="window" data-action="{escape(w["action"])}">'
                     f'<rect class="verdict {escape(w["action"])}" x="{x}" y="4" width="{cell - 4}" height="26" rx="3">'
                     f'<title>{escape(label)} {w["started_at"][11:19]}-{w["ended_at"][11:19]}: {escape(w["action"])}'
                     f' -- {escape(w["reason"])}</title></rect>'
                     f'<text x="{x + (cell - 4) / 2}" y="22" text-anchor="middle" class="on-verdict">'
                     f'{escape(w["action"])}</text>'
                     f'<text x="{x + (cell - 4) / 2}" y="46" text-anchor="middle">{escape(label)}</text></g>')
    return (f'<svg class="rollout-chart" data-chart="verdicts" width="{width}" height="56" role="img" '
            f'aria-label="window verdicts">{"".join(parts)}</svg>')


def compared_chart(name: str, windows: list[dict[str, Any]], labels: list[str]) -> str:
    """Check ``name``'s canary and stable values per window, and the limit: stable x the check's limit."""
    rows: list[tuple[float, float, float | None] | None] = []
    for w in windows:
        c = next((c for c in w.get("checks") or [] if c["name"] == name), None)
        ok = c is not None and c.get("canary") is not None and c.get("stable") is not None
        rows.append((c["canary"], c["stable"], c["stable"] * c["limit"] if c.get("limit") else None)
                    if ok and c is not None else None)
    values = [v for r in rows if r is not None for v in r[:3] if v is not None]
    if not values:
        return f'<p class="no-data" data-chart="{escape(name)}">no {escape(name)} numbers in any window</p>'
    n = len(windows)
    ax = Axes(-0.5, n - 0.5, nice_top(values))
    parts = [y_axis(ax, "s")]
    for role, idx in (("limit", 2), ("stable", 1), ("canary", 0)):
        pts = [(i, v) for i, r in enumerate(rows) if r is not None and (v := r[idx]) is not None]
        if len(pts) > 1:
            parts.append(f'<polyline class="series {role}" points="'
                         + " ".join(f"{ax.x(i):.1f},{ax.y(v):.1f}" for i, v in pts) + '"/>')
        for i, v in pts:
            title = f"{labels[i]}: {role} {fmt(v)}s"
            if role == "limit":
                parts.append(f'<line class="series limit" data-value="{fmt(v)}" x1="{ax.x(i) - 8:.1f}" '
                             f'x2="{ax.x(i) + 8:.1f}" y1="{ax.y(v):.1f}" y2="{ax.y(v):.1f}"><title>{escape(title)} '
                             f"(stable x limit)</title></line>")
            else:
                parts.append(f'<circle class="point {role}" data-value="{fmt(v)}" cx="{ax.x(i):.1f}" '
                             f'cy="{ax.y(v):.1f}" r="3.5"><title>{escape(title)}</title></circle>')
    step = max(1, math.ceil(n / 10))
    for i in range(0, n, step):
        parts.append(f'<text x="{ax.x(i):.1f}" y="{H - 16}" text-anchor="middle">{escape(labels[i])}</text>'
                     f'<text x="{ax.x(i):.1f}" y="{H - 4}" text-anchor="middle">{windows[i]["ended_at"][11:19]}'
                     "</text>")
    return svg(name, f"{name}: canary vs stable per window", "".join(parts))
