"""The stage table, at the bottom of ``qlift.release``: for each kind of release stage its own options class, its
version, what it makes, and which of its options the release itself decides. It imports no other module of the
release but the stage options; what runs each kind is keyed by the same enum above it: ``doors.FILE_DOORS``
(merge, quantize, eval) and ``livestages.LIVE_DOORS`` (serve, router, promote).

Adding a kind: its member here, its row, and its door in one of those two maps (a test checks every kind has one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from qlift.eval.options import EvalOptions
from qlift.merge.options import MergeOptions
from qlift.quantize.options import QuantizeOptions
from qlift.release.stage_options import RouterStageOptions, ServeStageOptions
from qlift.rollout.spec import PromoteOptions

StageOptions = MergeOptions | QuantizeOptions | EvalOptions | ServeStageOptions | RouterStageOptions | PromoteOptions


class StageKind(StrEnum):
    """A stage of the release file (its ``stage:``)."""

    MERGE = "merge"
    QUANTIZE = "quantize"
    EVAL = "eval"
    SERVE = "serve"
    ROUTER = "router"
    PROMOTE = "promote"


class BaseKind(StrEnum):
    """Where the base comes from (not a stage of the file: its own kinds)."""

    IMPORT = "import"  # a built-in, converted from its GGUF
    DOWNLOAD = "download"  # a hub repo at its revision
    PATH = "path"  # a directory on this machine: nothing to make


def _frozen(d: dict[str, str]) -> Mapping[str, str]:
    return MappingProxyType(d)


OUTPUTS = "outputs are the release's own"


@dataclass(frozen=True)
class KindRow:
    options: type[StageOptions]  # the stage's own options class: a file's `options:` are validated as it
    version: int  # bump when what it writes for the same inputs and options changes: its outputs are made again
    makes_model: bool = False  # its output is a model version later stages take as input
    takes_adapters: bool = False  # it works on the base with the release's adapters (merge)
    checks: bool = False  # its report holds the gates promote checks the candidate against (eval)
    live: bool = False  # runs as long as the release (serve, router) or drives traffic (promote); no files
    serves: bool = False  # a server of its input model: the other live stages' keys are made of its key
    moves_traffic: bool = False  # moves users between the versions (promote): its success ends the live stages
    # Fields of its options the release decides, with why: a file giving one is refused.
    managed: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    # Fields naming files, taken relative to the release file ('' and '-' as they are: a log off, or to its log).
    file_fields: tuple[str, ...] = ()


TABLE: Mapping[StageKind, KindRow] = MappingProxyType({
    StageKind.MERGE: KindRow(MergeOptions, 1, makes_model=True, takes_adapters=True,
                             managed=_frozen({"force": OUTPUTS})),
    StageKind.QUANTIZE: KindRow(QuantizeOptions, 1, makes_model=True, managed=_frozen({"force": OUTPUTS})),
    StageKind.EVAL: KindRow(EvalOptions, 1, checks=True, managed=_frozen({
        "report_dir": "the release writes the report beside its outputs", "force": OUTPUTS})),
    StageKind.SERVE: KindRow(ServeStageOptions, 1, live=True, serves=True, managed=_frozen({
        "host": "a server the release starts binds 127.0.0.1",
        "dry_run": "the release starts servers (`qlift release run --dry-run` plans)",
        "gpu": "the release serves on this machine's hardware",
        "gpus": "the release serves on this machine's hardware"})),
    StageKind.ROUTER: KindRow(RouterStageOptions, 1, live=True, managed=_frozen({
        "backends": "the release fills them: its stable and candidate servers",
        "host": "a router the release starts binds 127.0.0.1",
        "state_file": "the release's router starts with every request on the stable; weights kept from another run "
                      "would send users to a canary no promote step has judged"}),
        file_fields=("api_keys_file", "filter_file", "metrics_token_file", "state_file", "access_log")),
    StageKind.PROMOTE: KindRow(PromoteOptions, 1, live=True, moves_traffic=True, managed=_frozen(
        {k: "the release fills it from its serve and router stages"
         for k in ("stable", "canary", "router", "backends", "canary_model", "canary_hash")}
        | {"eval_report": "the release passes its eval stage's report"})),
})
# The base's own kinds (not stages of the file): their keys carry a version too.
BASE_VERSIONS = {BaseKind.IMPORT.value: 1, BaseKind.DOWNLOAD.value: 1}
STAGE_VERSIONS = BASE_VERSIONS | {kind.value: row.version for kind, row in TABLE.items()}
