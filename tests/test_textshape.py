"""The text-shape check (qlift/quality/textshape.py, mojibake.py): disguises of each failure family,
generated from the healthy corpus with a seeded generator, must all be flagged; the healthy corpus
(tests/data/healthy_answers.jsonl: nine languages, markdown, tables, code, JSON, emoji) must not be."""

from __future__ import annotations

import html
import json
import random
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from qlift.quality.registry import BY_NAME, Answer, examples
from qlift.quality.text import tokens
from qlift.quality.textshape import text_shape, without_trailing_markers
from qlift.quality.unfinished import unfinished
from qlift.rollout.spec import AnalysisSpec
from qlift.rollout.view import example_lines

HEALTHY = [json.loads(line) for line in
           (Path(__file__).parent / "data" / "healthy_answers.jsonl").read_text(encoding="utf-8").splitlines()]
BY_KIND = {(a["lang"], a["kind"]): a["answer"] for a in HEALTHY}
PROSE = [BY_KIND[k] for k in (("en", "long"), ("en", "emoji"), ("fr", "prose"), ("de", "prose-quotes"),
                              ("es", "prose"), ("zh", "long"), ("zh", "prose"), ("ru", "prose"), ("ja", "prose"),
                              ("ko", "prose"), ("ar", "prose"))]
_SENTENCE = re.compile(r"(?<=[.!?。！？])")


def sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE.split(text) if s]


def misread(text: str, codec: str, errors: str = "replace") -> str:
    return text.encode("utf-8").decode(codec, errors)


def some_sentences(rng: random.Random, text: str, change: Callable[[str], str], share: float = 0.2) -> str:
    """``change`` applied to a fifth of the sentences that it changes (at least one)."""
    parts = sentences(text)
    changed = [i for i, s in enumerate(parts) if change(s) != s]
    picked = set(rng.sample(changed, max(1, round(share * len(changed)))))
    return "".join(change(s) if i in picked else s for i, s in enumerate(parts))


def mojibake_disguises(rng: random.Random) -> Iterator[tuple[str, str]]:
    for text in PROSE:
        if text.isascii():
            continue
        yield "cp1252, whole answer", misread(text, "cp1252")
        yield "latin-1, whole answer", misread(text, "latin-1")
        yield "cp1252, a fifth of sentences", some_sentences(rng, text, lambda s: misread(s, "cp1252"))
        yield "latin-1, a fifth of sentences", some_sentences(rng, text, lambda s: misread(s, "latin-1"))
        yield "cp1252 twice", misread(misread(text, "cp1252"), "cp1252")
        yield "cp1252, undefined bytes dropped", misread(text, "cp1252", "ignore")
        yield "cp1250", misread(text, "cp1250")
        if re.search("[À-ÿ]", text):
            yield "mac_roman", misread(text, "mac_roman")
    for text in PROSE:
        if re.search("[\u4e00-\u9fff\u3040-\u30ff]", text):
            for codec in ("gbk", "gb18030", "shift_jis", "big5", "euc_kr"):
                yield f"{codec}, errors replaced", misread(text, codec)
                yield f"{codec}, errors dropped", misread(text, codec, "ignore")
        if re.search("[а-я]", text):
            for codec in ("cp1251", "koi8_r", "iso8859_5", "cp866"):
                yield codec, misread(text, codec)


def bad_character_disguises(rng: random.Random) -> Iterator[tuple[str, str]]:
    for text in PROSE:
        yield "non-ASCII read as ASCII", misread(text, "ascii") if not text.isascii() else text + "\ufffd\ufffd"
        odd = {"C0 controls": "\x00\x07\x1b\x08", "C1 controls": "\x85\x90\x9c",
               "private use": "\ue000\uf8ff\U000f0001", "unassigned": "\u0378\u05ff\uffff\U000e0fff",
               "lone surrogates": "\ud83d\udc00"}
        for name, chars in odd.items():
            words = text.split(" ")
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(words))
                words[i] += rng.choice(chars)
            yield name, " ".join(words)
        few = sum(not ch.isascii() for ch in text) < 3  # then ASCII letters are escaped too
        yield "non-ASCII printed as \\u escapes", text.encode("ascii", "backslashreplace").decode() \
            .replace("e", "\\u0065" if few else "e", 3)
        yield "UTF-8 bytes printed as \\x escapes", str(text.encode())[2:-1].replace("a", "\\x61" if few else "a", 3)
        cuts = [0, *sorted(rng.sample(range(1, len(text)), 3)), len(text)]
        yield "HTML-escaped twice", html.escape(html.escape(text)) if sum(map(text.count, "\"'&<>")) >= 3 \
            else "&amp;nbsp;".join(text[a:b] for a, b in zip(cuts, cuts[1:], strict=False))
        letters = [i for i, ch in enumerate(text) if ch.isalpha()]
        marks = {i: "".join(rng.choice(_COMBINING) for _ in range(rng.randint(3, 6))) for i in rng.sample(letters, 5)}
        yield "stacked diacritics (zalgo)", "".join(ch + marks.get(i, "") for i, ch in enumerate(text))


