"""What a file stage's door gives the pipeline: a typed output (the model version a stage wrote, or eval's report)
and the stage's own result, journaled as JSON. Only a ``ModelOutput`` is a model: an eval's report directory is
never hashed as one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qlift import lineage
from qlift.models.ref import ModelRef

if TYPE_CHECKING:
    from qlift.eval.run import EvalResult
    from qlift.hub import DownloadResult
    from qlift.merge import MergeResult
    from qlift.models.gguf_import import ImportResult
    from qlift.quantize.api import QuantizeResult


@dataclass(frozen=True)
class ModelOutput:
    """A model version a stage wrote (merge, quantize, the base's import or download): its ref, hashed once."""

    ref: ModelRef

    @property
    def content_hash(self) -> str:
        return self.ref.content_hash

    @classmethod
    def written(cls, ref: ModelRef | None, out: Path) -> ModelOutput:
        """The ref the stage's result carries (hashed from the ``qlift.json`` it wrote); a stage whose result
        carries none (the built-in import) has its output hashed here, once."""
        return cls(ref if ref is not None else ModelRef.of(out))


@dataclass(frozen=True)
class EvalOutput:
    """An eval's report directory and the content hash of its files (what the journal checks a cached report
    against; the report's ``qlift.json`` records reused for files that did not change)."""

    report: Path
    content_hash: str

    @classmethod
    def of(cls, report: Path) -> EvalOutput:
        known = (lineage.read_manifest(report) or {}).get("outputs")
        return cls(report, lineage.content_hash(lineage.hash_files(report, known)))


StageOutput = ModelOutput | EvalOutput


def journaled_output(out: Path, content_hash: str, *, makes_model: bool) -> StageOutput:
    """The output of a stage the journal says finished, once its directory verified (nothing hashed again)."""
    return ModelOutput(ModelRef(base=out, adapters=(), content_hash=content_hash)) if makes_model \
        else EvalOutput(out, content_hash)


@dataclass(frozen=True)
class Ran:
    """What a file stage's door returns: its typed output and the stage's own result (journaled as JSON)."""

    output: StageOutput
    result: MergeResult | QuantizeResult | EvalResult | ImportResult | DownloadResult
