"""qlift inspect."""

from __future__ import annotations

from pathlib import Path

import click

from qlift.cli.output import emit, human_bytes, json_option


def _params(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


@click.command("inspect")
@click.argument("model_dir", type=click.Path(path_type=Path))
@json_option
def inspect_cmd(model_dir: Path) -> None:
    """Describe MODEL_DIR without loading its weights.

    Reads config.json, the safetensors headers, the tokenizer and the lineage
    manifest (qlift.json).

    \b
    Examples:
      qlift inspect ./smollm2
      qlift inspect ./merged --json | jq .parameters
    """
    from qlift.models.report import inspect_model

    r = inspect_model(model_dir)

    def human() -> None:
        dtypes = ", ".join(f"{k} {_params(v)}" for k, v in r.weight_dtypes.items())
        rows = [
            ("path", r.path),
            ("architecture", f"{r.architecture} ({r.model_type})"),
            ("parameters", f"{_params(r.parameters)} ({r.parameters:,})"),
            ("weights", dtypes or "-"),
            ("layers / hidden", f"{r.num_layers} / {r.hidden_size}"),
            ("heads / kv heads", f"{r.num_attention_heads} / {r.num_key_value_heads}"),
            ("context", str(r.max_position_embeddings)),
            ("size on disk", human_bytes(r.size_on_disk)),
            ("shards", f"{len(r.shards)}: {', '.join(r.shards)}"),
            ("tied embeddings", "yes" if r.tied_embeddings else "no"),
            ("vocab / tokenizer", f"{r.vocab_size} rows / {r.tokenizer_length} tokens"),
            ("chat template", "yes" if r.has_chat_template else "no"),
            ("quantization", _quant(r.quantization)),
            ("lineage", " -> ".join(r.lineage) if r.lineage else "none (no qlift.json)"),
        ]
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            click.echo(f"{k.ljust(width)}  {v}")
        for w in r.warnings:
            click.echo(f"warning: {w}", err=True)

    emit(r, human)


def _quant(q: dict | None) -> str:  # type: ignore[type-arg]
    if not q:
        return "none"
    method = q.get("quant_method", "?")
    fmt = q.get("format")
    return f"{method} ({fmt})" if fmt else str(method)
