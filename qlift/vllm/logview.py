"""What qlift shows of a vLLM log: the steps of a start (`qlift serve`, eval's offline worker), and for a
server, the log without HTTP access lines once it is up. The log file always keeps every line.

vLLM says little about how far its start is, but its log says which step it is in (weights, compile, KV
cache, graph capture, HTTP server; offline: the prompts processed): ``StartupPhases`` reads those lines, so a
start of minutes shows its step and, where vLLM counts (checkpoint shards, captured graphs, prompts), done
out of total.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from qlift.fsutil import AppendedLines
from qlift.progress import StepBar, enabled

# uvicorn's access line, e.g. `INFO:     127.0.0.1:36144 - "GET /health HTTP/1.1" 200 OK`, under any
# `(APIServer pid=N) ` prefix vLLM adds with several API server processes.
_ACCESS = re.compile(r'^(?:\([^)]*\) )?INFO:\s+\S+ - "[A-Z]+ \S+ HTTP/[\d.]+" \d{3}\b')


def is_access_line(line: str) -> bool:
    """An HTTP access line (a request and its status, health checks included)."""
    return _ACCESS.match(line) is not None


@dataclass(frozen=True)
class Phase:
    """A startup step: its name, and where vLLM counts it, how many of how many are done."""

    name: str
    done: int | None = None
    total: int | None = None


_COUNT = r"(?:.*?\|\s*(\d+)/(\d+))?"  # tqdm's `| 3/67` where vLLM draws a bar
# In the order vLLM goes through them; a line matching none leaves the phase as it is.
_PHASES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"non-default args: "), "resolving the model's config"),
    (re.compile(r"Initializing a V1 LLM engine"), "starting the engine"),
    (re.compile(r"DP group leader: "), "starting the model worker process"),
    (re.compile(r"Starting to load model"), "loading weights"),
    (re.compile(r"Loading (?:safetensors|pt) checkpoint shards" + _COUNT), "loading weights: checkpoint shards"),
    (re.compile(r"Loading weights took"), "weights loaded"),
    (re.compile(r"Dynamo bytecode transform time|Compiling a graph for|Directly load the compiled graph"),
     "compiling (torch.compile)"),
    (re.compile(r"Memory profiling takes|KV cache size: "), "profiling memory, allocating the KV cache"),
    (re.compile(r"Capturing CUDA graphs" + _COUNT), "capturing CUDA graphs"),
    (re.compile(r"Graph capturing finished|init engine \(profile, create kv cache, warmup model\) took"),
     "engine ready"),
    (re.compile(r"Starting vLLM (?:API )?server on"), "starting the HTTP server"),
    (re.compile(r"Processed prompts" + _COUNT), "generating"),  # LLM.generate's bar (offline)
]


class StartupPhases:
    """Feed it vLLM's log lines; it calls ``on_phase`` when the step changes or a counted step advances."""

    def __init__(self, on_phase: Callable[[Phase], None]) -> None:
        self.on_phase = on_phase
        self.current: Phase | None = None

    def feed(self, line: str) -> None:
        for pattern, name in _PHASES:
            m = pattern.search(line)
            if m is None:
                continue
            done, total = m.groups() if pattern.groups == 2 else (None, None)
            phase = Phase(name, int(done) if done else None, int(total) if total else None)
            if phase != self.current:
                self.current = phase
                self.on_phase(phase)
            return


class LogFollower(AppendedLines):
    """New whole lines of vLLM's log; ``\r``-redrawn progress bars count as lines."""

    def lines(self) -> Iterator[str]:
        for text in self.read():
            yield from (line for line in text.split("\r") if line)


@dataclass
class LogView:
    """What the terminal gets: ``write`` takes a line (with its newline); ``on_phase`` the startup steps;
    ``startup``: the whole startup log too; ``access``: HTTP access lines too; ``note``: qlift's own lines
    (e.g. that it is draining)."""

    write: Callable[[str], None] | None = None
    on_phase: Callable[[Phase], None] | None = None
    startup: bool = False
    access: bool = False
    note: Callable[[str], None] | None = None

    def startup_line(self, phases: StartupPhases | None, line: str) -> None:
        if phases is not None:
            phases.feed(line)
        if self.startup:
            self.line(line)

    def line(self, line: str) -> None:
        if self.write is not None and (self.access or not is_access_line(line)):
            self.write(line + "\n")


class PhaseLines:
    """Startup phases as lines (``vLLM: compiling (torch.compile), 41 s in``) through ``say``; a counted phase
    as a bar on a terminal (qlift.progress), else one more line per tenth done."""

    def __init__(self, say: Callable[[str], None], prefix: str = "vLLM") -> None:
        self.say, self.prefix, self.began = say, prefix, time.monotonic()
        self.name: str | None = None
        self.bar: StepBar | None = None
        self.tenth = 0

    def __call__(self, phase: Phase) -> None:
        count = f" ({phase.done}/{phase.total})" if phase.total else ""
        line = f"{self.prefix}: {phase.name}{count}, {time.monotonic() - self.began:.0f} s in"
        if phase.name != self.name:
            self.close()
            self.name, self.tenth = phase.name, 0
            self.say(line)
        if not phase.total or phase.done is None:
            return
        if enabled():
            self.bar = self.bar or StepBar(phase.name)
            self.bar.update(phase.done, phase.total)
        elif phase.done * 10 // phase.total > self.tenth:
            self.tenth = phase.done * 10 // phase.total
            self.say(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
