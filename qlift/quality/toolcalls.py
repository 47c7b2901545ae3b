"""Tool calls: an answer's calls checked against the tools its request offered.

A call is broken when its ``function.arguments`` do not parse as a JSON object, do not validate against
the offered tool's ``parameters`` schema, or name a tool that was not offered; an answer is broken when
``tool_choice`` asked for a call ("required", or a named function) and none came. A server without a
tool parser (vLLM without ``--tool-call-parser``) hands a Hermes/Qwen2.5-style call back as text,
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``: where the answer has no calls, such blocks
are read as its calls, and one whose JSON is broken is flagged.

A call is ``(name, arguments)``; arguments None means the router kept only part of them (too long to
keep): its name is checked, its arguments are not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from qlift.quality.schema import matches_schema

ToolCall = tuple[str, str | None]  # (function name, its arguments as the server sent them; None: not kept whole)

_TEXT_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)

# The rules, as evidence names them.
NOT_JSON = "arguments_not_json"
OFF_SCHEMA = "arguments_off_schema"
UNKNOWN_TOOL = "unknown_tool"
NO_CALL = "no_call"
BROKEN_TEXT = "tool_call_text_broken"


def offered_tools(request: dict[str, Any]) -> dict[str, dict[str, Any] | None] | None:
    """The request's function tools: name -> its parameters schema (None: none given or not kept); None when
    the request offered no tools."""
    tools = request.get("tools")
    if not isinstance(tools, list):
        return None
    out: dict[str, dict[str, Any] | None] = {}
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, dict) else None
    return out or None


def required_call(request: dict[str, Any]) -> str | None:
    """What ``tool_choice`` demands: "" any call ("required"), a function's name (a named function), or None."""
    choice = request.get("tool_choice")
    if choice == "required":
        return ""
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else None


def calls_of(raw: Iterable[Any] | None) -> tuple[ToolCall, ...]:
    """OpenAI ``tool_calls`` (``{"function": {"name", "arguments"}}`` each) as calls; a call the router marked
    ``cut`` has its arguments None. Arguments sent as an object rather than a string are kept as its JSON."""
    out: list[ToolCall] = []
    for call in raw or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            continue
        name, args = fn.get("name"), fn.get("arguments")
        if args is not None and not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        out.append((name if isinstance(name, str) else "", None if call.get("cut") else args or ""))
    return tuple(out)


def text_calls(text: str) -> tuple[tuple[ToolCall, ...], bool]:
    """(the calls in an answer's ``<tool_call>`` blocks, True when a block is no ``{"name", "arguments"}``
    JSON object)."""
    calls: list[ToolCall] = []
    broken = False
    for block in _TEXT_CALL.findall(text):
        try:
            value = json.loads(block)
        except ValueError:
            value = None
        args = value.get("arguments", {}) if isinstance(value, dict) else None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not isinstance(args, dict | str):
            broken = True
            continue
        calls.append((value["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
    return tuple(calls), broken


def _arguments_problem(args: str, schema: dict[str, Any] | None) -> str | None:
    try:
        value = json.loads(args) if args.strip() else {}  # "" for a function without parameters: {}
    except ValueError:
        return NOT_JSON
    if not isinstance(value, dict):
        return NOT_JSON
    if schema is None:
        return None
    try:
        return None if matches_schema(schema, json.dumps(value)) else OFF_SCHEMA
    except Exception:  # the offered schema is no valid schema: the call cannot be held to it
        return None


def problem(request: dict[str, Any], calls: tuple[ToolCall, ...], text: str) -> str | None:
    """The first rule a tool-using answer breaks, as ``rule (function)`` or ``rule``; None when it breaks none
    or the request offered no tools."""
    tools = offered_tools(request)
    if tools is None:
        return None
    if not calls and "<tool_call>" in text:
        calls, broken = text_calls(text)
        if broken:
            return BROKEN_TEXT
    for name, args in calls:
        if name not in tools:
            return f"{UNKNOWN_TOOL} ({name})"
        got = None if args is None else _arguments_problem(args, tools[name])
        if got is not None:
            return f"{got} ({name})"
    wanted = required_call(request)
    if wanted is not None and not any(not wanted or name == wanted for name, _ in calls):
        return f"{NO_CALL} ({wanted})" if wanted else NO_CALL
    return None


def tool_call_broken(request: dict[str, Any], calls: tuple[ToolCall, ...], text: str) -> bool | None:
    """True when a tool-using answer breaks a rule (``problem``); None when the request offered no tools or
    turned them off (``tool_choice`` "none")."""
    if offered_tools(request) is None or request.get("tool_choice") == "none":
        return None
    return problem(request, calls, text) is not None