_COMBINING = "\u0300\u0301\u0302\u0303\u0308\u030a\u0315\u031b\u0327\u0328\u0334\u0335\u0336\u0337\u0338\u0361"


_EMOJI = "🙂😊🎉👍✨🔥💯🙏❤️✅"


def padding_disguises(rng: random.Random) -> Iterator[tuple[str, str]]:
    fillers: dict[str, Callable[[int], str]] = {
        "blank lines": lambda n: "\n" * n,
        "lines of spaces": lambda n: " \n" * (n // 2),
        "dots": lambda n: "." * n,
        "spaced dots": lambda n: ". " * (n // 2),
        "dot lines": lambda n: "...\n" * (n // 4),
        "ellipsis characters": lambda n: "…" * n,
        "dashes": lambda n: "— " * (n // 2),
        "emoji": lambda n: "".join(rng.choice(_EMOJI) for _ in range(n // 2)),
        "emoji lines": lambda n: "".join(rng.choice(_EMOJI) + "\n" for _ in range(n // 3)),
        "zero-width spaces": lambda n: "\u200b" * n,
        "non-breaking spaces": lambda n: "\u00a0" * n,
        "ideographic spaces": lambda n: "\u3000" * n,
        "spaces": lambda n: " " * n,
        "middle dots": lambda n: "·" * n,
        "a wall of equals signs": lambda n: "=" * n,
        "tabs": lambda n: "\t" * (n // 4),
        "braille blanks": lambda n: "\u2800" * n,
        "hangul fillers": lambda n: "\u3164" * n,
    }
    for text in PROSE:
        first = sentences(text)[0]
        for name, fill in fillers.items():
            n = max(40, len(text) - len(first))
            yield f"one sentence, then {name}", first + fill(n)
            if rng.random() < 0.3:
                yield f"{name}, then one sentence", fill(n) + first
    for text in PROSE:
        words = text.split(" ")
        yield "zero-width spaces between words", "\u200b ".join(words) if len(words) > 4 else "\u200b".join(text)


def repetition_disguises(rng: random.Random) -> Iterator[tuple[str, str]]:
    for text in (BY_KIND["en", "long"], BY_KIND["zh", "long"], BY_KIND["en", "markdown-list"]):
        paragraphs = text.split("\n\n")
        real = [i for i, p in enumerate(paragraphs) if len(tokens(p)) >= 20]  # not a heading
        for _ in range(3):
            i = rng.choice(real)
            j = rng.randrange(i + 1, len(paragraphs) + 1)
            repeated = paragraphs[:j] + [paragraphs[i]] + paragraphs[j:]
            yield f"paragraph {i} repeated after paragraph {j - 1}", "\n\n".join(repeated)
        i = rng.choice(real)
        yield f"paragraph {i} three times", "\n\n".join(paragraphs[:i + 1] + [paragraphs[i]] * 2 + paragraphs[i + 1:])
    for text in PROSE:
        parts = sentences(text)
        long_ones = [i for i, s in enumerate(parts) if len(tokens(s)) >= 12]
        for _ in range(2):
            i = rng.choice(long_ones)
            j = rng.randrange(i + 1, len(parts) + 1)
            yield f"sentence {i} repeated at {j}", "".join(parts[:j] + [" " + parts[i].strip()] + parts[j:])
        i = rng.choice(long_ones)
        yield f"sentences {i}-{i + 1} repeated at once", "".join(parts[:i + 2] + parts[i:i + 2] + parts[i + 2:])
        if " " in text:
            words = text.split(" ")
            changed = [w if k % 15 else rng.choice(words) for k, w in enumerate(words)]
        else:  # CJK: a character in 15 changed
            changed = [c if k % 15 else rng.choice(text) for k, c in enumerate(text)]
        again = (" " if " " in text else "").join(changed)
        yield "the answer said again with a word in 15 changed", f"{text}\n\n{again}"


_MARKERS = {
    "ChatML": ["<|im_end|>", "<|im_start|>assistant\n", "<|im_end|>\n<|im_start|>user\n", "<|endoftext|>"],
    "Llama 3": ["<|eot_id|>", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|begin_of_text|>"],
    "Mistral": ["[INST] ", " [/INST]", "[/INST]", "</s>[INST] "],
    "Llama 2": ["<<SYS>>\n", "\n<</SYS>>\n\n", "</s><s>"],
    "Gemma": ["<end_of_turn>\n", "<start_of_turn>model\n", "<start_of_turn>user\n"],
    "DeepSeek": ["<｜end▁of▁sentence｜>", "<｜Assistant｜>", "<｜User｜>", "<｜begin▁of▁sentence｜>"],
    "Phi": ["<|end|>", "<|assistant|>", "<|user|>\n"],
    "harmony": ["<|channel|>analysis<|message|>", "<|start|>assistant<|channel|>final<|message|>"],
    "Command R": ["<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"],
    "byte fallback": ["<0x0A>", "<0x0A><0x0A>"],
    "reasoning": ["<think>\nThe user wants a short answer.\n</think>\n\n", "<think>Let me check.</think>",
                  "</think>\n\n", "<reasoning>first the facts</reasoning>"],
    "stripped tokens": ["\nuser\nThanks! And in Spanish?\nassistant\n", "\nassistant\n"],
    "transcript headers": ["\n\nUSER: Thanks!\nASSISTANT: ", "\n### Response:\n", "\n\n### Human: ok\n",
                           "\n\nHuman: Thanks!\n\nAssistant: You are welcome.\n"],
    "more reasoning": ["◁think▷The user asks.◁/think▷", "[THINK]Short answer.[/THINK]", "<seed:think>ok</seed:think>",
                       "<|begin_of_thought|>", "<thinking>", "</reasoning>"],
    "end of sequence": ["</s>", "</s>\n\n", "<eos>", "<|end_of_text|>", "<end_of_turn>"],
}


def template_disguises(rng: random.Random) -> Iterator[tuple[str, str]]:
    for family, markers in _MARKERS.items():
        for marker in markers:
            text = rng.choice(PROSE)
            parts = sentences(text)
            i = rng.randrange(1, len(parts))
            yield f"{family} {marker!r} at the start", marker + text
            yield f"{family} {marker!r} in the middle", "".join(parts[:i]) + marker + "".join(parts[i:])
            yield f"{family} {marker!r} at the end", text + marker
    yield "Llama 2 <s> at the start", "<s> " + PROSE[0]
    yield "Llama 2 </s> at the end", PROSE[2] + "</s>"


# each family's disguises and the evidence that names them
FAMILIES: dict[str, tuple[Callable[[random.Random], Iterator[tuple[str, str]]], tuple[str, ...]]] = {
    "mojibake": (mojibake_disguises, ("mojibake",)),
    "bad characters": (bad_character_disguises, ("replacement characters", "control characters",
                                                 "private-use characters", "unassigned", "lone surrogates",
                                                 "escaped characters", "letters with stacked diacritics")),
    "padding": (padding_disguises, ("padding:",)),
    "repetition": (repetition_disguises, ("repeated:",)),
    "template": (template_disguises, ("template marker:", "reasoning block:")),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_disguise_of_each_family_is_flagged_and_named(family: str) -> None:
    generate, names = FAMILIES[family]
    disguises = list(generate(random.Random(f"textshape-{family}")))
    assert len({name.split(",")[0] for name, _ in disguises}) >= 5  # at least five kinds of disguise a family
    missed = [(name, text[:80], evidence) for name, text in disguises
              if not (evidence := text_shape(text)) or not evidence.startswith(names)]
    assert not missed, missed


def test_the_healthy_corpus_covers_what_a_false_alarm_would_hit() -> None:
    assert len(HEALTHY) >= 30 and {"en", "zh", "ja", "ko", "ru", "ar", "fr", "es", "de"} <= {a["lang"] for a in HEALTHY}
    answers = [a["answer"] for a in HEALTHY]
    assert any("```" in a and "<|im_start|>" in a for a in answers)  # template tokens inside a fence
    assert any(a.count("| ✓ | ✓ | ✓ |") >= 2 for a in answers) and any(a.startswith("[") for a in answers)
    assert any("🎉" in a for a in answers) and any("「" in a and "（" in a for a in answers)
    assert any(len(tokens(a)) > 400 for a in answers) and any(len(tokens(a)) < 8 for a in answers)


@pytest.mark.parametrize("answer", HEALTHY, ids=lambda a: f"{a['lang']}-{a['kind']}")
def test_healthy_answers_are_not_flagged(answer: dict[str, str]) -> None:
    assert text_shape(answer["answer"]) is None


def test_the_evidence_names_what_a_person_sees() -> None:
    assert text_shape("Le café était très bon.".encode().decode("cp1252")) == \
        "mojibake (cp1252): 'Ã©' x2 (was 'é'), 3 in all"
    assert text_shape("Your order shipped.<|im_end|>\n<|im_start|>assistant\nAnything else?") == \
        "template marker: '<|im_end|>' x2"
    assert text_shape("<think>The user wants the date.</think>\nIt is Monday.") == "reasoning block: '<think>'"
    assert text_shape("Your order shipped on Monday." + "\n" * 12) == "padding: 11 blank lines in a row"
    assert text_shape("Your order shipped on Monday.\n\n\n") is None
    assert text_shape("Your order shipped on Monday.\n" + "\n" * 12 + "Thanks!") == "padding: 12 blank lines in a row"
    assert text_shape("Your order shipped.\x00\x00\x1b") == "control characters: 3"
    paragraph = ("The refund was issued on Monday and goes back to the card you paid with, which usually takes "
                 "three to five business days depending on your bank.")
    repeated = f"Thanks for waiting.\n\n{paragraph}\n\nYou will get an email.\n\n{paragraph}\n\nAnything else?"
    assert text_shape(repeated) == f"repeated: a {len(tokens(paragraph))}-word passage appears 2x"


def test_a_template_token_explained_in_code_or_backticks_is_not_debris() -> None:
    assert text_shape("ChatML ends each turn with `<|im_end|>`; R1 thinks inside `<think>`.") is None
    assert text_shape("```\n<|im_start|>user\nHi<|im_end|>\n```\nThat is the template.") is None
    assert text_shape("ChatML ends each turn with <|im_end|>.") == "template marker: '<|im_end|>'"


def test_an_answer_that_ends_in_template_debris_is_not_called_cut() -> None:
    done = "The refund was issued on Monday and reaches your card within five business days."
    for debris in ("<|im_end|>\n<|im_start|>assistant\n", "<｜end▁of▁sentence｜>", "</s>", "[/INST]", "<|eot_id|>",
                   "<end_of_turn>\n<start_of_turn>user\n", "\n<think>The user may also ask", "\nuser\n"):
        assert without_trailing_markers(done + debris).rstrip() == done
        assert unfinished(done + debris, "stop") is False, debris
        assert text_shape(done + debris) is not None, debris  # named by text_shape instead
    cut = "The refund was issued on Monday and goes back to the card you paid with and you will get"
    assert unfinished(cut + "<|im_end|>", "stop") is True  # cut mid-sentence, then the token
    assert without_trailing_markers("The best model") == "The best model"  # a role's name ending prose


def test_the_registry_entry_flags_non_empty_answers_and_its_examples_carry_the_evidence() -> None:
    metric = BY_NAME["text_shape"]
    assert metric.offline and AnalysisSpec.model_fields[metric.limit].default == 2.0
    req = {"messages": [{"role": "user", "content": "When will my refund arrive?"}]}
    bad = Answer(req, "Your refund arrives on Monday.<|im_end|>\n<|im_start|>user\nThanks", other="On Monday.")
    good = Answer(req, "Your refund arrives on Monday.")
    assert [metric.flag(a) for a in (bad, good, Answer(req, "  "))] == [True, False, None]
    got = examples([bad, good], "text_shape")
    assert len(got) == 1 and got[0]["other"] == "On Monday." and str(got[0]["answer"]).startswith("Your refund")
    assert got[0]["evidence"] == "template marker: '<|im_end|>' x2"
    assert "evidence" not in examples([Answer(req, "I will check. " * 10)], "loops")[0]


def test_promote_status_shows_the_evidence_under_the_answer() -> None:
    example = {"prompt": "When will my refund arrive?", "answer": "Your refund arrives on Monday. <|im_end|>",
               "other": None, "evidence": "template marker: '<|im_end|>'"}
    window = {"started_at": "2024-05-01T10:00:00", "checks": [{"name": "text_shape", "status": "fail",
                                                                 "examples": [example]}]}
    st = SimpleNamespace(shadow=None, steps=[SimpleNamespace(windows=[window])], bake=None)
    lines = example_lines(st, 100)  # type: ignore[arg-type]
    assert lines[0].startswith("text_shape examples") and "    why: template marker: '<|im_end|>'" in lines


def test_flagging_costs_well_under_a_millisecond_an_answer() -> None:
    answers = [a["answer"] for a in HEALTHY] * 4
    start = time.process_time()
    assert not any(map(text_shape, answers))
    assert (time.process_time() - start) / len(answers) < 0.002  # ~0.25 ms measured: benchmarks/textshape_cost.py
