"""The release file (``release.yaml``): a base, adapters, and a list of stages with their options.

Each stage's ``options`` are validated as its kind's options class in the stage table
(``qlift.release.kinds.TABLE``): ``MergeOptions``, ``QuantizeOptions``, ``EvalOptions`` (the
dataclasses the commands take), ``PromoteOptions`` for promote (the release adds its versions, router
and eval report when it runs: a ``RolloutSpec``); a serve stage's ``ServeStageOptions`` is ``qlift serve``'s
own ``ServeOptions`` plus the release's fields, and a router stage's ``RouterStageOptions`` is ``qlift router``'s
own ``RouterConfig`` (its backends filled in from the serve stages) plus the release's. Fields the release
itself decides (outputs, ``force``, the names and URLs of the versions, a server's host) are refused with a
line saying so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, Field, JsonValue, TypeAdapter, ValidationError, model_validator

from qlift.errors import BadInputError
from qlift.loaders import read_yaml, validated, validation_error
from qlift.models.ref import AdapterRef
from qlift.options import field_flag
from qlift.release.kinds import TABLE, StageKind, StageOptions
from qlift.release.stage_options import (
    CANARY,
    STABLE,
    LoadOptions,
    RouterStageOptions,
    ServeStageOptions,
    StrictModel,
)
from qlift.rollout.spec import PromoteOptions

__all__ = ["LoadOptions", "Release", "RouterStageOptions", "ServeStageOptions", "Stage", "StageKind",
           "json_schema", "load_release"]
HINT = "Fix the release file; `qlift release schema` prints every field."


class BaseSource(StrictModel):
    """Where the base model comes from: exactly one of builtin, path, hub."""

    builtin: Literal["smollm2"] | None = Field(None, description="A model qlift ships (converted from its GGUF).")
    path: Path | None = Field(None, description="A model directory on this machine (relative to the file).")
    hub: str | None = Field(None, description="A hub repo id, e.g. Qwen/Qwen2.5-0.5B-Instruct (needs revision).")
    revision: str | None = Field(None, description="The hub revision: a commit sha pins it.")
    source: Literal["hf", "modelscope"] = Field("hf", description="Which hub.")

    @model_validator(mode="after")
    def _one(self) -> BaseSource:
        given = [k for k in ("builtin", "path", "hub") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of builtin, path, hub (got {', '.join(given) or 'none'})")
        if self.hub and not self.revision:
            raise ValueError("a hub base needs a revision (a commit sha pins it)")
        return self


class StageEntry(StrictModel):
    stage: StageKind = Field(description="Which stage: merge, quantize, eval, serve, router, promote.")
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                             description="Unique name (default: the stage); outputs are named after it.")
    input: str | None = Field(None, description="The model this stage works on: 'base' or an earlier stage's "
                                                "name (default: the latest model made, else the base).")
    options: dict[str, object] = Field({}, description="The stage's own options model (see the schema).")
    load: LoadOptions | None = Field(None, description="promote only: generate traffic while it runs.")
    next: str | None = Field(None, description="promote only: the next release on the running router (router url:), "
                                               "rolled out over whatever holds 100% of it: NAME (the candidate serve "
                                               "stage's server, added to the router as backend NAME) or "
                                               "NAME=URL[#MODEL] (no candidate serve stage), as `qlift promote start "
                                               "--next` takes it.")
    only_if_served: bool = Field(False, description="Run only where a serve stage serves this model (for an eval: "
                                                    "the model it evaluates), e.g. after a serve fallback.")


class ReleaseFile(StrictModel):
    name: str = Field("release", description="Name of the release (shown in status).")
    out: Path = Field(Path("release-out"), description="Where outputs and the journal go (relative to the file).")
    base: BaseSource
    adapters: list[AdapterRef] = Field([], description="LoRA adapters on the base, in order (paths relative to "
                                                       "the file).")
    stages: list[StageEntry] = Field(min_length=1)


T = TypeVar("T")


@dataclass(frozen=True)
class Stage:
    """One stage of a loaded release: its kind, name, input and its options, of its stage's own options class."""

    kind: StageKind
    name: str
    input: str
    options: StageOptions
    load: LoadOptions | None = None
    only_if_served: bool = False
    next: str | None = None  # promote: NAME or NAME=URL[#MODEL], the next release on the running router

    @property
    def next_url(self) -> bool:
        """Whether ``next`` names its server (NAME=URL[#MODEL]) rather than the candidate serve stage's."""
        return self.next is not None and "=" in self.next

    def opts(self, cls: type[T]) -> T:
        """The options, as the class its kind has (a stage of another kind is a bug)."""
        if not isinstance(self.options, cls):
            raise TypeError(f"stage '{self.name}' ({self.kind}) has {type(self.options).__name__}, not {cls.__name__}")
        return self.options


