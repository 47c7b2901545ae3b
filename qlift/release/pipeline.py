"""Plan and run a release: each stage keyed by content, skipped when its output verifies,
journaled so that a killed run resumes at the stage that did not finish.

A stage's key is the sha256 of (its kind, its stage version, its options, the content hashes of
its inputs). Model stages write ``OUT/NAME-KEY12`` (atomically, through the stage's own
function); the journal records the output's lineage content hash and its files' stat when it is
complete, and a later run skips the stage only if the directory still holds that content
(``qlift.release.cache``: unread while every file's size, mtime, inode and ctime are unchanged). The live stages (serve,
router, promote) have no files to cache: they are skipped together once promote succeeded
with the same key, and run together otherwise.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import JsonValue

from qlift.errors import BadInputError, QliftError
from qlift.fsutil import file_lock, lock_holder, make_output_dirs
from qlift.models.ref import ModelRef
from qlift.release import live
from qlift.release.cache import file_stats, verified_stats
from qlift.release.doors import (
    FILE_DOORS,
    StageCall,
    base_identity,
    base_kind,
    cpu_cannot_serve,
    dir_quantization,
    eval_baseline,
    planned_quantization,
    run_base,
)
from qlift.release.follow import follow, follow_beside, promote_journal
from qlift.release.journal import NAME as JOURNAL_NAME
from qlift.release.journal import ReleaseJournal, RunOutcome, StageRow, StageStatus, writer_lock_path
from qlift.release.kinds import TABLE, BaseKind
from qlift.release.livecontext import CheckedEval, LivePlan, rollout_journals, rollout_state
from qlift.release.liveplan import key_live, run_live
from qlift.release.outputs import ModelOutput, Ran, StageOutput, journaled_output
from qlift.release.report import Action, StageReport, first_line, short, stage_key
from qlift.release.rollout_state import release_command, status_command
from qlift.release.spec import Release, RouterStageOptions, ServeStageOptions, Stage
from qlift.release.stage_options import CANARY, STABLE
from qlift.rollout.journal import journal_flag
from qlift.rollout.spec import PromoteOptions
from qlift.serialize import to_jsonable


@dataclass
class Pipeline:
    release: Release
    journal: ReleaseJournal
    from_stage: str | None = None
    echo: Callable[[str], None] = print
    dry_run: bool = False
    models: dict[str, ModelRef] = field(default_factory=dict)
    evals: dict[str, CheckedEval] = field(default_factory=dict)
    reports: list[StageReport] = field(default_factory=list)
    forced: bool = False
    run_id: int = 0
    pending: list[str] = field(default_factory=list)  # dry run: stages that will run, in order
    choices: dict[str, tuple[str, str]] = field(default_factory=dict)
    unneeded: dict[str, str] = field(default_factory=dict)
    # Asked before promote moves the traffic of a router that serves users (None: nobody to ask, so refused).
    confirm: Callable[[str], bool] | None = None
    router_token: str | None = None  # the caller's admin token of a running router the file names

    @property
    def names(self) -> list[str]:
        return ["base", *(s.name for s in self.release.stages)]

    def execute(self) -> list[StageReport]:
        """Plan (dry run) or run every stage in order; raise the first stage's failure."""
        if self.from_stage is not None and self.from_stage not in self.names:
            raise BadInputError(f"--from {self.from_stage}: no such stage", field="--from",
                                hint=f"Use one of: {', '.join(self.names)}.")
        if self.dry_run:
            self._say_window_sizing()
        self._base()
        self.choices = self._serve_choices()
        self.unneeded = self._unneeded()
        model_stages = [s for s in self.release.stages if not TABLE[s.kind].live]
        for stage in model_stages:
            self._model_stage(stage)
        live_stages = [s for s in self.release.stages if TABLE[s.kind].live]
        if live_stages:
            self._live(live_stages)
        return self.reports

    # -- reporting ---------------------------------------------------------------------------
    def _report(self, r: StageReport) -> StageReport:
        self.reports.append(r)
        self.echo(r.line(len(self.reports), len(self.names)))
        return r

    def _force_from(self, name: str) -> None:
        if name == self.from_stage:
            self.forced = True

    def _blocked(self, stage: Stage, needs: list[str], warning: str = "") -> None:
        self.pending.append(stage.name)
        self._report(StageReport(stage.name, stage.kind, Action.BLOCKED,
                                 f"needs {', '.join(needs)} (made when {'they run' if len(needs) > 1 else 'it runs'})",
                                 warning=warning))

    def _say_window_sizing(self) -> None:
        """Up front, one line where promote's windows cannot reach their minimum at the traffic known now
        (preflight's one rule): the file's load as fast as its last run sent it, else the running router's."""
        promote = next((s for s in self.release.stages if TABLE[s.kind].moves_traffic), None)
        if promote is None:
            return
        from qlift.rollout.preflight import recent_rate, window_shortfall

        url = next((s.options.url for s in self.release.stages if isinstance(s.options, RouterStageOptions)), None)
        try:  # the router the release starts has no URL yet: a stand-in (sizing reads only the windows)
            spec = promote.opts(PromoteOptions).rollout_spec(stable=STABLE, canary=CANARY,
                                                             router=url or "http://127.0.0.1")
        except ValueError:
            return
        last = self.journal.latest(promote.name)
        load = last.result.get("traffic") if last is not None and promote.load is not None else None
        problem = None
        if isinstance(load, dict) and isinstance(sent := load.get("sent"), int) and \
                isinstance(took := load.get("seconds"), int | float) and took > 0:
            problem = window_shortfall(spec, sent / took, f"this file's load ({sent} requests in {took:.0f}s "
                                                          "last run)")
        else:
            rate = None
            if url and self.router_token:
                with contextlib.suppress(QliftError, ValueError):
                    rate = recent_rate(url, self.router_token)
            if rate is not None:
                problem = window_shortfall(spec, rate[0], f"the router's traffic ({rate[1]} requests in its last "
                                                          f"{rate[2]:.0f}s)")
        if problem is not None:
            self.echo(f"{promote.name}: {problem}; the rollout would hold, then pause (docs/promote.md, window "
                      "sizing: raise load.concurrency, the interval, or lower analysis.min_requests)")

    # -- the base ------------------------------------------------------------------------------
    def _base(self) -> None:
        base = self.release.base
        kind = base_kind(base)
        self._force_from("base")
        if kind is BaseKind.PATH:
            assert base.path is not None
            if not base.path.is_dir():
                raise BadInputError(f"the base {base.path} is not a directory", path=self.release.file,
                                    field="base.path", hint="Point base.path at a model directory.")
            self.models["base"] = ModelRef.of(base.path)
            self._report(StageReport("base", kind, Action.skip(self.dry_run),
                                     "a directory: nothing to import", output=str(base.path),
                                     content_hash=self.models["base"].content_hash))
            return
        key = stage_key(kind, {}, base_identity(base))
        self._file_stage("base", kind, key, lambda out: run_base(base, out), makes_model=True,
                         on_done=lambda output: self._made("base", output))

    # -- which models this machine serves --------------------------------------------------------
    def _planned_quantization(self, name: str) -> dict[str, JsonValue] | None:
        if name == "base":
            base = self.models.get("base")
            return dir_quantization(base.base) if base is not None else None
        from qlift.quantize.options import QuantizeOptions

        options = self.release.stage(name).options
        return planned_quantization(options) if isinstance(options, QuantizeOptions) else None

    def _serve_choices(self) -> dict[str, tuple[str, str]]:
        """Each serve stage that starts a server: the model stage it serves here, and why when it falls back."""
        out: dict[str, tuple[str, str]] = {}
        for s in self.release.stages:
            if not isinstance(s.options, ServeStageOptions) or s.options.url:
                continue
            reason = cpu_cannot_serve(self._planned_quantization(s.input))
            fallback = s.options.fallback
            if reason and fallback:
                out[s.name] = (fallback, f"{reason}: serves {fallback} instead of {s.input}")
            else:
                out[s.name] = (s.input, "")
        return out

    def _unneeded(self) -> dict[str, str]:
        """only_if_served stages that nothing served on this machine needs, with the reason."""
        served = {model for model, _ in self.choices.values()}
        used = {s.input for s in self.release.stages if not TABLE[s.kind].live} | \
            {eval_baseline(s) for s in self.release.stages}
        out = {}
        for s in self.release.stages:
            target = s.name if TABLE[s.kind].makes_model else s.input  # an eval: the model it evaluates
            if s.only_if_served and self.choices and target not in served and s.name not in used:
                out[s.name] = f"not needed here: no server serves {target} on this machine"
        return out

    # -- merge, quantize, eval -----------------------------------------------------------------
    def _model_stage(self, stage: Stage) -> None:
        self._force_from(stage.name)
        if stage.name in self.unneeded:
            self._report(StageReport(stage.name, stage.kind, Action.skip(self.dry_run),
                                     self.unneeded[stage.name]))
            return
        baseline = eval_baseline(stage)
        needs = [n for n in (stage.input, baseline) if n in self.pending]
        if needs:
            self._blocked(stage, needs)
            return
        door = FILE_DOORS[stage.kind]
        call = self._call(stage, baseline)
        key = stage_key(stage.kind, stage.options, door.key_inputs(call))

        def done(output: StageOutput) -> None:
            if isinstance(output, ModelOutput):
                self._made(stage.name, output)
            else:  # an eval's report: the gates promote checks the model it evaluated against
                self.evals[stage.name] = CheckedEval(call.model.content_hash, output.report, key)

        self._file_stage(stage.name, stage.kind, key, lambda out: door.run(call, out),
                         makes_model=TABLE[stage.kind].makes_model, on_done=done)

    def _made(self, name: str, output: StageOutput) -> None:
        assert isinstance(output, ModelOutput), f"{name} makes a model"
        self.models[name] = output.ref

    def _call(self, stage: Stage, baseline: str | None) -> StageCall:
        """What the stage works on: its input model (with the release's adapters where it takes them) and an
        eval's baseline (a model stage's output, else a directory the options name)."""
        src = self.models[stage.input]
        model = src.with_adapters(self.release.adapters) if TABLE[stage.kind].takes_adapters else src
        if baseline in self.models:
            return StageCall(stage, model, self.models[baseline], baseline_is_stage=True)
        if baseline is not None and Path(baseline).exists():
            return StageCall(stage, model, ModelRef.of(Path(baseline)))
        return StageCall(stage, model)

    def _file_stage(self, name: str, kind: str, key: str, run: Callable[[Path], Ran], *, makes_model: bool,
                    on_done: Callable[[StageOutput], None]) -> None:
        """Skip the stage where its output still holds what the journal says, else run it; ``on_done`` gets its
        typed output, its hash the journal's (checked) or the one the stage computed as it wrote it: never again."""
        out = self.release.out / f"{name}-{short(key)}"
        row = self.journal.stage(name, key)
        stats = verified_stats(out, row.content_hash, row.files) \
            if not self.forced and row is not None and row.status is StageStatus.DONE else None
        if row is not None and stats is not None:
            if stats != row.files and not self.dry_run:
                self.journal.set_files(name, key, stats)
            on_done(journaled_output(out, row.content_hash, makes_model=makes_model))
            self._report(StageReport(name, kind, Action.skip(self.dry_run), f"cached {short(key)}",
                                     key, str(out), row.content_hash, result=row.result))
            return
        why = "--from" if self.forced else self._why_run(name, key, row)
        if self.dry_run:
            self.pending.append(name)
            self._report(StageReport(name, kind, Action.RUN, why, key, str(out)))
            return
        self.echo(f"{name} ({kind}): running ({why})")
        _remove_partials(out)
        self.journal.begin(name, key, str(out))
        t0 = time.monotonic()
        try:
            ran = run(out)
        except BaseException as exc:
            self.journal.end(name, key, StageStatus.FAILED, result={"error": str(exc)})
            if isinstance(exc, QliftError) and exc.hint:  # a stage's hint names the run: this file (and --out)
                exc.hint = exc.hint.replace("`qlift release run`", f"`{release_command(self.release)}`")
            if isinstance(exc, QliftError | KeyboardInterrupt):
                self._report(StageReport(name, kind, Action.FAILED, first_line(exc), key, str(out),
                                         seconds=round(time.monotonic() - t0, 2)))
            raise
        content, result = ran.output.content_hash, to_jsonable(ran.result)
        self.journal.end(name, key, StageStatus.DONE, content_hash=content, result=result, files=file_stats(out))
        on_done(ran.output)
        self._report(StageReport(name, kind, Action.RAN, why, key, str(out), content, round(time.monotonic() - t0, 2),
                                 result))

    def _why_run(self, name: str, key: str, row: StageRow | None) -> str:
        if row is not None:
            if row.status is StageStatus.RUNNING:
                return "the last run did not finish it (resuming here)"
            if row.status is StageStatus.FAILED:
                return "it failed last time"
            return "its output is missing or no longer matches its hash"
        latest = self.journal.latest(name)
        if latest is None:
            return "never run"
        return f"inputs or options changed (last run: {short(latest.key)})"

    # -- serve, router, promote ----------------------------------------------------------------
    def _live(self, stages: list[Stage]) -> None:
        for s in stages:
            self._force_from(s.name)
        served = {name for name, _ in self.choices.values()} | {s.input for s in stages if TABLE[s.kind].serves}
        evals = [s.name for s in self.release.stages if TABLE[s.kind].checks]
        needs = [n for n in self.pending if n in served or n in evals]
        mover = next((s for s in stages if TABLE[s.kind].moves_traffic), None)
        warning, refused = self._traffic_warning(stages, mover)
        warnings = {mover.name: warning} if mover is not None else {}
        if needs:
            for s in stages:
                self._blocked(s, needs, warnings.get(s.name, ""))
            return
        plan = key_live(LivePlan(self.release, stages, self.models, self.choices, list(self.evals.values())))
        row = self.journal.stage(mover.name, plan.keys[mover.name]) if mover is not None else None
        if mover is not None and not self.forced and row is not None and row.status is StageStatus.DONE:
            for s in stages:
                self._report(StageReport(s.name, s.kind, Action.skip(self.dry_run),
                                         f"promoted already with key {short(plan.keys[mover.name])}",
                                         plan.keys[s.name], result=row.result if s is mover else None))
            return
        if mover is not None and self._rerun_note(mover):
            plan.notes[mover.name] = self._rerun_note(mover)
        if self.dry_run:
            for s in stages:
                self._report(StageReport(s.name, s.kind, Action.RUN, plan.notes.get(s.name, "live stage"),
                                         plan.keys[s.name], warning=warnings.get(s.name, "")))
            return
        if mover is not None and refused:  # before any server starts: promote itself would refuse after
            raise BadInputError(f"stage '{mover.name}': {warning}", path=self.release.file,
                                hint=f"Nothing started and nothing moved; `{status_command(self.release)}` shows the "
                                     "last rollout.")
        if mover is not None and warning:
            self.echo(f"{mover.name}: {warning}")
            self._confirm_traffic(mover, stages)
        run_live(plan, self.journal, self.run_id, echo=self.echo, report=self._report, caller_token=self.router_token)

    def _confirm_traffic(self, promote: Stage, stages: list[Stage]) -> None:
        """Promote against a router that serves users (one named with url:) runs only when the caller said yes:
        --yes, or the answer on a terminal. Checked before any server starts or any weight moves."""
        url = next(s.options.url for s in stages if isinstance(s.options, RouterStageOptions))
        if self.confirm is None:
            raise BadInputError(f"stage '{promote.name}' would move the live traffic of {url} (a router that serves "
                                "users) and --yes was not given",
                                hint="Check the plan with --dry-run, then pass --yes.")
        if not self.confirm(f"stage '{promote.name}' moves the traffic of {url}. Run it?"):
            raise QliftError(f"stage '{promote.name}' not confirmed: nothing moved on {url}",
                             hint="Run again and answer yes, or pass --yes.")

    def _rerun_note(self, promote: Stage) -> str:
        """What running promote again does where its last rollout here ended: a new one from the first step."""
        last = self.journal.latest(promote.name)
        state = rollout_state(last.result) if last is not None else None
        if last is None or state is None or not state.final:
            return ""
        return (f"a new rollout from the first step ({_first_weights(promote)}), in a new rollout journal; the last "
                f"one ({last.result.get('journal', '?')}) ended {state}")

    def _traffic_warning(self, stages: list[Stage], promote: Stage | None) -> tuple[str, bool]:
        """What running promote does to a router that serves users (one named with url:), said before it does
        it, and whether promote refuses to start there: from the router's weights where its admin API answers,
        else from the last promote journaled here (as the rollout's own journal had it). A rollout starts only
        from the stable at 100% (qlift.rollout.preflight); a router the release starts carries only the
        release's own traffic."""
        url = next((s.options.url for s in stages if isinstance(s.options, RouterStageOptions)), None)
        if promote is None or not url:
            return "", False
        if promote.next is not None:
            return _next_warning(url, promote.next.partition("=")[0], _router_weights(url, self.router_token),
                                 self.router_token)
        from qlift.rollout.states import State

        last = self.journal.latest(promote.name)
        last_state = rollout_state(last.result) if last is not None else None
        promoted = last_state in (State.PROMOTED, State.FINISHED)
        weights = _router_weights(url, self.router_token)
        if weights is not None:
            now = ", ".join(f"{name}={w}" for name, w in sorted(weights.items()))
            off_start = any(w > 0 for name, w in weights.items() if name != STABLE)
        else:
            now, off_start = ("the last promote here promoted the canary" if promoted else ""), promoted
        if not off_start:
            return f"will run promote: moves live traffic on {url}" + (f" (now {now})" if now else ""), False
        if weights is not None and weights.get(CANARY, 0) < 100:
            mine = promote_journal(self.release, last, self.journal.last_run()) if last is not None else None
            fix = (f"a rollout is moving it: let it end, or abort it (this release's last one: `qlift promote abort"
                   f"{journal_flag(mine)}`)" if mine is not None and mine.is_file() else
                   "another rollout is moving it: let it end, or abort it with `qlift promote abort` and the "
                   "--journal of the `qlift promote` process driving it")
        else:
            fix = ("the canary was promoted: serve it as this file's stable (the backend named stable) and the next "
                   "version as its candidate, or re-point the router's names (docs/promote.md, after a promotion)")
        if weights is None:  # the journal's word only: the router may have been re-pointed since
            return (f"will re-run promote, which refuses to start unless {url} holds the stable at 100% ({now}); "
                    f"{fix}"), False
        return (f"promote would refuse to start: a rollout starts from the stable at 100% and {url} does not hold "
                f"it ({now}); {fix}"), True


