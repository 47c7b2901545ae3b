"""The answer checks' shortcuts (benchmarks/quality_checks.py: a 2,000-pair window judged cold) give what the
plain definitions they stand in for give: each is checked against that definition on seeded random text of
the kinds that could tell them apart (case context, combining marks, line starts, quotes, JSON starts)."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from qlift.quality import language, repetition, rephrase, textshape, unfinished
from qlift.quality.content_units import _DIGIT_GROUP
from qlift.quality.registry import ANSWER_METRICS, Answer, _request_parts, answer_flags, request_parts
from qlift.quality.schema import parse_json_output
from qlift.quality.text import span_tokens, token_spans

PIECES = ["ΑΣ", "σ", "ς", "ΟΔΟΣ", ".", "!", "?", "。", "！", " ", "\n", "e\u0301", "İ", "ſ", "\u212a", "你好", "的",
          "ß", "ﬁ", "'", '"', "“", "「", "」", "(", ")", "-", "* ", "1.", "٣", "{", "[", "```", "`", "^_^", "ㅋㅋ",
          "a", "Word", "don't", "7,000", "1.5", "\u4dbf", "$x$", "\t", ":", "=", "|"]


def _texts(n: int, seed: int, pieces: list[str] = PIECES, most: int = 12) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, most))) for _ in range(n)]


def test_span_tokens_are_the_tokens_of_token_spans() -> None:
    for text in _texts(3000, 1):
        assert span_tokens(text) == [t for t, _, _ in token_spans(text)], text


def test_a_line_tokenized_once_gives_each_sentence_its_own_tokens() -> None:
    """Final sigma, NFC and marks: the marked line keeps each sentence's own case and normalisation context."""
    for line in _texts(3000, 2):
        pieces = textshape._SENTENCE_END.split(line)
        assert textshape._sentence_keys(line) == [textshape._sentence_key(p) for p in pieces], line


def _brute_passages(toks: list[str], k: int) -> list[tuple[int, int]]:
    grams = [tuple(toks[i:i + k]) for i in range(len(toks) - k + 1)]
    earlier = [grams.index(g) < i for i, g in enumerate(grams)]
    out, i = [], 0
    while i < len(earlier):
        if earlier[i]:
            j = i
            while j < len(earlier) and earlier[j]:
                j += 1
            out.append((i, j - i + k - 1))
            i = j
        else:
            i += 1
    return out


@pytest.mark.parametrize("n", [textshape.RUN_TOKENS, textshape.PROSE_PASSAGE_TOKENS, textshape.PASSAGE_TOKENS, 9])
def test_runs_of_ids_find_the_repeats_that_runs_of_tokens_find(n: int) -> None:
    rng = random.Random(n)
    for _ in range(300):
        vocabulary = [f"w{i}" for i in range(rng.randint(1, 6))]
        toks = [rng.choice(vocabulary) for _ in range(rng.randint(0, 60))]
        runs = textshape._Runs(toks)
        grams = [tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)]
        assert runs.repeat(n) == (len(set(grams)) < len(grams))
        assert list(runs.passages(n)) == _brute_passages(toks, n)


def test_the_json_shortcut_parses_what_parse_json_output_parses() -> None:
    texts = ['{"a": 1}', " [1, 2] ", "```json\n{}\n```", "\u3000{}", "\ufeff{}", "-1", "NaN", "true", "nope", "",
             "   ", '"s"', "Infinity", "Sure: {}", "\n\t```\n[]\n```\n", "Ｎ"]
    for text in texts + _texts(1000, 3):
        assert language.json_value(text) == parse_json_output(text), text


def test_request_parts_are_read_again_when_a_request_changes() -> None:
    request: dict[str, Any] = {"messages": [{"role": "user", "content": "Hello there"}],
                               "response_format": {"type": "json_object"}}
    assert request_parts(request) == _request_parts(request)
    request["messages"].append({"role": "user", "content": "And again"})  # messages grew
    assert request_parts(request)[0] == "And again"
    request["response_format"] = {"type": "text"}  # a top-level value replaced
    assert request_parts(request) == _request_parts(request)
    request["system"] = "Be brief."
    assert request_parts(request) == _request_parts(request)


