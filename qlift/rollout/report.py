"""`qlift promote report`: one rollout of the journal as a self-contained HTML page (inline CSS and SVG, no
script, nothing fetched), in the style of eval's report.html, for a change ticket.

It reads the typed ``RolloutStatus`` that `promote status --json` prints (``status.rollout_status``), so
the page shows the journal's numbers and nothing else: the weights over time, each window's verdict,
canary vs stable per-token latency and TTFT with the limits, each check's measure per window, the reason
the rollout ended, and the answers the answer checks kept (the router redacted secrets before they
reached the journal). Every journal text is escaped.
"""

from __future__ import annotations

import os
import tempfile
from html import escape
from pathlib import Path
from typing import Any

from qlift.eval.html import _CSS as EVAL_CSS
from qlift.rollout import report_svg as charts
from qlift.rollout.checks import CheckStatus
from qlift.rollout.states import State
from qlift.rollout.status import RolloutStatus
from qlift.rollout.view import VERDICTS, down_line, live_lines, measure, num, pass_reason, role_words, traffic

CSS = EVAL_CSS + """
.rollout-chart .grid{stroke:#eee}.rollout-chart polyline{fill:none;stroke-width:2}
.weight.canary,.series.canary{stroke:#3b6fd8}.series.stable{stroke:#777}.series.limit{stroke:#b3261e;
stroke-dasharray:5 4;stroke-width:1.5}.point.canary{fill:#3b6fd8}.point.stable{fill:#777}.change{fill:#3b6fd8}
.shadow-phase{fill:#ede7f6}.verdict.advance{fill:#137333}.verdict.pass{fill:#5bb974}.verdict.hold{fill:#f9ab00}
.verdict.pause{fill:#9aa0a6}.verdict.rollback{fill:#b3261e}svg text.on-verdict{fill:#fff;font-weight:bold}
.legend span{margin-right:1.2em}.key{display:inline-block;width:14px;height:3px;vertical-align:middle;
margin-right:4px}.key.canary{background:#3b6fd8}.key.stable{background:#777}.key.limit{background:#b3261e}
td.check.ok{background:#e6f4ea}td.check.hold{background:#fef7e0}td.check.FAIL{background:#fdf0ef;
color:#b3261e;font-weight:bold}td.check.skipped{color:#999}.state{font-size:1.1em;padding:8px 12px;
border-radius:6px;border:2px solid #ddd}.state.promoted,.state.baked,.state.finished{border-color:#137333;
background:#e6f4ea}.bake-phase{fill:#e6f4ea}
.state.rolled_back{border-color:#b3261e;background:#fdf0ef}.scroll{overflow-x:auto}
"""
STATE_WORDS = {State.PROMOTED: "PROMOTED", State.ROLLED_BACK: "ROLLED BACK", State.ABORTED: "ABORTED",
               State.BAKING: "BAKING", State.BAKED: "BAKED", State.FINISHED: "FINISHED"}


def windows_of(st: RolloutStatus) -> tuple[list[dict[str, Any]], list[str]]:
    """Every judged window in order (the shadow phase first) and a short label for each."""
    windows, labels = [], []
    for i, w in enumerate(st.shadow.windows if st.shadow else []):
        windows.append(w)
        labels.append(f"shadow {i + 1}")
    for s in st.steps:
        for i, w in enumerate(s.windows):
            windows.append(w)
            labels.append(f"{s.weight}%" + (f" #{i + 1}" if len(s.windows) > 1 else ""))
    for i, w in enumerate(st.bake.windows if st.bake else []):
        windows.append(w)
        labels.append(f"bake {i + 1}")
    return windows, labels


def _bake(st: RolloutStatus) -> str:
    """The bake after 100%: where it stands, windows left, and the stable's kept figures it was judged against."""
    b = st.bake
    if b is None:
        return ""
    kept = "" if b.baseline is None else (
        f" The stable's figures it is judged against: {escape(traffic(b.baseline))}, error rate "
        f"{escape(num(b.baseline.get('error_rate')))}, latency p50 {escape(num(b.baseline.get('latency_p50')))}s "
        f"({escape(str(b.baseline.get('note', '')))}).")
    return (f'<h2>Bake after 100%</h2><p class="bake" data-phase="{escape(b.phase)}" data-left="{b.left}">'
            f"<b>{escape(b.phase)}</b>: {b.passed}/{b.required} window(s) passed, {b.left} left; "
            f"{escape(b.judged)}.{kept}</p>")


