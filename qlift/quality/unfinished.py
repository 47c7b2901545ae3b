"""Answers cut mid-sentence while the server said they were done (finish_reason ``stop``).

A fine-tune that learned to stop early ends its answers mid-clause ("Your refund will be sent to
the") inside the length limit, so the ``length`` share never sees it. What counts as an ending is
generous, because a false alarm on a healthy answer costs a rollout: a sentence end in any script
(Unicode's full stops, question and exclamation marks, dandas, shads, ellipses ...: 。｡．！？ ؟ ۔ । ።
။ …), every closing bracket and quote (Unicode Pe and Pf: 」』）】》”’» ...), a list item, a table
row, a heading, a code block (fenced or indented), an inline code span, formula, emphasis or HTML tag
at the end, JSON, a URL, an emoji or kaomoji, a Japanese or Korean sentence-final form (です, 요), a
poem's short lines, a number at the end of a short answer, a short sign-off, signature or footer line
("祝好，\n客服小王", "—— 小助手", hashtags, "来源：国家统计局"), a line in emphasis. Thai and Lao write
no sentence punctuation: an answer ending in them is not judged.
"""

from __future__ import annotations

import re
import unicodedata

from qlift.quality.language import json_value
from qlift.quality.text import CJK, tokens
from qlift.quality.textshape import without_trailing_markers

CUT_REASONS = frozenset({"length", "content_filter"})  # cut on purpose: other checks count those
MIN_TOKENS = 8  # a one-line fragment under this many words ("Order A123 shipped") is a terse answer
_TRAILING = "\"'”’»」』)]}*_~`>"  # closers after a sentence end: quotes, brackets, markdown emphasis
_ENDS = frozenset(".!?…。！？；;~～")
_FINAL_PARTICLES = frozenset("了吗呢吧啊哦呀啦嘛哈")  # Chinese chat often ends on these without a stop
_STRUCTURED = re.compile(r"^\s*([-*+•]\s|\d+[.)]\s|#{1,6}\s|\||>|```)")  # list item, table, heading, quote, fence
_URL_END = re.compile(r"(https?://\S+|[\w.+-]+@[\w-]+\.[\w.-]+)$")  # the last line ends in a URL
_SIGN_OFF = re.compile(r"^\W*(thanks|thank you|cheers|best|regards|best regards|kind regards|sincerely|warm regards"
                       r"|祝好|谢谢|此致|敬礼|顺祝商祺|よろしくお願いします|よろしくお願いいたします|감사합니다"
                       r"|с уважением|saludos|un saludo|atentamente|مع خالص التحية)\W*$", re.IGNORECASE)
# A short last paragraph that closes an answer: a signature ("—— 小助手"), hashtags, a "label: value" footer
_FOOTER = re.compile(r"^(?:(?:—|–|--|~)+\s*\S|#[^\s#]+(?:\s+#[^\s#]+)*$|[^\W\d_][^:：]{0,11}[:：]\s*\S)")
_EMPHASIS_LINE = re.compile(r"^(\*{1,3}|_{1,3})\S.*\S\1$")  # "*数据来源：国家统计局*"
_WORDS = re.compile(r"[^\W_]+")
_SENTENCE_END_NAMES = ("FULL STOP", "QUESTION MARK", "EXCLAMATION", "DANDA", "SEMICOLON", "ELLIPSIS", "LEADER",
                       "SHAD", "KHAN", "SIGN SECTION", "ARABIC COMMA")  # Po characters named so end a sentence
_FINAL_FORMS = ("です", "ます", "でした", "ました", "ません", "ください", "ましょう", "よ", "ね",  # Japanese
                "다", "요", "죠", "까")  # Korean: chat drops the stop after these as Chinese does after 了, 吗
_MARKUP_END = re.compile(r"(`|\*\*|__|~~|\$|\\[\])]|</?[A-Za-z][^<>\n]*>|-->)$")  # code, emphasis, formula, tag
_RULE = re.compile(r"^([-*_])(\s*\1){2,}$")  # a markdown horizontal rule
_KAOMOJI = re.compile(r"[(（](?=[^()（）\n]*?[^\w\s()（）,.，。、])[^()（）\n]{1,14}[)）]\w?[^\w\s]{0,2}$"
                      r"|[\^＾][_\-oOωｏ.]?[\^＾]$|[>＞][_\-﹏][<＜]$|(?<![A-Za-z])T[_.]?T$|(?<!\w)orz$"
                      rf"|(?<=[{CJK}])[wｗ]+$|[\u3131-\u318e]{{2,}}$")  # (ง •̀_•́)ง ^_^ ｗｗ ㅋㅋ