@dataclass(frozen=True)
class Release:
    file: Path
    name: str
    out: Path
    base: BaseSource
    adapters: tuple[AdapterRef, ...]
    stages: tuple[Stage, ...]
    out_from: str = "out"  # what set ``out``, for its errors: the file's field, or --out

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)


def load_release(path: Path) -> Release:
    """Read and validate ``path``: one BadInputError naming the file, the stage and the field."""
    path = Path(path)
    raw = validated(ReleaseFile, read_yaml(path, hint=HINT), path=path, hint=HINT)
    here = path.resolve().parent
    adapters = tuple(AdapterRef(name=a.name, path=here / a.path) for a in raw.adapters)
    base = raw.base.model_copy(update={"path": here / raw.base.path}) if raw.base.path else raw.base
    stages: list[Stage] = []
    models = ["base"]
    for i, entry in enumerate(raw.stages):
        name = entry.name or entry.stage
        where = f"{path}: stage '{name}' ({entry.stage})"
        if name == "base" or any(s.name == name for s in stages):
            raise BadInputError(f"the name '{name}' is taken", path=f"{path}: stage {i + 1}", field="name",
                                hint="Give each stage a unique name (not 'base').")
        if entry.input is not None and entry.input not in models:
            raise BadInputError(f"'{entry.input}' is not the base or an earlier model stage ({', '.join(models)})",
                                path=where, field="input", hint=HINT)
        kind = TABLE[entry.stage]
        if entry.load is not None and not kind.moves_traffic:
            raise BadInputError("only a promote stage takes load", path=where, field="load", hint=HINT)
        default_input = "base" if kind.serves and entry.options.get("role") == "stable" else models[-1]
        options = stage_options(entry.stage, entry.options, where=where, here=here, models=models)
        if isinstance(options, ServeStageOptions) and options.fallback is not None and options.fallback not in models:
            raise BadInputError(f"'{options.fallback}' is not the base or an earlier model stage", path=where,
                                field="options.fallback", hint=HINT)
        if kind.takes_adapters and not adapters:
            raise BadInputError("a merge stage needs adapters", path=path, field="adapters",
                                hint="List the LoRA adapters under `adapters:` (name and path).")
        load = entry.load.model_copy(update={"prompts": here / entry.load.prompts}) if entry.load else None
        if entry.only_if_served and kind.live:
            raise BadInputError("only a merge, quantize or eval stage takes only_if_served", path=where,
                                field="only_if_served", hint=HINT)
        if entry.next is not None:
            _check_next(entry.next, kind.moves_traffic, where)
        stages.append(Stage(entry.stage, name, entry.input or default_input, options, load, entry.only_if_served,
                            entry.next))
        if kind.makes_model:
            models.append(name)
    _check_flow(stages, path)
    return Release(path, raw.name, (here / raw.out).resolve(), base, adapters, tuple(stages),
                   out_from=f"{path}: field 'out'")