def _check_table(windows: list[dict[str, Any]], labels: list[str]) -> str:
    names = list(dict.fromkeys(c["name"] for w in windows for c in w.get("checks") or []))
    head = "<tr><th>check</th>" + "".join(
        f'<th title="{w["started_at"][11:19]}-{w["ended_at"][11:19]}">{escape(label)}<br>'
        f'<small>{escape(w["action"])}</small></th>' for w, label in zip(windows, labels, strict=True)) + "</tr>"
    rows = []
    for name in names:
        cells = []
        for w in windows:
            c = next((c for c in w.get("checks") or [] if c["name"] == name), None)
            if c is None:
                cells.append('<td class="check none">-</td>')
                continue
            status = CheckStatus(c["status"])
            verdict = VERDICTS.get(status, status.value)
            p = "" if c.get("p_value") is None else f"<br><small>p={c['p_value']:.3g}</small>"
            p += f"<br><small>{escape(why)}</small>" if (why := pass_reason(c)) else ""
            cells.append(f'<td class="check {escape(verdict)}" data-check="{escape(name)}" '
                         f'title="{escape(c["detail"])}">{escape(measure(c))} {escape(verdict)}{p}</td>')
        rows.append(f"<tr><td>{escape(name)}</td>{''.join(cells)}</tr>")
    return f'<div class="scroll"><table class="checks">{head}{"".join(rows)}</table></div>'


def _window_table(windows: list[dict[str, Any]], labels: list[str]) -> str:
    head = ("<tr><th>window</th><th>time (UTC)</th><th>decision</th><th>canary</th><th>stable</th>"
            "<th>reason</th><th>notes</th></tr>")
    rows = [f'<tr class="window {escape(w["action"])}"><td>{escape(label)}</td>'
            f'<td>{w["started_at"][11:19]}-{w["ended_at"][11:19]}</td><td>{escape(w["action"])}</td>'
            f"<td>{escape(traffic(w['canary']))}</td><td>{escape(traffic(w['stable']))}</td>"
            f"<td>{escape(w['reason'])}</td><td>{'<br>'.join(escape(n) for n in w.get('notes') or [])}</td></tr>"
            for w, label in zip(windows, labels, strict=True)]
    return f'<table class="windows">{head}{"".join(rows)}</table>'


def worst_examples(windows: list[dict[str, Any]], labels: list[str], per_check: int = 5
                   ) -> list[tuple[str, str, dict[str, Any]]]:
    """(check, window label, example) of the answers the answer checks kept: failing windows first, each
    answer once, at most ``per_check`` a check."""
    found: dict[str, list[tuple[bool, str, dict[str, Any]]]] = {}
    for w, label in zip(windows, labels, strict=True):
        for c in w.get("checks") or []:
            for e in c.get("examples") or []:
                found.setdefault(c["name"], []).append((CheckStatus(c["status"]) != CheckStatus.FAIL, label, e))
    out = []
    for name, rows in found.items():
        seen: set[tuple[Any, Any]] = set()
        kept = []
        for _, label, e in sorted(rows, key=lambda r: r[0]):  # stable sort: failing first, then in order
            if (e.get("prompt"), e.get("answer")) not in seen:
                seen.add((e.get("prompt"), e.get("answer")))
                kept.append((name, label, e))
        out += kept[:per_check]
    return out


def _examples(windows: list[dict[str, Any]], labels: list[str]) -> str:
    rows = [f'<tr class="example" data-check="{escape(name)}"><td>{escape(name)}</td><td>{escape(label)}</td>'
            f"<td><pre>{escape(str(e.get('prompt') or ''))}</pre></td>"
            f'<td class="output candidate"><pre>{escape(str(e.get("answer") or ""))}</pre></td>'
            f'<td class="output baseline"><pre>{escape(str(e.get("other") or "-"))}</pre></td></tr>'
            for name, label, e in worst_examples(windows, labels)]
    if not rows:
        return "<p>No answer check kept an example: no flagged answer in any window.</p>"
    head = "<tr><th>check</th><th>window</th><th>prompt</th><th>canary's answer</th><th>stable's answer</th></tr>"
    return f'<table class="examples">{head}{"".join(rows)}</table>'


def _decisions(st: RolloutStatus) -> str:
    rows = [f'<tr><td>{d["at"][:19].replace("T", " ")}</td><td>{escape(d["action"])}'
            f'{" (manual)" if d["manual"] else ""}</td><td>{escape(d["reason"])}</td></tr>' for d in st.decisions]
    return ('<table class="decisions"><tr><th>at (UTC)</th><th>decision</th><th>reason</th></tr>'
            f'{"".join(rows)}</table>')


def _compares(st: RolloutStatus) -> str:
    rows = [f"<tr><td>{escape(c['name'])}</td><td>{escape(', '.join(f'{k} {v}' for k, v in c['limits'].items()))}"
            f"</td><td>{escape(str(c['statistic']))}</td></tr>" for c in st.compares]
    return ("<table class=compares><tr><th>check</th><th>limits</th><th>decided by</th></tr>"
            f"{''.join(rows)}</table>")


def _latency_title(windows: list[dict[str, Any]]) -> str:
    details = [c["detail"] for w in windows for c in w.get("checks") or [] if c["name"] == "latency"]
    return "per-token latency" if any("token_latency" in d for d in details) else "latency"