def _next_warning(url: str, name: str, weights: dict[str, int] | None, token: str | None) -> tuple[str, bool]:
    """What a ``next:`` promote does to the running router: rolls NAME out over the version at 100% (the expected
    start, not a refusal); refused, as `start --next` refuses, where no version holds 100% or NAME does already."""
    from qlift.rollout.train import stable_for

    if weights is None:
        return (f"will run promote: rolls {name} out over the version that holds 100% of {url} (its admin API did "
                "not answer here: promote checks that first)"), False
    now = ", ".join(f"{n}={w}" for n, w in sorted(weights.items()))
    try:
        stable = stable_for(url, name, token, flag="next:")
    except QliftError as exc:
        return f"promote would refuse to start: {exc.message}. {exc.hint}".rstrip(), True
    return f"will run promote: moves live traffic on {url}, rolling {name} out over {stable} (now {now})", False


def _first_weights(promote: Stage) -> str:
    """The weights the rollout sets first: 100/0 for a shadow phase, else its first step's."""
    spec = promote.opts(PromoteOptions)
    stable, canary = (STABLE, CANARY) if promote.next is None else \
        ("the version at 100%", promote.next.partition("=")[0])
    if spec.shadow is not None:
        return f"{stable}=100, {canary}=0 in the shadow phase"
    return f"{stable}={100 - spec.steps[0]}, {canary}={spec.steps[0]} at the first step"


