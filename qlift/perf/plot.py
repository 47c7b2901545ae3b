"""PNG plots with matplotlib (the ``plot`` extra): bench curves and tune's Pareto front."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError


def _pyplot():  # type: ignore[no-untyped-def]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BadInputError("--plot needs matplotlib", field="--plot",
                            hint="pip install 'qlift[plot]', or drop --plot.") from None
    return plt


@contextmanager
def _panel(path: Path, *, title: str, xlabel: str) -> Iterator[Any]:
    """One latency/throughput axes, labelled and saved to ``path`` when the block ends."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        yield ax
        ax.set_xlabel(xlabel)
        ax.set_ylabel("output tokens/s")
        ax.margins(x=0.15)  # room for the point labels: none is cut at the edge
        ax.set_ylim(0, max(ax.dataLim.y1, 0.0) * 1.12 or 1.0)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


MIN_P99_REQUESTS = 50  # fewer requests than this: a "p99" is one or two requests, so it is not drawn
_PANELS = (("ttft", "time to first token"), ("tpot", "time per output token"), ("e2el", "end-to-end latency"))


def _workload(w: dict[str, Any]) -> str:
    prompts = f"dataset {Path(str(w['dataset'])).name}" if w.get("dataset") else f"{w.get('input_tokens')} in"
    return f"{w.get('requests')} requests x ({prompts} / {w.get('output_tokens')} out), seed {w.get('seed')}"


def plot_bench(result: Any, path: Path, *, baseline: dict[str, Any] | None = None) -> None:
    """A ``qlift bench`` result on four panels against concurrency: output tok/s and goodput, then
    TTFT, TPOT and end-to-end latency (p50, and p99 where a level had enough requests) with the SLO
    as a line. Every y axis starts at 0; ``baseline`` (an earlier result) is drawn in grey."""
    plt = _pyplot()
    fig = plt.figure(figsize=(11, 7.5))
    try:
        draw_bench(fig, result, baseline)
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def draw_bench(fig: Any, result: Any, baseline: dict[str, Any] | None = None) -> None:
    levels = sorted(result.levels, key=lambda lv: lv.concurrency)
    base_levels = sorted((baseline or {}).get("levels", []), key=lambda lv: lv["concurrency"])
    xs = [lv.concurrency for lv in levels]
    axes = fig.subplots(2, 2)
    ax = axes[0][0]
    ax.plot(xs, [lv.output_tokens_per_s for lv in levels], "o-", label="output tok/s")
    slo = ", ".join(f"{k} <= {v:g} ms" for k, v in result.slo_ms.items())
    ax.plot(xs, [lv.goodput_output_tokens_per_s for lv in levels], "s--",
            label=f"goodput tok/s (SLO {slo})" if slo else "goodput tok/s (no SLO: every success)")
    if base_levels:
        ax.plot([b["concurrency"] for b in base_levels], [b["output_tokens_per_s"] for b in base_levels], "o:",
                color="grey", label="baseline output tok/s")
    _axes(ax, "throughput", "tokens/s", xs)
    thin = [lv.concurrency for lv in levels if lv.requests < MIN_P99_REQUESTS]
    for ax, (metric, name) in zip((axes[0][1], axes[1][0], axes[1][1]), _PANELS, strict=True):
        unit = 1000.0 if metric == "e2el" else 1.0  # end-to-end in seconds, the rest in ms
        ax.plot(xs, [lv.latency_ms[metric]["p50"] / unit for lv in levels], "o-", label="p50")
        p99 = [(lv.concurrency, lv.latency_ms[metric]["p99"] / unit) for lv in levels
               if lv.requests >= MIN_P99_REQUESTS]
        if p99:
            ax.plot([c for c, _ in p99], [v for _, v in p99], "s--", label="p99")
        if base_levels:
            ax.plot([b["concurrency"] for b in base_levels],
                    [b["latency_ms"][metric]["p50"] / unit for b in base_levels], "o:", color="grey",
                    label="baseline p50")
        if metric in result.slo_ms:
            limit = result.slo_ms[metric]
            ax.axhline(limit / unit, color="tab:red", linewidth=1, label=f"SLO {limit:g} ms")
        _axes(ax, name, "s" if unit > 1 else "ms", xs)
    title = f"{result.model} at {result.endpoint}: {_workload(result.workload)}\n{result.hardware['description']}"
    if baseline is not None:
        title += f"; grey: baseline {baseline.get('model')} ({baseline.get('date')})"
    if thin:
        title += f"; no p99 where a level had < {MIN_P99_REQUESTS} requests"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()


def _axes(ax: Any, title: str, ylabel: str, levels: list[int]) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("concurrency")
    ax.set_ylabel(ylabel)
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_pareto(points: Sequence[tuple[str, float, float, bool]], path: Path, *, title: str) -> None:
    """Each grid point as (label, p99 latency s, output tok/s, chosen); the Pareto front joined."""
    front: list[tuple[float, float]] = []
    for _, lat, tps, _ in sorted(points, key=lambda p: (p[1], -p[2])):
        if not front or tps > front[-1][1]:
            front.append((lat, tps))
    with _panel(path, title=title, xlabel="p99 end-to-end latency (s)") as ax:
        if front:
            ax.plot([f[0] for f in front], [f[1] for f in front], "-", color="grey", alpha=0.6, label="Pareto front")
        for label, lat, tps, chosen in points:
            ax.plot([lat], [tps], "*" if chosen else "o", markersize=14 if chosen else 7,
                    color="tab:red" if chosen else "tab:blue")
            ax.annotate(label, (lat, tps), textcoords="offset points", xytext=(4, 4), fontsize=7)
