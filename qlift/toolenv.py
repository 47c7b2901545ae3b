"""Isolated tool environments that qlift builds and manages, the way pre-commit manages hooks.

A tool whose pins clash with vLLM's (llm-compressor) gets its own venv under qlift's cache
dir, keyed by a hash of its spec. The venv sees the parent environment's site-packages
*after* its own (a ``.pth`` file), so heavy shared packages such as torch are reused while
the tool's pinned packages win. The parent environment is never modified: pip refuses to
uninstall anything outside the venv it runs in.

Life cycle: built in a temp dir beside its final place, health-checked (every pinned module
must import from the venv itself), marked ready by an install-state file written atomically,
then renamed into place. A later run that finds the state file missing or the interpreter
gone removes the dir and builds it again.

PYTHONPATH would put its directories in front of the env's own site-packages, so a parent that
gets packages from there (vLLM unpacked into a --target dir) would shadow the env's pins. Every
process qlift starts in the env (pip, the health probe, the worker) gets ``tool_environ()``
instead: no PYTHONPATH, its directories passed on in QLIFT_TOOLENV_PATH, which the ``.pth``
appends after the env's own site-packages and before the parent's.

Offline: ``ensure(wheelhouse=DIR)`` installs with ``pip --no-index --find-links DIR``
(``qlift.wheelhouse`` builds such a directory for another Python and platform).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qlift.errors import ExternalToolError
from qlift.fsutil import file_lock, write_json_atomic
from qlift.settings import tool_envs_dir

log = logging.getLogger(__name__)

LAYOUT_VERSION = 1  # bump when the way an env is built changes
STATE_FILE = ".qlift-install-state.json"
PTH_NAME = "_qlift_parent_env.pth"
PATH_VAR = "QLIFT_TOOLENV_PATH"  # the parent's PYTHONPATH, appended after the env's own packages
_PTH_PATH_LINE = (f"import os, sys; sys.path.extend(p for p in os.environ.get({PATH_VAR!r}, '').split(os.pathsep) "
                  "if p and p not in sys.path)")

_PROBE = """
import importlib, importlib.metadata as md, json, sys
out = {"python": sys.version.split()[0], "prefix": sys.prefix, "modules": {}}
for mod, dist in json.loads(sys.argv[1]).items():
    try:
        m = importlib.import_module(mod)
        try:
            version = md.version(dist)
        except md.PackageNotFoundError:  # imported from a source checkout on the path: no metadata
            version = getattr(m, "__version__", None)
        out["modules"][mod] = {"version": version, "file": getattr(m, "__file__", None) or ""}
    except Exception as exc:
        out["modules"][mod] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
"""


@dataclass(frozen=True)
class ToolEnvSpec:
    """What goes into a tool environment; its hash names the directory."""

    name: str
    requirements: tuple[str, ...]
    # module -> (distribution, version prefix): must import at that version; from the env
    # itself unless the parent's copy already satisfies the pin (then pip installs none)
    pinned: dict[str, tuple[str, str]] = field(default_factory=dict)
    # module -> distribution: must import, from anywhere (the parent env is fine)
    shared: dict[str, str] = field(default_factory=dict)

    def key(self) -> str:
        payload = {
            "layout": LAYOUT_VERSION,
            "name": self.name,
            "requirements": sorted(self.requirements),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "base": sys.base_prefix,
            "parent_site": parent_site_packages(),
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class EnsureResult:
    path: Path
    python: Path
    created: bool
    seconds: float


@dataclass
class ModuleInfo:
    module: str
    version: str | None
    location: str  # "env", "parent" or "missing"
    error: str | None = None


@dataclass
class EnvInfo:
    name: str
    path: str
    key: str
    exists: bool
    ready: bool
    requirements: list[str]
    parent_site_packages: list[str]
    created_at: str | None = None
    size_bytes: int | None = None
    modules: list[ModuleInfo] = field(default_factory=list)


def tool_environ(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a process in a tool env: PYTHONPATH moved behind the env's own packages."""
    env = dict(os.environ if base is None else base)
    moved = env.pop("PYTHONPATH", "")
    if moved:
        env[PATH_VAR] = moved
    else:
        env.pop(PATH_VAR, None)
    return env