def stage_options(kind: StageKind, data: dict[str, object], *, where: str, here: Path,
                  models: list[str]) -> StageOptions:
    """``data`` validated as ``kind``'s options model (paths made relative to the file's directory)."""
    row = TABLE[kind]
    for key in data:
        if key in row.managed:
            raise BadInputError(f"set by the release ({row.managed[key]})", path=where, field=f"options.{key}",
                                hint="Remove it from the file.")
    data = {key: str(here / value) if key in row.file_fields and isinstance(value, str)
            and value not in ("", "-") else value for key, value in data.items()}
    if dataclasses.is_dataclass(row.options):
        return _dataclass_options(kind, row.options, data, where=where, here=here, models=models)
    options: StageOptions = validated(row.options, data, path=where, prefix="options", hint=HINT)
    if isinstance(options, PromoteOptions):
        try:  # the versions are the release's router's backend names; its URL is known once it runs
            options.check_versions(STABLE, CANARY, {})
        except ValueError as exc:
            raise BadInputError(str(exc), path=where, field="options", hint=HINT) from None
    return options


def _dataclass_options(kind: StageKind, model: type, data: dict[str, object], *, where: str, here: Path,
                       models: list[str]) -> StageOptions:
    names = {f.name for f in dataclasses.fields(model)}
    for key in data:
        if key not in names:
            raise BadInputError(f"unknown field (one of: {', '.join(sorted(names - set(TABLE[kind].managed)))})",
                                path=where, field=f"options.{key}", hint=HINT)
    data = dict(data)
    for key in ("prompts", "calib"):
        if isinstance(value := data.get(key), str):
            data[key] = str(here / value)
    if isinstance(loras := data.get("loras"), dict):  # a serve stage's --lora adapters
        data["loras"] = {name: str(here / str(path)) for name, path in loras.items()}
    if kind is StageKind.EVAL and isinstance(baseline := data.get("baseline"), str) and baseline not in models:
        data["baseline"] = str(here / baseline)
    try:
        options: StageOptions = TypeAdapter(model).validate_python(data)
        return options
    except ValidationError as exc:
        raise validation_error(exc, path=where, prefix="options", hint=HINT) from None
    except BadInputError as exc:  # the model's own range and choice checks name the CLI flag
        by_flag = {field_flag(f): f.name for f in dataclasses.fields(model)}  # --bootstrap is `resamples`
        field = "options." + by_flag.get(exc.field or "", (exc.field or "").removeprefix("--").replace("-", "_"))
        message = exc.message.split(": ")[-1]
        raise BadInputError(message, path=where, field=field, hint=exc.hint) from None


def _check_next(text: str, promote: bool, where: str) -> None:
    """A promote stage's ``next:``, checked as `qlift promote start --next` checks it (a NAME alone: as a backend
    name)."""
    from qlift.rollout.train import parse_next

    if not promote:
        raise BadInputError("only a promote stage takes next", path=where, field="next", hint=HINT)
    try:
        parse_next(text if "=" in text else f"{text}=http://127.0.0.1")
    except BadInputError as exc:
        raise BadInputError(exc.message.removeprefix(f"field '{exc.field}': "), path=where, field="next",
                            hint="Write next: NAME (the candidate serve stage's server) or NAME=URL[#MODEL], e.g. "
                                 "next: v3=http://127.0.0.1:8003#smollm2-v3.") from None


def _check_next_flow(stages: list[Stage], promote: Stage, path: Path) -> None:
    """A release with ``next:``: a running router (url:), whose version at 100% is the stable, so no stable serve
    stage; the candidate is the candidate serve stage (next: NAME) or the server next: names (NAME=URL)."""
    where = f"{path}: stage '{promote.name}' (promote)"
    routers = [s for s in stages if isinstance(s.options, RouterStageOptions)]
    if not routers:
        return  # refused below: a promote stage needs a router stage before it
    if not routers[0].opts(RouterStageOptions).url:
        raise BadInputError("next: rolls the next version out on a running qlift router, and this release starts "
                            "its own", path=where, field="next",
                            hint="Give the router stage url: (the running router), or remove next:.")
    roles = {s.name: s.opts(ServeStageOptions).role for s in stages if isinstance(s.options, ServeStageOptions)}
    stable = next((name for name, role in roles.items() if role == "stable"), None)
    if stable is not None:
        raise BadInputError(f"with next:, the stable is the version that holds 100% of the router now, so stage "
                            f"'{stable}' (role: stable) has nothing to serve", path=where, field="next",
                            hint=f"Remove stage '{stable}'.")
    candidates = [name for name, role in roles.items() if role == "candidate"]
    if promote.next_url and candidates:
        raise BadInputError(f"next: {promote.next} names the candidate's server, and so does stage "
                            f"'{candidates[0]}'", path=where, field="next",
                            hint=f"Write next: {str(promote.next).partition('=')[0]} (the serve stage's server), or "
                                 f"remove stage '{candidates[0]}'.")
    if not promote.next_url and not candidates:
        raise BadInputError(f"next: {promote.next} names no server, and no serve stage has role: candidate",
                            path=where, field="next",
                            hint=f"Write next: {promote.next}=URL[#MODEL], or add a serve stage with role: candidate.")