def _router_weights(url: str, token: str | None) -> dict[str, int] | None:
    """The qlift router's weights, or None where its admin API does not answer (no token, another router)."""
    from qlift.router.client import RouterClient

    if not token:
        return None
    try:
        return RouterClient(url, token, timeout=3.0).state().weights
    except (QliftError, ValueError):
        return None


def _remove_partials(out: Path) -> None:
    """Temp dirs a killed stage left beside its output (never used: outputs are only renamed into place)."""
    for p in out.parent.glob(f".{out.name}.*.partial"):
        shutil.rmtree(p, ignore_errors=True)


def run_release(release: Release, *, from_stage: str | None = None, dry_run: bool = False,
                echo: Callable[[str], None] = print, reports: list[StageReport] | None = None,
                confirm: Callable[[str], bool] | None = None, router_token: str | None = None) -> list[StageReport]:
    """Plan or run ``release``; the journal lives in its output dir. ``reports`` (if given) is filled
    as stages finish, so a caller has the stages before a failure too. ``confirm`` is asked (with what will
    happen) before promote moves the traffic of a router that serves users; without it that is refused.
    ``router_token``: the admin token of a running router the file names (its weights in the plan; promote
    drives it with it)."""
    path = release.out / JOURNAL_NAME
    reports = [] if reports is None else reports
    if dry_run:
        follow_beside(release, echo)  # a rollout ended outside the release: the plan starts from its outcome
    else:
        make_output_dirs(release.out, named=release.out_from)
    with ReleaseJournal(path if path.exists() or not dry_run else Path(":memory:")) as journal:
        if dry_run:
            return Pipeline(release, journal, from_stage, echo, dry_run=True, reports=reports,
                            router_token=router_token).execute()
        lock = writer_lock_path(path)
        with file_lock(lock, wait=False) as mine:
            if not mine:
                holder = lock_holder(lock)
                raise QliftError(f"release run pid {holder} holds {release.out}: one run of a release at a time",
                                 hint=f"Wait for it (`{status_command(release)}`), or stop it; then run again.")
            pipeline = Pipeline(release, journal, from_stage, echo, reports=reports, confirm=confirm,
                                router_token=router_token)
            return _run_locked(pipeline)


def _settle_retirements(release: Release, token: str | None, echo: Callable[[str], None]) -> None:
    """A ``next:`` release's old version that its run could not retire from the router yet (the router did not
    answer, the run was killed): retired now, before the next release adds its version (train.settle)."""
    from qlift.rollout.train import settle, unretired

    for journal in rollout_journals(release.out):
        name = unretired(journal)
        if name is not None and settle(journal, token) == name:
            echo(f"retired backend {name} from the router, as {journal} still owed")


def _run_locked(pipeline: Pipeline) -> list[StageReport]:
    release, journal, echo = pipeline.release, pipeline.journal, pipeline.echo
    follow(release, journal, echo)
    _settle_retirements(release, pipeline.router_token, echo)
    stopped = live.stop_leftovers(journal)
    if stopped:
        echo(f"stopped servers a killed run left running: pids {', '.join(map(str, stopped))}")
    pipeline.run_id = run_id = journal.start_run(release.file)
    try:
        pipeline.execute()
    except BaseException as exc:
        journal.finish_run(run_id, RunOutcome.FAILED, first_line(exc))
        raise
    journal.finish_run(run_id, RunOutcome.DONE)
    return pipeline.reports
