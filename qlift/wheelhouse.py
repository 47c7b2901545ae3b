"""Wheelhouses: a tool environment's packages as wheel files, for a machine with no package index.

Built on a connected machine for the *target's* Python and platform (pip's --python-version and
--platform), leaving out what the target already has: a ``pip freeze`` of it, or a list of names.

1. ``pip install --dry-run --report`` resolves the requirements for the target. The target's
   packages stand in as metadata-only wheels pinned to its versions (its own packages are then
   kept, and torch's CUDA dependencies never looked up); if they cannot all be kept
   (llm-compressor needs compressed-tensors 0.19 where vLLM brought 0.17), it resolves again
   with only torch's family pinned.
2. Every resolved package is downloaded (``pip download --no-deps``) unless the target's version
   satisfies every requirement on it in the resolution. torch, triton and nvidia-* are never
   downloaded: the target must have them (they are gigabytes and tied to its CUDA).

On the target, ``qlift env quantize --setup --wheelhouse DIR`` installs with ``--no-index``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError, ExternalToolError, NotFoundError

NEVER_DOWNLOADED = re.compile(r"^(torch|triton|pytorch-triton|nvidia-.+-cu\d+)$")  # CUDA builds and libraries
_MANYLINUX = re.compile(r"^manylinux_2_(\d+)_(\w+)$")
_LEGACY_MANYLINUX = {5: "manylinux1", 12: "manylinux2010", 17: "manylinux2014"}
_HAVE_LINE = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._\-]*)(\[[^\]]*\])?\s*(===?\s*(?P<version>[^\s;]+)|@\s*\S+)?")
_NO_WHEEL = re.compile(r"No matching distribution found for ([A-Za-z0-9._\-\[\]]+)(.*)")
_NEEDED_BY = re.compile(r"Could not find a version that satisfies the requirement (\S+) \(from ([^)]+)\)")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class WheelhouseResult:
    path: str
    python_version: str
    platforms: list[str]
    wheels: list[str]
    size_bytes: int
    kept_from_target: dict[str, str]  # package -> the target's version, reused there
    constrained: bool  # resolved with every target version pinned (else only torch's family)
    seconds: float
    notes: list[str] = field(default_factory=list)


def expand_platforms(platforms: list[str]) -> list[str]:
    """pip matches --platform literally: manylinux_2_28_x86_64 also means every older manylinux tag."""
    out: list[str] = []
    for plat in platforms:
        m = _MANYLINUX.match(plat)
        if not m:
            out.append(plat)
            continue
        glibc, arch = int(m.group(1)), m.group(2)
        for minor in range(glibc, 4, -1):
            out.append(f"manylinux_2_{minor}_{arch}")
            if minor in _LEGACY_MANYLINUX:
                out.append(f"{_LEGACY_MANYLINUX[minor]}_{arch}")
    return list(dict.fromkeys(out))


def read_have(path: Path) -> dict[str, str | None]:
    """A ``pip freeze`` (name==version) or a list of names (then any version counts as fitting)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise NotFoundError(f"cannot read {path}: {exc.strerror}",
                            hint="Pass the target's `pip freeze` output.") from None
    have: dict[str, str | None] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = _HAVE_LINE.fullmatch(line)
        if not m:
            raise BadInputError(f"{path}: cannot read the line {raw.strip()!r}",
                                hint="Write one `name==version` (pip freeze) or one name per line.")
        version = m.group("version")
        have[normalize(m.group("name"))] = version.split("+")[0] if version else None
    return have


def marker_environment(python_version: str, platforms: list[str]) -> dict[str, str]:
    if not platforms:  # this machine's platform
        from packaging.markers import default_environment

        here = {k: str(v) for k, v in default_environment().items()}
        return here | {"python_version": python_version, "python_full_version": f"{python_version}.0", "extra": ""}
    plat = platforms[0]
    arch = plat.rsplit("_", 2)[-1] if "x86_64" not in plat else "x86_64"
    system = ("Linux" if "linux" in plat else "Darwin" if plat.startswith("macosx")
              else "Windows" if "win" in plat else "")
    return {
        "python_version": python_version, "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython", "platform_python_implementation": "CPython",
        "sys_platform": {"Linux": "linux", "Darwin": "darwin", "Windows": "win32"}.get(system, ""),
        "platform_system": system, "os_name": "nt" if system == "Windows" else "posix",
        "platform_machine": arch, "platform_release": "", "platform_version": "", "extra": "",
    }


