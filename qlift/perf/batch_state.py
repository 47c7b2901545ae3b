"""The files ``qlift batch`` writes beside OUT, and what ``--resume`` keeps of an earlier run.

Beside ``OUT.jsonl`` qlift writes ``OUT.errors.jsonl`` (refused rows) and ``OUT.qlift-batch.json``
(the state: each id's request hash). The state file is what marks OUT as qlift's: ``--resume``
touches no byte of an OUT without one. A kept row must have the same id and the same request
hash as a row of today's input; the rest are run again (changed) or dropped (gone).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError
from qlift.fsutil import check_not_an_input, make_output_dirs
from qlift.perf.batch_rows import BatchRow, read_output, request_hash, rewrite, temp_name

STATE_KIND = "qlift-batch-state/1"


@dataclass(frozen=True)
class BatchFiles:
    out: Path
    errors: Path
    state: Path

    @classmethod
    def beside(cls, out: Path) -> BatchFiles:
        stem = out.name.removesuffix(".jsonl")
        return cls(out, out.with_name(f"{stem}.errors.jsonl"), out.with_name(f"{stem}.qlift-batch.json"))

    def all(self) -> list[Path]:
        """Every path qlift writes, temp files included."""
        files = [self.out, self.errors, self.state]
        return files + [p.with_name(temp_name(p)) for p in files]

    def check(self, inputs: list[Path]) -> None:
        """Refuse, before any work, a written file that is an input or a directory; make OUT's directory."""
        for path in self.all():
            check_not_an_input(path, inputs)
        for path in (self.out, self.errors, self.state):
            if path.is_dir():
                raise BadInputError(f"{path} is a directory; qlift batch writes a file there",
                                    hint="Choose another -o path (--force replaces files, never directories).")
        make_output_dirs(self.out.parent, named="-o")


@dataclass
class Resumed:
    kept: dict[str, str]  # id -> output line kept from the earlier run
    changed: int  # ids whose request changed since: run again
    dropped: int  # ids no longer in the input: removed from OUT


def read_state(files: BatchFiles) -> dict[str, str]:
    """id -> request hash of the run that wrote OUT; refuses an OUT qlift did not write."""
    hint = "--resume continues an output qlift batch wrote; choose another -o, or pass --force to replace it."
    try:
        data = json.loads(files.state.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInputError(f"{files.out} has no {files.state.name} beside it, so it is not a qlift batch output "
                            "(left untouched)", hint=hint) from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or data.get("kind") != STATE_KIND or not isinstance(data.get("rows"), dict):
        raise BadInputError(f"not a qlift batch state file (kind {STATE_KIND})", path=files.state, hint=hint)
    return {str(k): str(v) for k, v in data["rows"].items()}


def resume(files: BatchFiles, rows: list[BatchRow], hashes: dict[str, str]) -> Resumed:
    """OUT's rows whose id and request are unchanged (reads only; refuses an OUT qlift did not write)."""
    if not files.out.exists():
        return Resumed({}, 0, 0)
    before = read_state(files)
    written = read_output(files.out).rows
    kept = {r.id: written[r.id] for r in rows if r.id in written and before.get(r.id) == hashes[r.id]}
    changed = sum(1 for r in rows if r.id in written and r.id not in kept)
    dropped = sum(1 for rid in written if rid not in hashes)
    return Resumed(kept, changed, dropped)


def keep_only(files: BatchFiles, resumed: Resumed) -> None:
    """Rewrite OUT to the kept rows (in input order, atomically) before anything is appended:
    a torn last line, changed and dropped rows go."""
    if files.out.exists():
        rewrite(files.out, list(resumed.kept.values()))


def write_state(files: BatchFiles, hashes: dict[str, str]) -> None:
    """Written before rows are appended: every row in OUT then belongs to a hash recorded here."""
    data: dict[str, Any] = {"kind": STATE_KIND, "output": files.out.name, "rows": hashes}
    rewrite(files.state, [json.dumps(data, ensure_ascii=False) + "\n"])


def hashes_for(rows: list[BatchRow], sampling: dict[str, Any]) -> dict[str, str]:
    return {r.id: request_hash(r, sampling) for r in rows}


def remove_stale(files: BatchFiles) -> None:
    """--force: the old OUT and its state go before the new run writes either."""
    for path in (files.out, files.state):
        path.unlink(missing_ok=True)
