"""Batch input and output rows: the OpenAI batch format and plain rows.

Input, one JSON object a line, either
  OpenAI batch: {"custom_id": ID, "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
                 "body": {"messages": [...] | "prompt": "...", "max_tokens": 64, ...}}
  plain:        {"id": ID, "messages": [...] | "prompt": "...", "max_tokens": 64, ...}
Sampling overrides per row: max_tokens, temperature, top_p, stop, seed. Output rows keep the
input's format: the OpenAI batch output format for batch rows, plain rows for plain rows.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError
from qlift.loaders import read_bytes

OVERRIDES = ("max_tokens", "temperature", "top_p", "stop", "seed")
CHAT_URL, COMPLETIONS_URL = "/v1/chat/completions", "/v1/completions"


@dataclass
class BatchRow:
    """One valid input row, as the worker needs it."""

    index: int  # position among the input's lines (0-based), the output order
    line: int  # 1-based line number in the input file
    id: str
    format: str  # openai | plain
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # the row's overrides only


@dataclass
class RowError:
    line: int
    id: str | None
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {"line": self.line, "id": self.id, "error": self.reason}


def _check_sampling(src: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    out: dict[str, Any] = {}
    for key in OVERRIDES:
        if src.get(key) is None:
            continue
        value = src[key]
        if key in ("max_tokens", "seed") and (not isinstance(value, int) or isinstance(value, bool) or value < 0
                                              or (key == "max_tokens" and value < 1)):
            return out, f"'{key}' must be a {'positive' if key == 'max_tokens' else 'non-negative'} integer"
        if key in ("temperature", "top_p") and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                                or value < 0 or (key == "top_p" and not 0 < value <= 1)):
            return out, f"'{key}' must be a number ({'0 < top_p <= 1' if key == 'top_p' else '>= 0'})"
        if key == "stop" and not (isinstance(value, str) or
                                  (isinstance(value, list) and all(isinstance(s, str) for s in value))):
            return out, "'stop' must be a string or a list of strings"
        out[key] = [value] if key == "stop" and isinstance(value, str) else value
    return out, None


def _check_messages(messages: Any) -> str | None:
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return "each message needs a string 'role' and a string 'content'"
    return None


def parse_row(obj: Any, *, index: int, line: int) -> BatchRow | RowError:
    """One input line's object as a row, or the reason it is refused."""
    if not isinstance(obj, dict):
        return RowError(line, None, "a row must be a JSON object")
    if "custom_id" in obj or "body" in obj:
        fmt, rid, body = "openai", obj.get("custom_id"), obj.get("body")
        if not isinstance(body, dict):
            return RowError(line, _id_or_none(rid), "'body' must be an object")
        url = obj.get("url")
        if url is not None and url not in (CHAT_URL, COMPLETIONS_URL):
            return RowError(line, _id_or_none(rid), f"'url' {url!r} is not {CHAT_URL} or {COMPLETIONS_URL}")
    else:
        fmt, rid, body = "plain", obj.get("id"), obj
    if not isinstance(rid, (str, int)) or isinstance(rid, bool) or str(rid) == "":
        return RowError(line, None, f"missing '{'custom_id' if fmt == 'openai' else 'id'}' (a string or integer)")
    rid = str(rid)
    messages, prompt = body.get("messages"), body.get("prompt")
    if (messages is None) == (prompt is None):
        return RowError(line, rid, "needs exactly one of 'messages' or 'prompt'")
    if messages is not None and (why := _check_messages(messages)):
        return RowError(line, rid, why)
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        return RowError(line, rid, "'prompt' must be a non-empty string")
    sampling, why = _check_sampling(body)
    if why:
        return RowError(line, rid, why)
    return BatchRow(index=index, line=line, id=rid, format=fmt, messages=messages, prompt=prompt, sampling=sampling)


def _id_or_none(rid: Any) -> str | None:
    return str(rid) if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None


@dataclass
class ParsedInput:
    rows: list[BatchRow]
    errors: list[RowError]
    order: dict[str, int]  # id -> input index, for the final ordering


def _text_of(path: Path) -> str:
    """The input's text: UTF-8 (a byte-order mark is dropped); any other encoding is refused whole,
    so that no row is read wrong."""
    raw = read_bytes(path, hint="Pass a JSONL file.")
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise BadInputError("is UTF-16 text; qlift batch reads UTF-8", path=path,
                            hint="Convert it, e.g. `iconv -f UTF-16 -t UTF-8 IN > IN.utf8.jsonl`.")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise BadInputError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x})", path=path, line=line,
                            hint="Convert the file to UTF-8, e.g. `iconv -f LATIN1 -t UTF-8 IN > IN.utf8.jsonl`.") \
            from None