def test_the_prechecks_skip_only_texts_their_pattern_cannot_match() -> None:
    for text in _texts(4000, 4):
        last = text.strip()  # what ends_finished reads: the last line, stripped
        assert not last or unfinished._KAOMOJI.search(last) is None or unfinished._may_end_in_kaomoji(last), text
        assert rephrase._LIST_ITEM.search(text) is None or rephrase._may_hold_list(text), text
        one_line = "\n" not in text and text.lstrip(" \t")[:1] not in textshape._RULE_CHARS
        assert textshape._RULE_LINE.search(text) is None or not one_line, text


def test_a_quote_checked_behind_it_is_the_quote_a_lookbehind_first_finds() -> None:
    behind_first = re.compile(language._QUOTED.pattern.replace("|'(?<!\\w')", "|(?<!\\w)'"))
    assert behind_first.pattern != language._QUOTED.pattern
    for text in _texts(4000, 7, ["'", "a", " ", "don't", "“", "”", '"', "「", "」", "\n", "x'", "'y"], 14):
        assert [m.span() for m in language._QUOTED.finditer(text)] == [m.span() for m in behind_first.finditer(text)]


def test_the_digit_group_separator_is_the_one_a_lookbehind_first_finds() -> None:
    behind_first = re.compile(r"(?<=\d)[.,'\u00a0\u2009\u202f](?=\d{3}(?!\d))")
    for text in _texts(4000, 5, ["1", "٣", "0", ".", ",", "'", "\u00a0", " ", "a", "\u2009"], 14):
        assert _DIGIT_GROUP.sub("", text) == behind_first.sub("", text), text


def test_english_is_counted_the_same_on_ascii_text() -> None:
    words = re.compile(r"[A-Za-z']+")
    for text in _texts(2000, 6, ["the", "order", "is", "'", "don't", " ", ".", "Thé", "le", "a1", "IT"], 20):
        found = [w.lower() for w in words.findall(text)]
        expected = bool(found) and sum(w in language._ENGLISH for w in found) / len(found) >= 0.2
        assert language._looks_english(text) == expected, text


def _loop_length_by_size(toks: list[str]) -> int:
    """loop_length trying every unit size in turn, as it did before list.index found the candidates."""
    toks = toks[-repetition.LOOP_TAIL:]
    n, best = len(toks), 0
    if n < repetition.LOOP_MIN_TOKENS:
        return 0
    for p in range(1, min(repetition.LOOP_MAX_UNIT, n // repetition.LOOP_MIN_REPEATS) + 1):
        if toks[n - 1 - p] == toks[-1]:
            i = n - 1
            while i - p >= 0 and toks[i] == toks[i - p]:
                i -= 1
            if (covered := n - 1 - i + p) >= max(repetition.LOOP_MIN_TOKENS, repetition.LOOP_MIN_REPEATS * p):
                best = max(best, covered)
    return best


def test_loop_length_tries_the_unit_sizes_every_size_would_have() -> None:
    rng = random.Random(8)
    for _ in range(2000):
        unit = [f"w{rng.randint(0, 3)}" for _ in range(rng.randint(1, 9))]
        toks = [f"w{rng.randint(0, 3)}" for _ in range(rng.randint(0, 40))] + unit * rng.randint(0, 12)
        assert repetition.loop_length(toks) == _loop_length_by_size(toks), toks


def test_flags_read_one_at_a_time_are_the_flags_of_every_metric() -> None:
    """answer_flags computes a metric's flag when it is first read: read in any order, or all at once, they are
    each metric's flag, and a metric that does not apply is no key."""
    request = {"messages": [{"role": "user", "content": "Where is my order A12345? It should be here by now."}]}
    for text in ["Your order A12345 left the warehouse on Monday and should arrive by Friday.",
                 "I'm sorry, but I can't help with that.", "Your order will arrive on", '{"intent": "shipping"}']:
        answer = Answer(request, text, finish_reason="stop")
        eager = {m.name: v for m in ANSWER_METRICS if (v := m.flag(answer)) is not None}
        one_by_one = answer_flags(answer)
        assert one_by_one.get("unfinished") is eager.get("unfinished")
        assert ("leak" in one_by_one, one_by_one.get("leak"), one_by_one.get("leak", "n/a")) == (False, None, "n/a")
        with pytest.raises(KeyError):
            one_by_one["leak"]
        assert dict(one_by_one) == eager == answer_flags(answer) and len(one_by_one) == len(eager)
