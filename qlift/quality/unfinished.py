"""Answers cut mid-sentence while the server said they were done (finish_reason ``stop``).

A fine-tune that learned to stop early ends its answers mid-clause ("Your refund will be sent to
the") inside the length limit, so the ``length`` share never sees it. What counts as an ending is
generous, because a false alarm on a healthy answer costs a rollout: a sentence end in any script,
a list item, a table row, a heading, a code block (fenced or indented), JSON, a URL, an emoji, a
short sign-off line.
"""

from __future__ import annotations

import re
import unicodedata

from qlift.quality.schema import parse_json_output

CUT_REASONS = frozenset({"length", "content_filter"})  # cut on purpose: other checks count those
MIN_TOKENS = 8  # a one-line fragment under this many words ("Order A123 shipped") is a terse answer
_TRAILING = "\"'”’»」』)]}*_~`>"  # closers after a sentence end: quotes, brackets, markdown emphasis
_ENDS = frozenset(".!?…。！？；;~～")
_FINAL_PARTICLES = frozenset("了吗呢吧啊哦呀啦嘛哈")  # Chinese chat often ends on these without a stop
_STRUCTURED = re.compile(r"^\s*([-*+•]\s|\d+[.)]\s|#{1,6}\s|\||>|```)")  # list item, table, heading, quote, fence
_URL_END = re.compile(r"https?://\S+|[\w.+-]+@[\w-]+\.[\w.-]+")
_SIGN_OFF = re.compile(r"^\W*(thanks|thank you|cheers|best|regards|best regards|kind regards|sincerely|warm regards"
                       r"|祝好|谢谢|此致|敬礼)\W*$", re.IGNORECASE)
_WORDS = re.compile(r"[^\W_]+")


def _emoji(ch: str) -> bool:
    return unicodedata.category(ch) == "So" or 0x1F000 <= ord(ch) <= 0x1FAFF


def ends_finished(text: str) -> bool:
    """The text ends the way a finished answer ends (see the module's list)."""
    body = text.rstrip()
    if not body:
        return True
    lines = body.splitlines()
    last = lines[-1].strip()
    if body.endswith("```") or _STRUCTURED.match(last) or _URL_END.fullmatch(last.rsplit(None, 1)[-1]) \
            or lines[-1][:1] in (" ", "\t"):
        return True
    if last[-1] in "}]" and parse_json_output(body)[0]:
        return True
    after_comma = len(lines) > 1 and lines[-2].rstrip().endswith(",")
    if len(last) < 60 and len(_WORDS.findall(last)) <= 4 and (_SIGN_OFF.match(last) or after_comma):
        return True  # "Best regards,\nThe Acme team"
    tail = last.rstrip(_TRAILING) or last
    ch = tail[-1]
    return ch in _ENDS or ch in _FINAL_PARTICLES or _emoji(ch) or last.endswith(")")


def unfinished(text: str, finish_reason: str | None) -> bool | None:
    """True when a ``stop`` answer ends mid-sentence; None without a finish reason, for answers the server
    cut (length, content_filter: their own checks count them) and for empty answers."""
    if finish_reason is None or finish_reason in CUT_REASONS or not text.strip():
        return None
    if ends_finished(text):
        return False
    from qlift.quality.repetition import tokens

    if text.rstrip()[-1] in ":：,，":
        return True  # "Here are the steps:" promised more
    has_stop = any(c in _ENDS for c in text.rstrip()[:-1])
    return has_stop or len(tokens(text)) >= MIN_TOKENS