def read_input(path: Path) -> ParsedInput:
    """Every line of ``path``: valid rows, and refused ones with line numbers and reasons."""
    rows: list[BatchRow] = []
    errors: list[RowError] = []
    seen: dict[str, int] = {}
    for lineno, text in enumerate(_text_of(path).split("\n"), start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            errors.append(RowError(lineno, None, f"not JSON: {exc.msg} (column {exc.colno})"))
            continue
        except RecursionError:
            errors.append(RowError(lineno, None, "not JSON: nested too deeply"))
            continue
        parsed = parse_row(obj, index=lineno - 1, line=lineno)
        if isinstance(parsed, RowError):
            errors.append(parsed)
        elif parsed.id in seen:
            errors.append(RowError(lineno, parsed.id, f"duplicate id (first on line {seen[parsed.id]})"))
        else:
            seen[parsed.id] = lineno
            rows.append(parsed)
    if not rows and not errors:
        raise BadInputError("the input file has no rows", path=path,
                            hint="Write one JSON object a line (see docs/batch.md).")
    return ParsedInput(rows=rows, errors=errors, order={r.id: r.index for r in rows})


def request_hash(row: BatchRow, sampling: dict[str, Any]) -> str:
    """What a row asks for (prompt or messages, format, effective sampling): a kept answer is
    reused only while this is unchanged."""
    request = {"format": row.format, "messages": row.messages, "prompt": row.prompt,
               "sampling": {**sampling, **row.sampling}}
    return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:32]


def row_id(out_row: Any) -> str | None:
    """The id of a qlift output row; None for anything qlift does not write."""
    if not isinstance(out_row, dict):
        return None
    if "custom_id" in out_row and isinstance(out_row.get("response"), dict):
        rid = out_row["custom_id"]
    elif "id" in out_row and "text" in out_row and "usage" in out_row:
        rid = out_row["id"]
    else:
        return None
    return None if rid is None or isinstance(rid, (dict, list, bool)) else str(rid)


@dataclass
class OutputRows:
    """A qlift batch output as read for --resume: the complete rows, each id's first."""

    rows: dict[str, str]  # id -> the line as written (with its newline)
    torn: bool  # the last line was cut off (a killed run)


def read_output(out: Path) -> OutputRows:
    """Read ``out`` without changing it; any line that is not a qlift output row is refused."""
    hint = "--resume continues an output qlift wrote; choose another -o, or --force to replace it."
    raw = read_bytes(out, hint=hint)
    end = raw.rfind(b"\n") + 1
    try:
        text = raw[:end].decode("utf-8")
    except UnicodeDecodeError:
        raise BadInputError("not a qlift batch output (not UTF-8)", path=out, hint=hint) from None
    rows: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rid = row_id(json.loads(line))
        except (json.JSONDecodeError, RecursionError):
            rid = None
        if rid is None:
            raise BadInputError("not a qlift batch output row", path=out, line=lineno, hint=hint)
        rows.setdefault(rid, line + "\n")
    return OutputRows(rows=rows, torn=end < len(raw))


def output_row(row: BatchRow, *, text: str, finish_reason: str | None, prompt_tokens: int,
               completion_tokens: int, model: str) -> dict[str, Any]:
    """The output line for ``row``: OpenAI batch output, or a plain row."""
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    if row.format == "plain":
        return {"id": row.id, "text": text, "finish_reason": finish_reason, "usage": usage}
    chat = row.messages is not None
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    request_id = f"batch_req_{uuid.uuid4().hex}"
    body = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice], "usage": usage}
    return {"id": request_id, "custom_id": row.id,
            "response": {"status_code": 200, "request_id": request_id, "body": body}, "error": None}


def rewrite(out: Path, lines: list[str]) -> None:
    """Replace ``out`` with ``lines`` through a temp file and a rename."""
    tmp = out.with_name(temp_name(out))
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(lines)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out)


def temp_name(path: Path) -> str:
    return f".{path.name}.{os.getpid()}.tmp"


def finalize(out: Path, order: dict[str, int]) -> int:
    """Rewrite ``out`` in input order with each id once (atomically); returns the row count."""
    written = read_output(out).rows
    kept = sorted((order[rid], text) for rid, text in written.items() if rid in order)
    rewrite(out, [text for _, text in kept])
    return len(kept)


def write_errors(path: Path, errors: list[dict[str, Any]]) -> None:
    if not errors:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(temp_name(path))
    tmp.write_text("".join(json.dumps(e) + "\n" for e in sorted(errors, key=lambda e: e["line"])), encoding="utf-8")
    os.replace(tmp, path)
