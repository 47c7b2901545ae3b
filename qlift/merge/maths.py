"""The merge arithmetic, step for step as peft's ``merge`` does it.

Deltas are computed in fp32 (peft upcasts bf16/fp16 adapter weights on load) and
the result is cast back to the working dtype after each adapter, as peft's in-place
``weight.data += delta`` does. Each step mirrors the peft expression it names, so
results match ``merge_and_unload`` bit for bit where the operations are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from qlift.merge.adapter import LoraModule


@dataclass
class Replace:
    """A full tensor from the adapter (modules_to_save, saved embedding layers)."""

    tensor: torch.Tensor
    adapter: int


@dataclass
class Lora:
    lm: LoraModule
    fan_in_fan_out: bool
    adapter: int


@dataclass
class BiasAdd:
    """lora_bias: the B layer's bias times the scale, added to the base bias."""

    bias: torch.Tensor
    scale: float
    adapter: int


@dataclass
class Tokens:
    """trainable_token_indices: rows of the embedding replaced by the trained ones."""

    ids: list[int]
    rows: torch.Tensor
    adapter: int


Step = Replace | Lora | BiasAdd | Tokens


def _t(x: torch.Tensor, fan_in_fan_out: bool) -> torch.Tensor:
    return x.T if fan_in_fan_out else x


def delta_weight(step: Lora, device: torch.device) -> torch.Tensor:
    """peft's get_delta_weight, in fp32."""
    lm = step.lm
    assert lm.A is not None and lm.B is not None
    a = lm.A.to(device=device, dtype=_f32())
    b = lm.B.to(device=device, dtype=_f32())
    if lm.embedding:  # lora.Embedding: transpose(B @ A, True) * scaling
        return (b @ a).T * lm.scale
    return _t(b @ a, step.fan_in_fan_out) * lm.scale


def _f32() -> torch.dtype:
    import torch

    return torch.float32


CHUNK_BYTES = 1024 * 1024  # fp32 rows per block: small enough to stay in a core's L2


def _linear_chunked(w: torch.Tensor, step: Lora, device: torch.device, out: torch.Tensor | None) -> torch.Tensor:
    """lora.Linear.merge (weight.data += (B @ A) * scaling, in fp32), a block of rows at a time.

    Each output row depends only on its row of B, so blocks give peft's values while the
    fp32 temporaries stay in cache instead of streaming a full fp32 copy through memory.
    """
    import torch

    lm = step.lm
    assert lm.A is not None and lm.B is not None
    a = lm.A.to(device=device, dtype=torch.float32)
    b = lm.B.to(device=device, dtype=torch.float32)
    out = torch.empty_like(w) if out is None else out
    # On a GPU one product over the whole tensor: fewer launches, and the same shapes
    # (so the same cuBLAS kernels) as peft's own merge there.
    rows = max(1, CHUNK_BYTES // (4 * w.shape[1])) if w.device.type == "cpu" else w.shape[0]
    for r0 in range(0, w.shape[0], rows):
        d = b[r0:r0 + rows] @ a
        d.mul_(lm.scale)
        d.add_(w[r0:r0 + rows])
        out[r0:r0 + rows] = d
    return out


def apply_step(w: torch.Tensor, step: Step, device: torch.device, out: torch.Tensor | None = None) -> torch.Tensor:
    """One adapter step on ``w`` (working dtype, on ``device``); returns the new tensor.

    ``out`` (same shape and dtype, not aliasing ``w``) may receive the result to save an allocation."""
    import torch

    dtype = w.dtype
    if isinstance(step, Replace):
        return step.tensor.to(device=device, dtype=dtype)
    if isinstance(step, BiasAdd):
        return (w + step.bias.to(device=device, dtype=torch.float32) * step.scale).to(dtype)
    if isinstance(step, Tokens):
        idx = torch.tensor(step.ids, device=device)
        return w.index_copy(0, idx, step.rows.to(w))
    lm = step.lm
    if lm.magnitude is None and not lm.embedding and not step.fan_in_fan_out:
        return _linear_chunked(w, step, device, out)
    delta = delta_weight(step, device)
    if lm.magnitude is None:
        if lm.embedding:  # lora.Embedding.merge: weight += delta.to(orig_dtype)
            return w + delta.to(dtype)
        return (w + delta).to(dtype)  # lora.Linear.merge: weight.data += delta (fp32 maths)
    # DoRA (DoraLinearVariant / DoraEmbeddingVariant.merge_unsafe); the embedding
    # variant is a DoRA layer with fan_in_fan_out=True.
    fif = True if lm.embedding else step.fan_in_fan_out
    lora_weight = delta.T if lm.embedding else _t(delta, step.fan_in_fan_out)
    norm_in = _t(w, fif) + 1 * lora_weight
    weight_norm = torch.linalg.norm(norm_in, dim=1).to(norm_in.dtype)
    factor = lm.magnitude.to(device=device, dtype=torch.float32) / weight_norm
    factor = _t(factor.view(-1, 1), fif)
    return (factor * (w + delta)).to(dtype)