def parent_site_packages() -> list[str]:
    """The site-packages dirs the interpreter running qlift imports from, in its order.

    Not only its own prefix's: a venv made with --system-site-packages (or a user site)
    finds torch in a directory further down sys.path, and the tool env must see it too.
    """
    paths = sysconfig.get_paths()
    candidates = [paths["purelib"], paths["platlib"]]
    candidates += [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    return [p for p in dict.fromkeys(candidates) if Path(p).is_dir()]


class ToolEnv:
    """One managed environment for ``spec`` under ``root`` (default: the cache dir's envs/)."""

    def __init__(self, spec: ToolEnvSpec, root: Path | None = None) -> None:
        self.spec = spec
        self.root = Path(root) if root is not None else tool_envs_dir()
        self.path = self.root / f"{spec.name}-{spec.key()}"

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def state_path(self) -> Path:
        return self.path / STATE_FILE

    # --- state ----------------------------------------------------------------------
    def read_state(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.state_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def is_ready(self) -> bool:
        """Cheap check (no subprocess): state file matches, interpreter and parent still there."""
        state = self.read_state()
        if not state or state.get("key") != self.spec.key():
            return False
        if not self.python.exists():  # a dangling symlink once the base interpreter is gone
            return False
        return all(Path(p).is_dir() for p in state.get("parent_site_packages", []))

    # --- build ------------------------------------------------------------------------
    def _lock(self) -> contextlib.AbstractContextManager[bool]:
        return file_lock(self.root / f".{self.spec.name}.lock")

    def ensure(self, on_status: Callable[[str], None] | None = None, *, verify: bool = False,
               wheelhouse: Path | None = None) -> EnsureResult:
        """Return the ready environment, building (or rebuilding a broken one) first if needed.

        ``verify`` also imports every pinned module (seconds) and rebuilds if that fails.
        ``wheelhouse``: build offline from the wheel files in that directory (no package index).
        """
        say = on_status or (lambda msg: log.info("%s", msg))
        t0 = time.monotonic()
        if wheelhouse is not None:
            from qlift.wheelhouse import check_wheelhouse

            check_wheelhouse(wheelhouse)
        with self._lock():
            if self.is_ready():
                _write_pth(_site_packages_of(self.path))  # envs built before QLIFT_TOOLENV_PATH existed
                if not verify or not self._probe_problems(self.path):
                    return EnsureResult(self.path, self.python, False, time.monotonic() - t0)
            if self.path.exists():
                say(f"tool environment {self.path} is incomplete or broken; rebuilding it")
                shutil.rmtree(self.path)
            self._build(say, wheelhouse)
        return EnsureResult(self.path, self.python, True, time.monotonic() - t0)

    def _build(self, say: Callable[[str], None], wheelhouse: Path | None = None) -> None:
        tmp = self.root / f".{self.path.name}.{os.getpid()}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        source = f"from the wheelhouse {wheelhouse}" if wheelhouse else "(once; about a minute)"
        say(f"creating the {self.spec.name} tool environment in {self.path} {source}")
        try:
            self._create_venv(tmp)
            self._install(tmp, wheelhouse)
            problems = self._probe_problems(tmp)
            if problems:
                retry = f"`qlift env {self.spec.name} --setup{f' --wheelhouse {wheelhouse}' if wheelhouse else ''}`"
                raise ExternalToolError(
                    f"the new {self.spec.name} tool environment failed its health check: {problems[0]}",
                    hint=("Check that the wheelhouse was built for this Python and platform" if wheelhouse
                          else "Check network access to the package index") + f", then retry ({retry}).",
                    tool="pip",
                )
            self._write_state(tmp, wheelhouse)
            os.rename(tmp, self.path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _create_venv(self, tmp: Path) -> None:
        # pip comes from the parent env through the .pth when it has one: no ensurepip run.
        has_pip = importlib.util.find_spec("pip") is not None
        argv = [sys.executable, "-m", "venv", *(["--without-pip"] if has_pip else []), str(tmp)]
        _run(argv, "creating the venv")
        _write_pth(_site_packages_of(tmp))

    def _install(self, tmp: Path, wheelhouse: Path | None) -> None:
        if not self.spec.requirements:
            return
        source = ["--no-index", "--find-links", str(wheelhouse.resolve())] if wheelhouse else []
        argv = [
            str(tmp / "bin" / "python"), "-m", "pip", "install", "--no-input",
            "--disable-pip-version-check", "--no-warn-conflicts", "--no-warn-script-location",
            *source, *self.spec.requirements,
        ]
        if wheelhouse is None:
            _run(argv, f"pip install {' '.join(self.spec.requirements)}")
            return
        from qlift.wheelhouse import missing_wheel_error

        proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=tool_environ())
        if proc.returncode != 0:
            raise missing_wheel_error(proc.stderr + proc.stdout, wheelhouse, self.spec.name) or _pip_error(
                proc, f"pip install from the wheelhouse {wheelhouse}")

    def _probe(self, env_dir: Path) -> dict[str, Any]:
        wanted = {m: d for m, (d, _) in self.spec.pinned.items()} | dict(self.spec.shared)
        proc = subprocess.run(
            [str(env_dir / "bin" / "python"), "-c", _PROBE, json.dumps(wanted)],
            capture_output=True, text=True, check=False, env=tool_environ(),
        )
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return {"error": f"interpreter failed: {tail}", "modules": {}}
        data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return data

    def _probe_problems(self, env_dir: Path) -> list[str]:
        data = self._probe(env_dir)
        if "error" in data:
            return [data["error"]]
        problems: list[str] = []
        root = str(env_dir.resolve())
        for mod, info in data["modules"].items():
            if "error" in info:
                problems.append(f"import {mod}: {info['error']}")
                continue
            if mod in self.spec.pinned:
                _, prefix = self.spec.pinned[mod]
                if not (info["version"] or "").startswith(prefix):
                    where = "the env" if str(Path(info["file"]).resolve()).startswith(root) else info["file"]
                    problems.append(f"{mod} from {where} is {info['version']}, expected {prefix}.*")
        return problems

    def _write_state(self, env_dir: Path, wheelhouse: Path | None = None) -> None:
        from qlift.lineage import utc_now

        state = {
            "key": self.spec.key(),
            "name": self.spec.name,
            "requirements": list(self.spec.requirements),
            "parent_site_packages": parent_site_packages(),
            "created_at": utc_now(),
            "layout": LAYOUT_VERSION,
            "wheelhouse": str(wheelhouse.resolve()) if wheelhouse else None,
        }
        write_json_atomic(env_dir / STATE_FILE, state)

    # --- info / remove ----------------------------------------------------------------
    def info(self, *, probe: bool = True) -> EnvInfo:
        state = self.read_state() or {}
        info = EnvInfo(
            name=self.spec.name, path=str(self.path), key=self.spec.key(), exists=self.path.exists(),
            ready=self.is_ready(), requirements=list(self.spec.requirements),
            parent_site_packages=parent_site_packages(), created_at=state.get("created_at"),
        )
        if info.exists:
            from qlift.fsutil import dir_size

            info.size_bytes = dir_size(self.path)
        if info.ready and probe:
            data = self._probe(self.path)
            root = str(self.path.resolve())
            for mod, m in data.get("modules", {}).items():
                if "error" in m:
                    info.modules.append(ModuleInfo(mod, None, "missing", m["error"]))
                else:
                    where = "env" if str(Path(m["file"]).resolve()).startswith(root) else "parent"
                    info.modules.append(ModuleInfo(mod, m["version"], where))
        return info

    def remove(self) -> list[str]:
        """Delete every environment of this spec's name (all keys) and leftover partial builds."""
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        with self._lock():
            for p in sorted(self.root.iterdir()):
                base = p.name.lstrip(".")
                if p.is_dir() and base.startswith(f"{self.spec.name}-"):
                    shutil.rmtree(p)
                    removed.append(str(p))
        return removed


def _site_packages_of(env_dir: Path) -> Path:
    found = sorted((env_dir / "lib").glob("python3*/site-packages"))
    if not found:
        raise ExternalToolError(f"venv {env_dir} has no site-packages dir", tool="venv")
    return found[0]


def _write_pth(site: Path) -> None:
    """The env's link to the parent: PYTHONPATH's dirs, then the parent's site-packages, all after its own.

    addsitedir (not a bare path) for the site-packages, so the parent's own .pth files, e.g. qlift's
    editable-install finder, are processed too; PYTHONPATH dirs stay bare paths, as Python treats them.
    """
    lines = [_PTH_PATH_LINE, *(f"import site; site.addsitedir({p!r})" for p in parent_site_packages())]
    text = "\n".join(lines) + "\n"
    pth = site / PTH_NAME
    try:
        if pth.read_text(encoding="utf-8") == text:
            return
    except OSError:
        pass
    tmp = pth.with_name(f".{PTH_NAME}.{os.getpid()}")  # a worker starting now reads the old or the new file
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, pth)


def _run(argv: list[str], what: str) -> None:
    log.debug("running: %s", " ".join(argv))
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=tool_environ())
    if proc.returncode != 0:
        raise _pip_error(proc, what)


def _pip_error(proc: subprocess.CompletedProcess[str], what: str) -> ExternalToolError:
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    error_lines = [ln for ln in lines if "error" in ln.lower()]
    last = (error_lines or lines or [f"exit code {proc.returncode}"])[-1].strip()
    return ExternalToolError(
        f"{what} failed: {last}",
        hint="Check network access to the package index and free disk space, then retry; with no index, "
        "build it from a wheelhouse (`qlift env quantize --setup --wheelhouse DIR`, see docs/env.md).",
        tool="pip",
    )
