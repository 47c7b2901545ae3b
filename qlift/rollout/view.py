"""`qlift promote status` as text: one line per window with its verdict, then every check the judge ran
with its ratio against its limit and its verdict, then the window's notes, wrapped to the terminal.

Everything here reads the ``RolloutStatus`` that `status --json` prints (status.py), so the text and the
JSON never disagree; the HTML report (report.py) reads the same, and these cells. A journaled window or check is
a record (JSON values): its action and status are read through their enums (Phase, CheckStatus).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from qlift.quality.registry import ANSWER_METRICS
from qlift.rollout.checks import CheckStatus
from qlift.rollout.journal import journal_flag, with_journal
from qlift.rollout.states import Phase, State

if TYPE_CHECKING:
    from qlift.rollout.status import RolloutStatus

# a check's status, as a cell shows it
VERDICTS = {CheckStatus.PASS: "ok", CheckStatus.FAIL: "FAIL", CheckStatus.INCONCLUSIVE: "hold"}


def width() -> int:
    """The terminal's width, within reason (a pipe or a CI log gets 100)."""
    return max(72, min(140, shutil.get_terminal_size((100, 24)).columns))


def num(x: Any, spec: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "inf" if isinstance(x, float) and math.isinf(x) else "-"
    return format(x, spec)


# checks whose number is not the canary's own: what it is, shown before it
MEASURE_LABELS = {"judge": "loss-win"}


def measure(c: dict[str, Any]) -> str:
    """What a check compared against its limit: the canary/stable ratio (``1.20x/1.5``), else the canary's
    own number (requests, error rate, agreement) against the limit (``12/5``); '' when it has neither, or
    when both versions had none of what it counts."""
    limit = c.get("limit")
    ratio = c.get("ratio")
    if ratio is not None and c.get("canary") == 0 and c.get("stable") == 0:
        return ""  # none on either side (no answer cut, none empty): a ratio of 1 would say nothing
    if ratio is not None:
        shown = "inf" if math.isinf(ratio) else f"{ratio:.2f}x"  # inf: the stable had none at all
        return shown + ("" if limit is None else f"/{num(limit, 'g')}")
    if c.get("canary") is not None and limit is not None:
        label = MEASURE_LABELS.get(c["name"])
        return ("" if label is None else label + " ") + f"{num(c['canary'])}/{num(limit, 'g')}"
    if c.get("canary") is not None and c.get("stable") is not None:  # paired shares: no ratio, no limit
        return f"{num(c['canary'])} vs {num(c['stable'])}"
    return ""


def check_cell(c: dict[str, Any]) -> str:
    """``latency 1.20x/1.5 ok``: the check, its measure, its verdict (ok, hold, FAIL), and why a figure past its
    limit passed (``ttft 2.51x/1.5 ok (only +0.12s over the stable: within the 0.5s tolerance)``)."""
    status = CheckStatus(c["status"])
    why = pass_reason(c)
    return " ".join(p for p in (c["name"], measure(c), VERDICTS.get(status, status.value),
                                f"({why})" if why else "") if p)


AT_LEAST = frozenset({"agreement", "canary_requests"})  # checks whose figure must reach its limit, not stay under


def past_limit(c: dict[str, Any]) -> bool:
    """The check's shown figure is on the wrong side of its limit (a ratio over it, an agreement under it)."""
    limit = c.get("limit")
    if limit is None:
        return False
    if c.get("ratio") is not None:
        return bool(c["ratio"] > limit) and not (c.get("canary") == 0 and c.get("stable") == 0)
    if c.get("canary") is None:
        return False
    return bool(c["canary"] < limit) if c["name"] in AT_LEAST else bool(c["canary"] > limit)


def pass_reason(c: dict[str, Any]) -> str:
    """Why a check passed with its figure past its limit, from the judge's words; '' otherwise."""
    import re

    if CheckStatus(c["status"]) is not CheckStatus.PASS or not past_limit(c):
        return ""
    detail = str(c.get("detail") or "")
    canary, stable = c.get("canary"), c.get("stable")
    gap = canary - stable if isinstance(canary, int | float) and isinstance(stable, int | float) else None
    if m := re.search(r"\(within ([\d.eE+-]+)s\)", detail):
        over = "" if gap is None else f"only {gap:+.2g}s over the stable: "
        kind = "token-latency" if detail.startswith("token_latency") else c["name"]
        return f"{over}within --min-{kind}-increase-s {m.group(1)}"
    if m := re.search(r"less than ([\d.eE+-]+) higher", detail):
        over = "" if gap is None else f"share only {gap:+.2g} over the stable's: "
        return f"{over}under --min-share-increase {m.group(1)}"
    if m := re.search(r"a style", detail):
        p = re.search(r"p=([\d.eE+-]+)", detail)
        return "a style: each answer fits its own prompt better than others'" + (f", p={p.group(1)}" if p else "")
    if "leans to its own prompt" in detail:
        return "leans to its own prompt, no evidence against it"
    return detail.rsplit("; ", 1)[-1] if detail else "passed by the judge's test, not its ratio"


def check_cells(checks: list[dict[str, Any]]) -> list[str]:
    """Every judged check's cell; then the skipped ones (no data for them in this source), "skipped: " before the
    first, each a cell of its own so that a long list wraps between names."""
    cells = [check_cell(c) for c in checks if CheckStatus(c["status"]) is not CheckStatus.SKIPPED]
    skipped = [c["name"] for c in checks if CheckStatus(c["status"]) is CheckStatus.SKIPPED]
    return cells + ([f"skipped: {skipped[0]}", *skipped[1:]] if skipped else [])


def wrap_cells(cells: list[str], *, indent: str, cols: int, sep: str = " · ") -> list[str]:
    """Cells joined by ``sep``, broken between cells (never inside one) to fit ``cols``."""
    lines: list[str] = []
    line = indent
    for cell in cells:
        piece = cell if line.strip() == "" else sep + cell
        if line.strip() and len(line) + len(piece) > cols:
            lines.append(line)
            line = indent + "  " + cell
        else:
            line += piece
    if line.strip():
        lines.append(line)
    return lines


def wrap_text(text: str, *, indent: str, cols: int, first: str = "") -> list[str]:
    import textwrap

    return textwrap.wrap(text, cols, initial_indent=indent + first, subsequent_indent=indent + " " * len(first),
                         break_on_hyphens=False) or [indent + first.rstrip()]


def traffic(ev: dict[str, Any]) -> str:
    """``6 req, 0 err`` of one version in one window, or ``no requests``."""
    n = ev.get("requests")
    if not n:
        return "no requests"
    errors = ev.get("errors")
    return f"{n} req" + ("" if errors is None else f", {errors} err")


def span(w: dict[str, Any]) -> str:
    return f"{w['started_at'][11:19]}-{w['ended_at'][11:19]}"


def window_lines(w: dict[str, Any], cols: int) -> list[str]:
    """A window: when, its decision and traffic; every check; why (unless it passed); its notes."""
    head = (f"  {span(w)}  {w['action']:<8} canary {traffic(w['canary'])} · "
            f"stable {traffic(w['stable'])}")
    out = [head]
    out += wrap_cells(check_cells(w.get("checks") or []), indent="    ", cols=cols)
    if Phase(w["action"]) not in (Phase.PASS, Phase.ADVANCE):
        out += wrap_text(w["reason"], indent="    ", cols=cols, first="why: ")
    for note in w.get("notes") or []:
        out += wrap_text(note, indent="    ", cols=cols, first="note: ")
    return out


def compares_lines(st: RolloutStatus, cols: int) -> list[str]:
    """Each check the judge runs with its limits, one a line."""
    out = ["judge compares, canary vs stable:"]
    for c in st.compares:
        out += wrap_text(", ".join(f"{k} {v}" for k, v in c.get("limits", {}).items()), indent="  ", cols=cols,
                         first=f"{c['name']}: ")
    return out


def swapped(st: RolloutStatus) -> bool:
    """The rollout runs the other way round (after a promotion): its stable is the backend named `canary`."""
    return st.stable == "canary" or st.canary == "stable"


def role_words(text: str, st: RolloutStatus) -> str:
    """``text`` with the roles named by their backends where the roles are swapped, so that "100% stable" never
    reads as the backend named `stable` when that one is this rollout's canary."""
    if not swapped(st) or not text:
        return text
    stable, canary = f"'{st.stable}' (this rollout's stable)", f"'{st.canary}' (this rollout's canary)"
    for words, said in (("100% stable", f"100% on {stable}"), ("the canary has 100%", f"{canary} has 100%"),
                        ("the stable has 100%", f"{stable} has 100%"),
                        (f"canary {st.canary} at 100%", f"{canary} at 100%")):
        text = text.replace(words, said)
    return text


def down_line(st: RolloutStatus) -> str:
    """``canary DOWN: <the router's reason>`` and what the rollout does about it."""
    then = "rolled back" if st.state == State.ROLLED_BACK else \
        f"held, {st.errors} window(s) in a row; rolls back after consecutive_error_limit" if not st.final else "ended"
    return f"canary DOWN: {st.canary_down} -- the router keeps it out of rotation ({then})"


def head_lines(st: RolloutStatus) -> list[str]:
    quote = (lambda name: f"'{name}'") if swapped(st) else str
    weights = " / ".join(f"{quote(k)} {v}%" for k, v in (st.weights or {}).items()) or "-"
    pending = "" if st.weights_applied else " (journaled, not yet applied)"
    what = (f"canary {quote(st.canary)} over stable {quote(st.stable)} (roles swapped: the backend named "
            f"'{st.stable}' is this rollout's stable)") if swapped(st) else f"{st.canary} over {st.stable}"
    out = [f"rollout {st.id}: {what} -- {st.state}, weights {weights}{pending}",
           f"  {role_words(with_journal(st.state_doc, st.journal), st)}"]
    ctl = st.controller
    flag = journal_flag(st.journal)
    if ctl.alive:
        beat = "" if ctl.heartbeat_age_s is None else f", last heartbeat {ctl.heartbeat_age_s:.0f}s ago"
        out.append(f"controller: pid {ctl.pid} running{beat}" + (" (stalled?)" if ctl.stalled else ""))
    elif st.state == State.BAKED:  # the controller's work is done: the stable waits for an operator
        out.append(f"controller: none needed -- the bake passed; `qlift promote finish{flag}` releases the stable, "
                   f"`qlift promote abort{flag}` returns every user to it")
    elif not st.final:
        stopped = "" if st.interrupted is None else f" ({st.interrupted.line()})"
        out.append(f"controller: none running{stopped} -- nothing advances or watches this rollout; "
                   f"`qlift promote resume{flag}` runs one, `qlift promote abort{flag}` restores the stable")
    if st.live is not None:
        out += live_lines(st, quote)
    if st.canary_down is not None:
        out.append(down_line(st))
    if st.abort_not_journaled:
        out.append("abort: applied to the data plane while the journal was full, not journaled yet -- free disk "
                   f"space and run `qlift promote abort{flag}` again")
    for i in st.interruptions:
        if i is not st.interrupted:
            out.append(f"controller {i.line()}")
    if st.drifts or st.webhook_failures:
        out.append(f"events: {st.drifts} weight drift(s) re-applied, {st.webhook_failures} webhook failure(s)")
    return out


def live_lines(st: RolloutStatus, quote: Callable[[str], str]) -> list[str]:
    """What the router holds now, one line; a fleet's: one line per router (or why none could be listed)."""
    assert st.live is not None

    def line(url: str, weights: dict[str, int] | None, error: Any) -> str:
        now = ("does not answer: " + str(error)) if weights is None else \
            "holds " + " / ".join(f"{quote(k)} {v}%" for k, v in weights.items())
        differs = weights is not None and st.weights is not None and \
            any(weights.get(k) != v for k, v in st.weights.items())
        return f"router {url} now {now}" + (" (not the journal's weights)" if differs else "")

    routers = st.live.get("routers")
    if routers is None:
        return [line(st.live["url"], st.live["weights"], st.live["error"])]
    if not routers:
        return [f"{st.live['url']} could not be listed: {st.live['error']}"]
    return [line(url, r["weights"], r["error"]) for url, r in routers.items()]


def status_lines(st: RolloutStatus, cols: int | None = None) -> list[str]:
    """The whole text status: head, what the judge compares, the shadow phase, each step and its windows."""
    cols = cols or width()
    out = head_lines(st) + compares_lines(st, cols)
    out += wrap_text(st.answer_checks["note"], indent="", cols=cols,
                     first=f"the {len(ANSWER_METRICS)} answer checks run in: ")
    if st.shadow:
        spec = st.shadow.spec
        out.append(f"shadow phase: {spec['percent']}% of requests mirrored to the canary, "
                   f"{spec['windows']} passing window(s) to leave it")
        for w in st.shadow.windows:
            out += window_lines(w, cols)
    for s in st.steps:
        outcome = s.outcome or ("running" if s.started_at else "not reached" if st.final else "not started")
        line = f"step {s.index + 1}/{len(st.steps)}, canary {s.weight}%: {outcome}"
        if s.weight == 100 and not s.windows and outcome != "not reached":
            out += wrap_text(s.judged, indent="", cols=cols, first=line + " -- ")
            continue
        out.append(line)
        for w in s.windows:
            out += window_lines(w, cols)
    out += bake_lines(st, cols)
    if st.reason:
        out += wrap_text(role_words(st.reason, st), indent="", cols=cols, first="reason: ")
    # a window's or the rollout's reason may name a command (`qlift promote resume`): with this journal's flag
    return [with_journal(line, st.journal) for line in out] + example_lines(st, cols)


def bake_lines(st: RolloutStatus, cols: int) -> list[str]:
    """The bake after 100% (--bake): where it stands, windows left, the stable's kept figures, each window."""
    b = st.bake
    if b is None:
        return []
    left = f", {b.left} left" if b.left else ""
    out = wrap_text(b.judged, indent="", cols=cols,
                    first=f"bake at 100%: {b.phase} -- {b.passed}/{b.required} window(s) passed{left}; ")
    if b.baseline is not None:
        out += wrap_text(f"{traffic(b.baseline)}, latency p50 {num(b.baseline.get('latency_p50'))}s, "
                         f"error rate {num(b.baseline.get('error_rate'))}", indent="  ", cols=cols,
                         first="stable's kept figures: ")
    for w in b.windows:
        out += window_lines(w, cols)
    return out


def failed_examples(st: RolloutStatus) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(window, check) for each failed check that kept answers: what a person reads before trusting it."""
    windows = (st.shadow.windows if st.shadow else []) + [w for s in st.steps for w in s.windows]
    windows += st.bake.windows if st.bake else []
    return [(w, c) for w in windows for c in w.get("checks") or []
            if CheckStatus(c["status"]) is CheckStatus.FAIL and c.get("examples")]


def example_lines(st: RolloutStatus, cols: int) -> list[str]:
    out = []
    for w, c in failed_examples(st):
        out.append(f"{c['name']} examples ({w['started_at'][11:19]} window):")
        for e in c["examples"]:
            out += wrap_text(str(e["prompt"]), indent="  ", cols=cols, first="prompt: ")
            out += wrap_text(str(e["answer"]), indent="    ", cols=cols, first="canary: ")
            if e.get("evidence"):
                out += wrap_text(str(e["evidence"]), indent="    ", cols=cols, first="why: ")
            if e.get("other") is not None:
                out += wrap_text(str(e["other"]), indent="    ", cols=cols, first="stable: ")
    return out


def log_window(what: str, action: str, reason: str, checks: list[Any]) -> None:
    """A judged window's two lines on stderr (`promote start`): what it saw and decided, then the checks that
    held or failed, latency and TTFT always, and how many more passed (`status` shows every one)."""
    import logging
    from dataclasses import asdict

    log = logging.getLogger("qlift.rollout.controller")
    log.info("%s: %s (%s)", what, action, reason)
    shown = [c for c in checks if c.name in ("latency", "ttft") or c.status in (CheckStatus.FAIL,
                                                                                 CheckStatus.INCONCLUSIVE)]
    rest = sum(1 for c in checks if c.status is CheckStatus.PASS and c not in shown)
    if shown or rest:
        log.info("  %s", " · ".join([check_cell(asdict(c)) for c in shown] + ([f"{rest} more ok"] if rest else [])))
