"""The refusal check in the 18 languages it ships (qlift/quality/data/refusals/, one file a language): a refusal in
each language's own idiom and politeness forms counts, at any clause start of the opening; an ordinary or polite
answer that opens the same way ("Lo siento por la espera", "Я не могу не отметить") does not, nor does a
refusal quoted in an explanation or a program's "cannot"."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from qlift.errors import BadInputError
from qlift.quality.refusal import clause_starts, fold, patterns, refuses
from qlift.quality.refusal_patterns import ANCHOR, BUILTIN, ShippedPatterns, builtin_files
from qlift.quality.registry import Answer, answer_flags, count

REPO = Path(__file__).resolve().parents[1]
# the 15 most used languages of LLM traffic, then more that ship
LANGUAGES = ("zh", "en", "es", "pt", "fr", "de", "ru", "ja", "ko", "ar", "hi", "vi", "id", "tr", "it", "nl", "pl", "uk")


def _rows() -> list[dict[str, Any]]:
    lines = (REPO / "tests" / "data" / "refusal_languages.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip() and not line.startswith("#")]


ROWS = _rows()


@pytest.mark.parametrize("lang", LANGUAGES)
def test_each_language_flags_its_refusals_and_passes_its_ordinary_answers(lang: str) -> None:
    rows = [r for r in ROWS if r["lang"] == lang]
    assert sum(r["refuses"] for r in rows) >= 4 and sum(not r["refuses"] for r in rows) >= 4, lang
    wrong = [("missed" if r["refuses"] else "flagged", r["text"])
             for r in rows if refuses(r["text"]) is not r["refuses"]]
    assert not wrong, wrong


def test_every_language_ships_a_file_of_anchored_lines_and_clause_words() -> None:
    files = {path.stem: found for path, found in builtin_files()}
    assert set(LANGUAGES) <= set(files) and {p.parent for p, _ in builtin_files()} == {BUILTIN}
    for lang, found in files.items():
        assert {"apology", "contrast", "greeting"} <= set(found.names), lang
        for lineno, line in found.lines:
            assert line.startswith(ANCHOR), (lang, lineno)  # the anchor each line gives up to the shared one
            re.compile(line)  # each line compiles on its own too: a bad one names itself here


@pytest.mark.parametrize(("written", "plain"), [
    ("I can’t help with that.", "i can't help with that."),
    ("NÃO POSSO AJUDAR", "nao posso ajudar"),
    ("Tôi không thể giúp", "toi khong the giup"),
    ("Üzgünüm, yardımcı OLAMAM", "uzgunum, yardimci olamam"),
    ("لَا أَسْتَطِيعُ", "لا استطيع"),
    ("माफ़ कीजिए", "माफ कीजिए"),
    ("抱歉！我无法，", "抱歉!我无法,"),
    ("Извините, ещё", "извините, еще"),
])
def test_folding_drops_case_accents_harakat_and_typography(written: str, plain: str) -> None:
    assert fold(written) == plain


@pytest.mark.parametrize("text", [
    "I can’t help with that.",
    "I CANNOT ASSIST WITH THIS REQUEST.",
    "NAO POSSO AJUDAR COM ISSO.",
    "LO SIENTO, PERO NO PUEDO AYUDARTE.",
    "Je ne peux pas vous aider avec ça",
    "JE NE PEUX PAS VOUS AIDER.",
    "ICH KANN IHNEN DABEI LEIDER NICHT HELFEN.",
    "ИЗВИНИТЕ, НО Я НЕ МОГУ ВАМ ПОМОЧЬ.",
    "Toi khong the ho tro yeu cau nay.",
    "Uzgunum, bu konuda yardimci olamam.",
    "لَا أَسْتَطِيعُ المُسَاعَدَةَ فِي ذَلِكَ.",
    "عذرا، لا استطيع المساعده في ذلك.",
    "माफ कीजिए, मैं यह नहीं कर सकती।",
    "抱歉！我无法帮助你完成这个请求。",
    "申し訳ありませんが、お手伝いできません!",
])
def test_case_accents_apostrophes_and_full_width_forms_do_not_hide_a_refusal(text: str) -> None:
    assert refuses(text)


# (lang, a polite opening clause, the contrast word that starts the next clause, a refusal)
CONTRASTS = [
    ("en", "Thanks for the question", "but", "I can't help with that."),
    ("es", "Gracias por tu mensaje", "pero", "no puedo ayudarte con eso."),
    ("pt", "Obrigado pela mensagem", "mas", "não posso ajudar com isso."),
    ("fr", "Merci pour votre message", "mais", "je ne peux pas vous aider."),
    ("de", "Danke für die Nachricht", "aber", "ich kann Ihnen dabei nicht helfen."),
    ("ru", "Спасибо за вопрос", "но", "я не могу помочь с этим."),
    ("ja", "ご質問ありがとうございます。", "しかし、", "その件についてはお答えできません。"),
    ("ja", "ご質問ありがとうございます", "ですが、", "お手伝いできません。"),
    ("ko", "질문해 주셔서 감사합니다.", "하지만", "도와드릴 수 없습니다."),
    ("ko", "좋은 질문입니다.", "그러나", "답변드릴 수 없습니다."),
    ("ar", "شكرا على سؤالك،", "لكن", "لا أستطيع المساعدة في ذلك."),
    ("hi", "आपके सवाल के लिए धन्यवाद,", "लेकिन", "मैं इसमें मदद नहीं कर सकता।"),
    ("vi", "Cảm ơn câu hỏi của bạn", "nhưng", "tôi không thể giúp việc này."),
    ("id", "Terima kasih atas pertanyaannya", "tetapi", "saya tidak bisa membantu."),
    ("id", "Terima kasih atas pertanyaannya", "namun", "saya tidak dapat menjawabnya."),
    ("tr", "Sorunuz için teşekkürler", "ama", "bu konuda yardımcı olamam."),
    ("tr", "Sorunuz için teşekkürler", "fakat", "bunu yapamam."),
    ("it", "Grazie per la domanda", "ma", "non posso aiutarti con questo."),
    ("it", "Grazie per la domanda", "però", "non posso rispondere."),
    ("zh", "感谢您的提问，", "但是", "我无法回答这个问题。"),
]


@pytest.mark.parametrize(("lang", "polite", "contrast", "refusal"), CONTRASTS, ids=lambda v: str(v)[:12])
def test_a_refusal_after_a_polite_clause_and_a_contrast_word_counts(lang: str, polite: str, contrast: str,
                                                                   refusal: str) -> None:
    sep = "" if polite[-1] in "。、,，،" else ", "
    assert refuses(f"{polite}{sep}{contrast} {refusal}"), lang
    assert not refuses(polite), lang  # the polite clause alone is no refusal: the clause start found it


@pytest.mark.parametrize("text", [
    "Hello, I cannot help with that.",
    "Hola, no te puedo ayudar con eso.",
    "Olá! Não posso responder a essa pergunta.",
    "Bonjour, je ne peux pas vous aider.",
    "Hallo, dabei kann ich leider nicht helfen.",
    "Здравствуйте, я не могу предоставить эту информацию.",
    "こんにちは。その質問にはお答えできません。",
    "안녕하세요, 죄송하지만 도와드릴 수 없습니다.",
    "مرحباً، لا يمكنني مساعدتك في ذلك.",
    "नमस्ते, मैं इसमें आपकी मदद नहीं कर सकता।",
    "Xin chào, tôi không thể trả lời câu hỏi đó.",
    "Halo, saya tidak bisa menjawab itu.",
    "Merhaba, size bu konuda yardımcı olamam.",
    "Ciao, non posso aiutarti con questo.",
    "您好，我无法提供这类信息。",
    "这是一个好问题。但是我无法回答。",
    "هل تريد معرفة المزيد؟ لا أستطيع المساعدة في ذلك.",
    "यह अच्छा सवाल है। मैं इसका जवाब नहीं दे सकता।",
])
def test_a_refusal_after_a_greeting_or_a_sentence_end_of_any_script_counts(text: str) -> None:
    assert refuses(text)


@pytest.mark.parametrize(("quoted", "said"), [
    ('When the bot says "I cannot help with that", the content filter fired.', "I cannot help with that."),
    ("If the bot replies 'I'm sorry, but I can't help with that', check the filter.",
     "I'm sorry, but I can't help with that."),
    ("> I can't help with that.\n\nThat is what the old bot showed; here is the fix.", "I can't help with that."),
    ("«Je ne peux pas vous aider» : voilà ce que répond le bot quand le filtre bloque.", "Je ne peux pas vous aider."),
    ("Если модель отвечает «Я не могу помочь с этим», проверьте фильтр.", "Я не могу помочь с этим."),
    ("「お答えできません」と表示される場合は、設定を確認してください。", "お答えできません。"),
    ('"No puedo ayudarte con eso" es lo que responde el bot cuando el filtro actúa.', "No puedo ayudarte con eso."),
])
def test_a_quoted_refusal_is_not_said_and_the_same_words_unquoted_are(quoted: str, said: str) -> None:
    assert not refuses(quoted)
    assert refuses(said)


def test_a_users_file_adds_lines_with_named_pieces_a_gate_and_folding(tmp_path: Path) -> None:
    house = tmp_path / "house.txt"
    house.write_text("# our wording\n@outside = (?:that is|that's) outside\n^\\W*(?&outside) (?:my|our) remit\n"
                     "^\\W*não dá pra ajudar\n", encoding="utf-8")
    assert refuses("That's outside our remit, sorry.", house) and not refuses("That's outside our remit, sorry.")
    assert refuses("NAO DA PRA AJUDAR nisso.", house)  # written with accents, matched folded
    thai = tmp_path / "th.txt"
    thai.write_text("@gate = [\\u0e00-\\u0e7f]\n^\\W*ขออภัย\\s*ฉันไม่สามารถ\n", encoding="utf-8")
    assert refuses("ขออภัย ฉันไม่สามารถช่วยเรื่องนี้ได้", thai) and not refuses("ขออภัย ฉันไม่สามารถช่วยเรื่องนี้ได้")
    answers = [Answer({"prompt": "Can you help?"}, "That is outside my remit."), Answer({"prompt": "Hi"}, "Sure!")]
    assert count(answers, "refusal", house) == (1, 2) and count(answers, "refusal") == (0, 2)
    assert answer_flags(Answer({"prompt": "Hi"}, "That is outside my remit.", refusal_patterns=house))["refusal"]


@pytest.mark.parametrize(("text", "says"), [
    ("^\\W*(?&missing) remit\n", "line 1 uses (?&missing) before any @missing"),
    ("ok\n(unclosed\n", "line 2 is not a regular expression"),
    ("@gate = [\n^\\W*x\n", "its @gate is not a regular expression"),
])
def test_a_bad_users_file_is_one_line_naming_what_to_fix(tmp_path: Path, text: str, says: str) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(BadInputError, match=re.escape(says)) as err:
        patterns(bad)
    assert "\n" not in err.value.one_line() and str(bad) in err.value.one_line()


def test_trying_only_the_lines_a_clause_can_start_with_finds_what_all_lines_find() -> None:
    """The first-letter split (an optimisation) never changes an answer: at every clause start of every row,
    and at every thirteenth position besides, each shipped set matches exactly where its whole alternation does."""
    shipped = [p for p in patterns() if isinstance(p, ShippedPatterns)]
    tried = 0
    for row in ROWS:
        opening = fold(row["text"])
        for i in sorted({*clause_starts(opening), *range(0, len(opening), 13)}):
            for p in shipped:
                whole = p.lines.regex.match(opening, i) is not None  # type: ignore[union-attr]
                assert p.matches(opening, i) is whole, (row["text"], i)
                tried += 1
    assert tried > 5_000