_NUMBER_END = re.compile(r"\d[\d.,]*\s*[%‰°℃℉]?\s*[^\W\d_]{0,3}[²³]?(/[^\W\d_]{1,3})?$")  # 42, 8848.86米, 3 km/h
SHORT_TOKENS = 40  # an answer this short may end on a number ("珠穆朗玛峰高8848.86米")
VERSE_LINES, VERSE_TOKENS = 3, 12  # a last stanza of this many lines this short, no stop inside: a poem
_UNPUNCTUATED = ("THAI", "LAO")  # scripts written without sentence punctuation: not judged
_EMOJI_TAILS = "\ufe0e\ufe0f\u200d"  # variation selectors and the joiner after an emoji


def _emoji(ch: str) -> bool:
    """An emoji or a symbol that closes like one: So, Sk (^, a skin tone), Me (a keycap: 1️⃣)."""
    return unicodedata.category(ch) in ("So", "Sk", "Me") or 0x1F000 <= ord(ch) <= 0x1FAFF


def _ending_char(ch: str) -> bool:
    """A closing bracket or quote (Unicode Pe, Pf; ASCII quotes), or a sentence end of any script (a Po
    character named as one, not an opening ¿ ¡)."""
    category = unicodedata.category(ch)
    if category in ("Pe", "Pf") or ch in "\"'":
        return True
    name = unicodedata.name(ch, "")
    return category == "Po" and "INVERTED" not in name and any(k in name for k in _SENTENCE_END_NAMES)


def _verse(lines: list[str]) -> bool:
    """The last stanza is VERSE_LINES+ short lines with no sentence end: a poem, whose line breaks end it."""
    stanza = []
    for line in reversed(lines):
        if not line.strip():
            break
        stanza.append(line)
    return len(stanza) >= VERSE_LINES and all(
        len(tokens(line)) <= VERSE_TOKENS and not any(c in _ENDS for c in line) for line in stanza)


def _ends_sentence(last: str) -> bool:
    """The last line ends in a sentence end, closing bracket or quote, emoji or final form (past closers)."""
    tail = last.rstrip(_TRAILING) or last
    ch = tail.rstrip(_EMOJI_TAILS)[-1:] or tail[-1]
    return ch in _ENDS or ch in _FINAL_PARTICLES or _emoji(ch) or _ending_char(last[-1]) or _ending_char(ch) \
        or tail.endswith(_FINAL_FORMS)


def _may_end_in_kaomoji(last: str) -> bool:
    """What every _KAOMOJI branch needs at the line's end: an opening bracket in its last 19 characters (the
    longest bracketed one), or a last character of the others. Searching is ~40 us a line; this, ~1 us."""
    end = last[-1]
    return "(" in last[-19:] or "（" in last[-19:] or end in "^＾<＜Twｗz" or "\u3131" <= end <= "\u318e"


def ends_finished(text: str) -> bool:
    """The text ends the way a finished answer ends (see the module's list)."""
    body = text.rstrip()
    if not body:
        return True
    lines = body.splitlines()
    last = lines[-1].strip()
    if _ends_sentence(last):
        return True  # most answers: every other test below is a way to be True as well
    if body.endswith("```") or _STRUCTURED.match(last) or ("://" in last or "@" in last) and _URL_END.search(last) \
            or lines[-1][:1] in (" ", "\t") or _MARKUP_END.search(last) or _RULE.match(last) \
            or _may_end_in_kaomoji(last) and _KAOMOJI.search(last) or _verse(lines) or _EMPHASIS_LINE.match(last):
        return True
    if len(lines) <= 3 and _NUMBER_END.search(last) and len(tokens(body)) <= SHORT_TOKENS:
        return True  # "答案是 42", "珠穆朗玛峰高8848.86米"
    if last[-1] in "}]" and json_value(body)[0]:
        return True
    before = next((line.strip() for line in reversed(lines[:-1]) if line.strip()), "")
    after_comma = before.endswith((",", "，", "،")) or bool(_SIGN_OFF.match(before))
    footer = len(lines) > 1 and not lines[-2].strip() and _FOOTER.match(last)
    # "Best regards,\nThe Acme team", "祝好，\n客服小王", "\n\n—— 小助手", "\n\n来源：国家统计局"
    return len(last) < 60 and len(_WORDS.findall(last)) <= 4 and bool(_SIGN_OFF.match(last) or after_comma or footer)


def unfinished(text: str, finish_reason: str | None) -> bool | None:
    """True when a ``stop`` answer ends mid-sentence; None without a finish reason, for answers the server
    cut (length, content_filter: their own checks count them) and for empty answers."""
    if finish_reason is None or finish_reason in CUT_REASONS or not text.strip():
        return None
    text = without_trailing_markers(text)  # "...done.<|im_end|>": the text_shape check names the debris
    if not text.strip():
        return None
    if ends_finished(text):
        return False
    if unicodedata.name(text.rstrip()[-1], "").startswith(_UNPUNCTUATED):
        return None  # no sentence punctuation to tell a cut by
    if text.rstrip()[-1] in ":：,，":
        return True  # "Here are the steps:" promised more
    has_stop = not _ENDS.isdisjoint(text.rstrip()[:-1])
    return has_stop or len(tokens(text)) >= MIN_TOKENS