def _interruptions(st: RolloutStatus) -> str:
    """The controller's stops and resumes (SIGTERM, Ctrl-C, a kill), and the router's weights while none runs."""
    rows = [f'<li class="interruption">controller {escape(i.line())}</li>' for i in st.interruptions]
    if st.live is not None:  # one line per router of a fleet
        rows += [f'<li class="live">{escape(line)}</li>' for line in live_lines(st, lambda name: name)]
    if not rows:
        return ""
    return "<h2>Interruptions</h2><ul class=interruptions>" + "".join(rows) + "</ul>"


def _down(st: RolloutStatus) -> str:
    """The router's reason, where the last window found the canary out of rotation."""
    if st.canary_down is None:
        return ""
    return f'<p class="state rolled_back canary-down" data-canary-down="1"><b>{escape(down_line(st))}</b></p>'


def render_report(st: RolloutStatus) -> str:
    windows, labels = windows_of(st)
    state = st.state.value
    title = f"{escape(st.canary)} over {escape(st.stable)}"
    weights = " / ".join(f"{escape(k)} {v}%" for k, v in (st.weights or {}).items()) or "-"
    legend = ('<p class="legend"><span><i class="key canary"></i>canary</span><span><i class="key stable"></i>'
              'stable</span><span><i class="key limit"></i>limit: stable x the check\'s ratio limit</span></p>')
    shadow = st.shadow
    lead = (f"Rollout {st.id} from <code>{escape(st.journal)}</code>, started {st.created_at[:19]} UTC, "
            f"last change {st.updated_at[:19]} UTC; steps {', '.join(str(s.weight) + '%' for s in st.steps)}"
            + (f" after a shadow phase ({shadow.spec['percent']}% mirrored)" if shadow else "")
            + (f", then a bake of {st.bake.required} window(s) at 100%" if st.bake else "")
            + f"; weights now {weights}.")
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>qlift promote: {title}</title><style>{CSS}</style></head><body>"
        f"<h1>qlift promote: {title}</h1><p>{lead}</p>"
        f'<p class="state {escape(state)}" data-state="{escape(state)}"><b>{STATE_WORDS.get(st.state, escape(state))}'
        f'</b>: <span class="reason">{escape(role_words(st.reason or st.state_doc, st))}</span></p>'
        + _interruptions(st) + _down(st)
        + "<h2>Weights over time</h2><p>The canary's share of users; dots under the axis: each judged window's "
        "verdict where it ended.</p>" + charts.weights_chart(st, windows)
        + "<h2>Window verdicts</h2>" + charts.verdict_strip(windows, labels) + _bake(st)
        + f"<h2>Canary vs stable</h2>{legend}<div class=charts>"
        + f'<div class="chart"><h3>{_latency_title(windows)} (s, the judge\'s quantile)</h3>'
        + charts.compared_chart("latency", windows, labels) + "</div>"
        + '<div class="chart"><h3>TTFT of streamed requests (s)</h3>'
        + charts.compared_chart("ttft", windows, labels) + "</div></div>"
        + "<h2>Every check, every window</h2><p>Canary/stable ratio against its limit (or the canary's number "
        "against it), the verdict (ok, hold: not yet shown either way, FAIL), and a one-sided test's p where "
        "one ran. Hover a cell for the judge's words.</p>" + _check_table(windows, labels)
        + "<h2>Windows</h2>" + _window_table(windows, labels)
        + "<h2>Worst examples</h2><p>Answers the answer checks flagged (failing windows first), with the "
        "stable's answer to the same prompt where the shadow phase had one.</p>" + _examples(windows, labels)
        + "<h2>Decisions</h2>" + _decisions(st)
        + "<h2>What the judge compares</h2>" + _compares(st)
        + "</body></html>\n"
    )


def write_report(out: Path, journal: Path | None, rollout_id: int | None = None, *, force: bool = False
                 ) -> dict[str, Any]:
    """Render the rollout into ``out`` atomically; an existing ``out`` only with ``force``."""
    from qlift.errors import BadInputError, OutputExistsError
    from qlift.fsutil import check_output_path, rename_noreplace
    from qlift.rollout.api import default_journal
    from qlift.rollout.status import rollout_status

    path = Path(journal or default_journal())
    check_output_path(out, force=force, inputs=[path])
    if out.is_dir():
        raise BadInputError(f"{out} is a directory; the report is one file", hint="Pass a file path to -o.")
    st = rollout_status(path, rollout_id)
    page = render_report(st)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it 0600; a report is for sharing
        if force:
            os.replace(tmp, out)
        else:
            try:
                rename_noreplace(Path(tmp), out)
            except FileExistsError:
                raise OutputExistsError(out) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return {"report": str(out), "journal": str(path), "rollout": st.id, "state": st.state,
            "reason": st.reason, "windows": len(windows_of(st)[0]), "bytes": len(page.encode())}
