"""``qlift eval --score-with-baseline``: the baseline reads the candidate, offline.

The rollout's ``stable_reads`` check (qlift.rollout.read_checks) scores both versions' answers under the stable
model; this is the same metric in an eval: each prompt's candidate answer and baseline answer, scored by the
baseline model as a reference after the prompt (the backends' reference scoring, the one ``ppl`` uses: one
prefill, ``max_tokens`` 1), as the mean negative log-likelihood per answer token. Reported as the two means, their
difference and its paired bootstrap 95% CI, and the prompts where the candidate's answer is the less likely one.
The scoring runs are cached as generations are.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qlift.eval.backend import Backend
    from qlift.eval.generation import EvalModel, Generation, GenerationCache, Request


def mean_nll(g: Generation) -> float | None:
    """The scored answer's mean negative log-likelihood per token (None: not scored, or empty)."""
    return -g.ref_logprob / g.ref_tokens if g.ref_logprob is not None and g.ref_tokens else None


def baseline_reads(baseline: EvalModel, requests: list[Request], answers: dict[str, list[Generation]],
                   backend: Backend, cache: GenerationCache, *, resamples: int, seed: int) -> dict[str, Any]:
    """Both roles' answers scored by ``baseline``; its summary (what the report and ``--json`` show)."""
    import numpy as np

    from qlift.eval.compare import finite
    from qlift.eval.generation import Sampling, cached_generate

    roles = ("candidate", "baseline")
    asked = [replace(r, reference=g.text) for role in roles for r, g in zip(requests, answers[role], strict=True)]
    scored, _ = cached_generate([baseline], asked, Sampling(max_tokens=1, seed=seed), backend, cache)
    nll = [mean_nll(g) for g in scored[baseline.role]]
    n = len(requests)
    keep = [i for i in range(n) if nll[i] is not None and nll[n + i] is not None]
    out: dict[str, Any] = {"model": baseline.name, "n": len(keep), "unscored": n - len(keep)}
    if not keep:
        return out
    cand = np.array([nll[i] for i in keep], dtype=float)
    base = np.array([nll[n + i] for i in keep], dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(keep), size=(resamples, len(keep)))
    lo, hi = np.percentile(cand[idx].mean(axis=1) - base[idx].mean(axis=1), [2.5, 97.5])
    return {**out, "candidate_nll": float(cand.mean()), "baseline_nll": float(base.mean()),
            "diff": float(cand.mean() - base.mean()), "ci95": [finite(float(lo)), finite(float(hi))],
            "candidate_less_likely": int((cand > base).sum())}


def describe(r: dict[str, Any]) -> str:
    """One line for the CLI and report.md."""
    if not r.get("n"):
        return f"baseline reads ({r['model']}): no answer scored (the backend gave no reference log-probabilities)"
    lo, hi = r["ci95"]
    ci = "-" if lo is None or hi is None else f"{lo:+.3f} to {hi:+.3f}"
    return (f"baseline reads ({r['model']}): mean NLL per answer token candidate {r['candidate_nll']:.3f} vs "
            f"baseline {r['baseline_nll']:.3f}, diff {r['diff']:+.3f} (95% CI {ci}) over "
            f"{r['n']} prompts; the candidate's answer less likely in {r['candidate_less_likely']}")