def _target_args(python_version: str, platforms: list[str]) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for plat in expand_platforms(platforms):
        args += ["--platform", plat]
    return args


def _pip(args: list[str], what: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def _last_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    conflict = [ln for ln in lines if "conflicting dependencies" in ln]  # names the clashing pins
    if conflict:
        return conflict[0].removeprefix("ERROR: ")
    errors = [ln for ln in lines if ln.startswith("ERROR") or "error" in ln.lower()]
    return (errors or lines or [f"exit code {proc.returncode}"])[-1]


def _stub_wheels(directory: Path, pins: dict[str, str]) -> None:
    """A metadata-only wheel per package the target has, version ``V+have``: the resolver takes it
    over the index's ``V`` (a local label sorts above), as pip on the target keeps what is installed,
    and never looks at its dependencies (torch's CUDA wheels), which the target has too."""
    import zipfile

    directory.mkdir(parents=True, exist_ok=True)
    for name, version in pins.items():
        dist, ver = re.sub(r"[-.]+", "_", name), f"{version}+have"
        info = f"{dist}-{ver}.dist-info"
        files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\n",
                 f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: qlift\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
        files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
        with zipfile.ZipFile(directory / f"{dist}-{ver}-py3-none-any.whl", "w") as zf:
            for arc, text in files.items():
                zf.writestr(arc, text)


def resolve(requirements: list[str], target: list[str], pins: dict[str, str]) -> list[dict[str, Any]] | str:
    """The packages pip would install for a target that has ``pins``: the report's ``install`` items,
    or pip's error line."""
    with tempfile.TemporaryDirectory(prefix="qlift-wheelhouse-") as tmp:
        stubs = Path(tmp) / "have"
        _stub_wheels(stubs, pins)
        cons = Path(tmp) / "constraints.txt"
        cons.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())), encoding="utf-8")
        report = Path(tmp) / "report.json"
        proc = _pip(["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
                     "--target", str(Path(tmp) / "target"), "--find-links", str(stubs), *target,
                     "-c", str(cons), *requirements], "resolve")
        if proc.returncode != 0 or not report.is_file():
            return _last_error(proc)
        items: list[dict[str, Any]] = json.loads(report.read_text(encoding="utf-8"))["install"]
        return items


def requirements_on(items: list[dict[str, Any]], top: list[str], env: dict[str, str]) -> dict[str, list[Any]]:
    """package -> every specifier set placed on it (by ``top`` and by the resolved packages' metadata)."""
    from packaging.requirements import Requirement

    specs: dict[str, list[Any]] = {}

    def add(text: str, extras: list[str]) -> None:
        req = Requirement(text)
        if req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in ["", *extras]):
            return
        specs.setdefault(normalize(req.name), []).append(req.specifier)

    for text in top:
        add(text, [])
    for item in items:
        for text in item["metadata"].get("requires_dist") or []:
            add(text, item.get("requested_extras") or [])
    return specs


