"""PNG plots with matplotlib (the ``plot`` extra): bench curves and tune's Pareto front."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError
from qlift.perf.bench import LevelResult


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
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def plot_levels(levels: Sequence[LevelResult], path: Path, *, title: str) -> None:
    """Output tok/s against p50 and p99 end-to-end latency, one point per concurrency level."""
    with _panel(path, title=title, xlabel="latency (s)") as ax:
        for pct, style in (("p50", "o-"), ("p99", "s--")):
            xs = [lv.latency_ms["e2el"][pct] / 1000 for lv in levels]
            ax.plot(xs, [lv.output_tokens_per_s for lv in levels], style, label=f"{pct} end-to-end latency")
        for lv in levels:
            ax.annotate(f"c={lv.concurrency}", (lv.latency_ms["e2el"]["p50"] / 1000, lv.output_tokens_per_s),
                        textcoords="offset points", xytext=(4, 4), fontsize=8)


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
