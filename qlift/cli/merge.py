"""qlift merge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from qlift.cli.options import click_options
from qlift.cli.output import emit, human_bytes, json_option
from qlift.merge.options import MergeOptions


@click.command("merge")
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("adapters", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Output model directory.")
@click_options(MergeOptions)
@json_option
def merge_cmd(base: Path, adapters: tuple[Path, ...], output: Path, **options: Any) -> None:
    """Merge LoRA ADAPTERS into the BASE model, one shard at a time.

    The arithmetic is peft's merge_and_unload (DoRA, rsLoRA, rank/alpha patterns,
    lora_bias, modules_to_save, trainable tokens, embedding LoRA), computed in fp32;
    several adapters apply in the order given. The output has config, tokenizer
    (from the adapter when it saved one), chat template, generation config, an index
    and a qlift.json lineage manifest. Nothing is written when a check fails.

    \b
    Examples:
      qlift merge ./Qwen2.5-1.5B-Instruct ./my-lora -o ./merged
      qlift merge ./base ./sft-lora ./dpo-lora -o ./merged --dtype bf16 --max-shard-size 2GB
      qlift merge ./base ./lora -o ./merged --no-verify --device cuda --json
    """
    from qlift import merge
    from qlift.models.ref import ModelRef

    inputs = merge.MergeInputs(base=ModelRef.at(base), adapters=list(adapters), output=output)
    r = merge.run(inputs, MergeOptions(**options))

    def human() -> None:
        click.echo(f"wrote {r.output}: {len(r.shards)} shard(s), {r.tensors} tensors "
                   f"({r.modified_tensors} changed by {r.adapter_modules} adapter modules), {r.dtype}")
        tie = "tied" if r.tie_word_embeddings else "untied"
        click.echo(f"vocab {r.vocab_size} rows, {tie} embeddings, tokenizer from {r.tokenizer_from}")
        click.echo(f"{r.wall_s:.1f} s, read {human_bytes(r.bytes_read)}, wrote {human_bytes(r.bytes_written)}, "
                   f"peak RSS {human_bytes(r.peak_rss_bytes)}")
        if r.verify is not None:
            v = r.verify
            click.echo(f"verify: max |logit delta| {v.max_abs_logit_delta:.3g} ({v.relative_delta:.3%}), "
                       f"greedy agreement {v.greedy_agreement:.1%} over {v.tokens} tokens")
        elif r.verify_not_run:
            click.echo("verify: not run (the warning above says why)")
        for n in r.notes:
            click.echo(f"note: {n}", err=True)

    emit(r, human)