def plan(items: list[dict[str, Any]], top: list[str], have: dict[str, str | None] | None,
         env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """(name==version to download, {package: target version kept}); raises if torch & co. would be needed
    and ``have`` (the target's packages; None: not known, then taken to have torch's family) lacks them."""
    assume_torch = have is None
    have = have or {}
    specs = requirements_on(items, top, env)
    download: list[str] = []
    kept: dict[str, str] = {}
    for item in items:
        name, version = normalize(item["metadata"]["name"]), item["metadata"]["version"]
        mine = have.get(name, "") if name in have else None
        fits = name in have and (mine is None or all(s.contains(mine, prereleases=True) for s in specs.get(name, [])))
        if fits:
            kept[name] = mine or "any"
        elif NEVER_DOWNLOADED.match(name) and assume_torch:
            kept[name] = "assumed"
        elif NEVER_DOWNLOADED.match(name):
            where = f"has {name} {mine}" if name in have else f"has no {name}"
            raise BadInputError(f"the target {where}, and the tool needs {name}=={version} (never put in a wheelhouse)",
                                hint=f"Install {name} there first, or list the version it has with --have.")
        else:
            download.append(f"{name}=={version}")
    return download, kept


def download_wheelhouse(requirements: list[str], dest: Path, *, python_version: str, platforms: list[str],
                        have: dict[str, str | None] | None,
                        say: Callable[[str], None] | None = None) -> WheelhouseResult:
    """Put the wheels ``requirements`` need on the target (minus what it ``have``s) into ``dest``.

    ``have`` None: the target's packages are not known; all is downloaded but torch's family."""
    say = say or (lambda msg: None)
    if not re.fullmatch(r"3\.\d{1,2}", python_version):
        raise BadInputError(f"--python-version {python_version!r} is not like 3.12",
                            hint="Pass MAJOR.MINOR, e.g. 3.12.")
    t0 = time.monotonic()
    target = _target_args(python_version, platforms)
    pinned = {n: v for n, v in (have or {}).items() if v}
    say(f"resolving {' '.join(requirements)} for Python {python_version} on {', '.join(platforms) or 'any'}")
    items = resolve(requirements, target, pinned)
    constrained, notes = True, []
    if isinstance(items, str):
        notes.append(f"the target's versions cannot all be kept ({items}); resolving with only torch's family pinned")
        say(notes[-1])
        constrained = False
        items = resolve(requirements, target, {n: v for n, v in pinned.items() if NEVER_DOWNLOADED.match(n)})
    if isinstance(items, str):
        raise ExternalToolError(f"pip could not resolve {' '.join(requirements)} for the target: {items}",
                                hint="Check the --have list and network access to the package index.", tool="pip")
    wanted, kept = plan(items, requirements, have, marker_environment(python_version, platforms))
    dest.mkdir(parents=True, exist_ok=True)
    if wanted:
        say(f"downloading {len(wanted)} wheels into {dest}")
        proc = _pip(["download", "--no-deps", "--quiet", "-d", str(dest), *target, *wanted], "download")
        if proc.returncode != 0:
            raise ExternalToolError(f"pip download failed: {_last_error(proc)}",
                                    hint="Check network access to the package index and free disk space.", tool="pip")
    wheels = sorted(p.name for p in dest.glob("*.whl"))
    return WheelhouseResult(
        path=str(dest), python_version=python_version, platforms=platforms, wheels=wheels,
        size_bytes=sum((dest / w).stat().st_size for w in wheels), kept_from_target=kept,
        constrained=constrained, seconds=round(time.monotonic() - t0, 1), notes=notes,
    )


def check_wheelhouse(path: Path) -> None:
    if not path.is_dir():
        raise NotFoundError(f"wheelhouse {path} is not a directory",
                            hint="Pass the directory the wheels were downloaded into (--download-wheelhouse).")
    if not any(path.glob("*.whl")):
        raise NotFoundError(f"wheelhouse {path} holds no .whl files",
                            hint="Build it on a connected machine with `qlift env quantize --download-wheelhouse DIR`.")


def missing_wheel_error(pip_output: str, wheelhouse: Path, tool: str) -> ExternalToolError | None:
    """One line naming the package a --no-index install found no wheel for, and how to add it."""
    m = _NO_WHEEL.search(pip_output)
    if not m:
        return None
    name = m.group(1)
    needed = _NEEDED_BY.search(pip_output)
    by = f" (needed by {needed.group(2)})" if needed and normalize(needed.group(1)).startswith(normalize(name)) else ""
    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    return ExternalToolError(
        f"the wheelhouse {wheelhouse} has no wheel of {name} for this Python {pyver}{by}",
        hint=f"On a connected machine: `pip download --no-deps --only-binary=:all: --python-version {pyver} "
        f"-d {wheelhouse} '{name}'` (add --platform for another OS), or rebuild the whole wheelhouse with "
        f"`qlift env {tool} --download-wheelhouse DIR --python-version {pyver}`; then copy it here.",
        tool="pip",
    )
