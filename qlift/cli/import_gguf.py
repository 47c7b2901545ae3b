"""qlift import-gguf."""

from __future__ import annotations

from pathlib import Path

import click

from qlift.cli.output import emit, json_option


@click.command("import-gguf")
@click.argument("gguf_file", required=False, type=click.Path(path_type=Path))
@click.option("--builtin", type=click.Choice(["smollm2"]), help="Use a model shipped in an installed package.")
@click.option(
    "-o", "--output", type=click.Path(path_type=Path),
    help="Output directory (with --builtin and no -o: print the path of the cached copy).",
)
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@json_option
def import_gguf_cmd(gguf_file: Path | None, builtin: str | None, output: Path | None, force: bool) -> None:
    """Convert GGUF_FILE to a bf16 safetensors model directory.

    The result has the tokenizer, chat template and generation config, loads in
    transformers and vLLM, and carries a qlift.json lineage manifest.

    \b
    Examples:
      qlift import-gguf --builtin smollm2 -o smollm2   # SmolLM2-135M-Instruct, converted once and cached
      qlift import-gguf model.Q8_0.gguf -o model
    """
    from qlift.errors import BadInputError
    from qlift.models import gguf_import

    if (gguf_file is None) == (builtin is None):
        raise BadInputError("give either a GGUF_FILE or --builtin NAME", hint="See `qlift import-gguf --help`.")
    if builtin:
        if output is None:
            result = gguf_import.builtin_result(builtin)
        else:
            result = gguf_import.materialize_builtin(builtin, output, force=force)
    else:
        if output is None:
            raise BadInputError("missing -o/--output for the converted model", hint="Pass -o DIR.")
        assert gguf_file is not None
        result = gguf_import.import_gguf(gguf_file, output, force=force)

    def human() -> None:
        how = "from cache" if result.cached else f"in {result.seconds:.1f} s"
        click.echo(f"wrote {result.output} ({result.source}, {how})")

    emit(result, human)