def _check_flow(stages: list[Stage], path: Path) -> None:
    serves = [(s, s.options) for s in stages if isinstance(s.options, ServeStageOptions)]
    routers = [(s, s.options) for s in stages if isinstance(s.options, RouterStageOptions)]
    roles = {o.role for _, o in serves}
    promote = next((s for s in stages if s.next is not None), None)
    if promote is not None:
        _check_next_flow(stages, promote, path)
    elif routers and roles != {"candidate", "stable"}:
        raise BadInputError("a router stage needs a serve stage of each role (candidate and stable)", path=path,
                            field="stages", hint="Add `serve` stages with role: stable and role: candidate "
                            "(either may name a running server with url).")
    ports = [(s.name, o.port) for s, o in serves if not o.url and o.port] + \
        [(s.name, r.port) for s, r in routers if not r.url and r.port]
    for i, (name, port) in enumerate(ports):
        other = next((n for n, p in ports[:i] if p == port), None)
        if other is not None:
            raise BadInputError(f"stages '{other}' and '{name}' both listen on port {port}", path=path,
                                field="stages", hint="Give each server and the router its own port (0: a free one).")
    router_url = routers[0][1].url if routers else None
    if router_url:
        for s, o in serves:  # a running router's backend URLs are fixed, and its users stay after the release ends
            if not o.url and not (o.port and o.keep_running):
                raise BadInputError(f"it starts a server for the running router {router_url}, so it needs "
                                    "the port that router's backend names and keep_running: true",
                                    path=f"{path}: stage '{s.name}' (serve)", field="options",
                                    hint="Give it port: and keep_running: true (once promoted it serves the router's "
                                         "users), or name a running server with url:.")
    mover = next((i for i, s in enumerate(stages) if TABLE[s.kind].moves_traffic), None)
    if mover is not None and not any(isinstance(s.options, RouterStageOptions) for s in stages[:mover]):
        raise BadInputError("a promote stage needs a router stage before it", path=path, field="stages",
                            hint="Add a `router` stage (url: names a running one).")


def json_schema() -> dict[str, JsonValue]:
    """The JSON Schema of a release file, with each stage kind's options model spelled out."""
    from qlift.options import field_docs

    schema = ReleaseFile.model_json_schema()
    variants = []
    for kind, row in TABLE.items():
        model = row.options
        opts = model.model_json_schema() if isinstance(model, type) and issubclass(model, BaseModel) \
            else TypeAdapter(model).json_schema()
        docs = {k: v for cls in reversed(model.__mro__) if dataclasses.is_dataclass(cls)
                for k, v in field_docs(cls).items()}  # a serve stage's fields: serve's, then its own
        schema["$defs"].update(opts.pop("$defs", {}))
        props = opts.get("properties", {})
        for key in list(props):
            if key in row.managed:
                del props[key]
            elif key in docs:
                props[key]["description"] = docs[key]
        opts["required"] = [k for k in opts.get("required", []) if k in props]
        opts["additionalProperties"] = False
        properties = {**schema["$defs"]["StageEntry"]["properties"], "stage": {"const": kind.value}, "options": opts}
        if not row.moves_traffic:
            del properties["load"], properties["next"]
        variants.append({"type": "object", "additionalProperties": False, "required": ["stage"],
                         "properties": properties})
    schema["properties"]["stages"]["items"] = {"oneOf": variants}
    schema["$defs"].pop("StageEntry", None)
    schema["$defs"].pop("StageKind", None)  # each variant names its own kind
    schema["title"] = "qlift release file"
    return schema
