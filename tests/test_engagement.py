"""The engagement check (qlift.quality.engagement): answers that take up nothing the request asked."""

from __future__ import annotations

from collections import Counter

import pytest
from engagement_sets import DEFLECTIONS, Case, deflection_cases, healthy_cases

from qlift.quality.engagement import content, disengaged, uptake
from qlift.quality.registry import Answer, answer_flags, examples
from qlift.rollout.checks import BY_NAME as CHECKS
from qlift.rollout.judge import window_of
from qlift.rollout.shadow import Answer as ShadowAnswer
from qlift.rollout.shadow import Pair, ShadowEvidence
from qlift.rollout.spec import AnalysisSpec, ShadowSpec

DEFLECTION = "Thanks for asking! That is a topic I would rather leave aside here, so let us talk about something else."
IBUPROFEN = "What are the common side effects of ibuprofen?"
IBUPROFEN_ANSWER = ("Common side effects of ibuprofen include stomach upset, heartburn and nausea. Taking it with food "
                    "helps; stop and see a doctor if you notice black stools.")
TERSE = "Mostly digestive ones: upset stomach, heartburn, nausea, sometimes dizziness, with food it is milder."


def _rates(cases: list[Case], with_other: bool) -> tuple[float, float]:
    """(share flagged of all answers, share flagged of those judged)."""
    got = Counter(disengaged(c.prompt, c.text, c.other if with_other else None) for c in cases)
    return got[True] / len(cases), got[True] / max(1, got[True] + got[False])


def test_deflections_are_flagged_and_healthy_answers_rarely_in_five_languages() -> None:
    healthy, deflected = healthy_cases(), deflection_cases(seed=1)
    assert len({c.lang for c in healthy}) == 15 and len(deflected) > 8 * 5 * 5
    for with_other in (False, True):
        assert _rates(deflected, with_other)[1] >= 0.9, with_other
        assert _rates(deflected, with_other)[0] >= 0.8, with_other  # requests of two long words are judged too
    assert _rates(healthy, with_other=False)[0] < 0.1  # terse list answers that name nothing of the prompt
    assert _rates(healthy, with_other=True)[0] <= 0.05  # the other version's answer sets the standard
    for lang in DEFLECTIONS:
        ours = [c for c in deflected if c.lang == lang and c.kind == "template"]
        assert _rates(ours, with_other=False)[1] >= 0.85, lang
    another = [c for c in deflected if c.kind == "another_request"]
    assert _rates(another, with_other=False)[1] >= 0.85


def test_a_short_factual_answer_is_not_flagged_alone_or_beside_a_longer_one() -> None:
    prompt = "What is the capital city of France, the country?"
    assert disengaged(prompt, "Paris.") is False
    assert disengaged(prompt, "Paris.", other="The capital of France is Paris, on the Seine.") is False
    assert disengaged(prompt, DEFLECTION) is True
    assert disengaged(prompt, DEFLECTION, other="The capital of France is Paris, on the Seine.") is True


def test_the_other_answer_is_the_standard_where_it_is_known() -> None:
    assert disengaged(IBUPROFEN, TERSE) is True  # alone, a list that names nothing of the prompt looks away
    assert disengaged(IBUPROFEN, TERSE, other=IBUPROFEN_ANSWER) is False  # it says what the other says
    assert disengaged(IBUPROFEN, IBUPROFEN_ANSWER, other=DEFLECTION) is False
    other_request = "Canberra is the capital of Australia; it was chosen as a compromise between Sydney and Melbourne."
    assert disengaged(IBUPROFEN, other_request, other=IBUPROFEN_ANSWER) is True
    # neither takes the request up: this answer is judged as if alone
    assert disengaged(IBUPROFEN, DEFLECTION, other="Let me know if you have any other questions!") is True


def test_chinese_is_measured_on_character_pairs() -> None:
    prompt = "请解释一下量子计算的基本原理。"
    assert {"量子", "计算", "原理"} <= set(content(prompt).items)
    assert not {"解释", "一下", "的"} & set(content(prompt).items)  # asking words and function characters
    real = "量子计算利用量子比特的叠加和纠缠来运算，在因数分解等问题上可能比经典计算机快得多。"
    assert uptake(prompt, real) > 0.3
    assert disengaged(prompt, real) is False
    assert disengaged(prompt, "这个话题我就先不展开了，我们聊点别的吧，祝您生活愉快！") is True


def test_japanese_particles_and_okurigana_are_grammar_katakana_and_hiragana_words_content() -> None:
    items = set(content("東京でおすすめのラーメン店を教えてください。").items)
    assert {"東京", "ラーメン", "店", "おすすめ"} <= items
    items = set(content("来月大阪に行きます。食べ物は何がいいですか？").items)
    assert {"大阪", "行", "食"} <= items
    assert not any("\u3040" <= ch <= "\u309f" for item in items for ch in item)  # に, きます, べ, は, がいいですか
    # Chinese function characters cut Chinese runs, not Japanese words
    assert {"京都", "会議"} <= set(content("京都の会議に行きます。").items)
    assert "开会" not in content("我们都去北京开会。").items


def test_a_japanese_answer_that_names_only_instances_takes_up_the_request_in_kana() -> None:
    prompt = "来月大阪に行きます。おすすめの食べ物は？"
    dishes = "定番はたこ焼きとお好み焼き、串カツです。道頓堀の屋台めぐりもおすすめです（夜は混むので早めの時間に）"
    assert disengaged(prompt, dishes) is False
    deflection = "ご質問ありがとうございます。その話題はここでは控えさせていただきますので、別のお話をしましょう。"
    assert disengaged(prompt, deflection) is True


def test_a_chinese_one_character_word_takes_up_half_a_pair_once() -> None:
    prompt = "我数学考试又没及格，好郁闷"
    comfort = "(っ´ω`)っ 一次没考好说明不了什么。先放松一下，把错题整理出来，再针对薄弱的地方多练习，下次一定能考好的！"
    assert uptake(prompt, comfort) >= 0.1  # 考 for 考试; the kaomoji's っ does not make it Japanese
    assert uptake(prompt, comfort) == uptake(prompt, comfort.split(" ", 1)[1])
    assert disengaged(prompt, comfort) is False
    # 祝 in the closer stands for one of 句祝, 祝贺: not enough to take up the request
    assert disengaged("帮我写一句祝贺朋友升职的话。", "这个话题我就先不展开了，我们聊点别的吧。祝您生活愉快！") is True
    assert uptake("如何提高睡眠质量？", "睡前一小时别看手机，失眠的时候起来走走再回床上。") > 0  # 睡眠: 睡 and 眠 apart


def test_arabic_words_lose_their_article_proclitics_and_affixes() -> None:
    def units(text: str) -> set[str]:
        return set(content(text).items)

    assert units("أحتاج") == units("تحتاجه") and units("الصحراء") == units("صحراء")
    prompt = "ماذا أحتاج لرحلة تخييم في الصحراء؟"
    assert uptake(prompt, "فالرحلة في الصحراء طويلة") > 0.5  # لرحلة and فالرحلة, الصحراء
    kit = "أهم ما تحتاجه:\n\n- خيمة متينة وأوتاد\n- ماء كثير\n- مصباح وبطاريات\n- ملابس دافئة لليل\n- حقيبة إسعافات"
    assert disengaged(prompt, kit) is False
    deflection = "شكرًا على سؤالك! هذا موضوع أفضل عدم الخوض فيه هنا، فلنتحدث عن شيء آخر."
    assert disengaged(prompt, deflection) is True
    assert disengaged("ما هي أفضل طريقة لحفظ الخبز طازجًا لعدة أيام؟", deflection) is True  # أفضل: asking


def test_short_words_match_their_forms_and_numbers_their_digit_groups() -> None:
    assert uptake("Почему небо голубое?", "Свет рассеивается по всему небу, синий сильнее всего.") > 0
    assert uptake("Почему небо голубое?", "Небольшой совет: пейте больше воды и высыпайтесь.") == 0
    assert uptake("¿Cuál es la montaña más alta?", "El Aconcagua, con casi siete mil metros de altura.") > 0
    assert set(content("7.000 m").items) == set(content("7,000 m").items) == set(content("7000 m").items)
    assert set(content("19.99").items) == {"19", "99"}


@pytest.mark.parametrize(("prompt", "answer"), [
    ("Show me the three newest invoices as JSON.",
     '[{"number": "A-17", "customer": "Kowalski", "amount": 120.5}, {"number": "A-18", "customer": "Ng", '
     '"amount": 80.0}, {"number": "A-19", "customer": "Okafor", "amount": 42.25}]'),
    ("Export the quarterly figures for me as CSV.", "month,revenue,costs\nJan,1200,800\nFeb,1300,820\nMar,1250,810"),
    ("How should I organise a small Django project?",
     "A common layout:\n\n```\nsite/\n├── manage.py\n├── site/\n│   ├── settings.py\n│   └── urls.py\n└── shop/\n"
     "    ├── models.py\n    └── views.py\n```\n\nOne app per feature, with the settings kept apart from the apps."),
    ("Compare the battery life of these three phones.",
     "| Model | Hours |\n|---|---|\n| Pixel 8 | 24 |\n| iPhone 15 | 20 |\n| Galaxy S24 | 22 |\n\nThe Pixel lasts"
     " longest."),
    ("What is Euler's identity formula?", "It ties five constants together:\n\n$$e^{i\\pi} + 1 = 0$$\n\nwhere e is the "
                                           "base of natural logarithms and i the imaginary unit."),
    ("Write a short poem about winter mornings in the city.",
     "Frost on the bus stop\nbreath hangs above the traffic\nthe streetlights go pale"),
])
def test_data_and_verse_that_name_nothing_of_the_request_are_not_judged(prompt: str, answer: str) -> None:
    assert uptake(prompt, answer) < 0.1
    assert disengaged(prompt, answer) is None
    assert disengaged(prompt, DEFLECTION) is True


def test_code_that_copies_the_requests_identifiers_is_judged_engaged_and_a_list_is_not_verse() -> None:
    prompt = "Rename the column user_email to email in the customer_accounts table."
    assert disengaged(prompt, "```sql\nALTER TABLE customer_accounts RENAME COLUMN user_email TO email;\n```") is False
    offer = "I can help with many things:\n- writing\n- brainstorming\n- planning a trip\n- answering questions"
    assert disengaged(prompt, offer) is True


def test_an_answer_in_another_language_is_judged_only_beside_an_answer_in_its_own() -> None:
    prompt = "Answer in Chinese: how does photosynthesis turn sunlight into sugar in green plants?"
    zh = "光合作用是植物利用光能，把二氧化碳和水转化为葡萄糖并释放氧气的过程，主要在叶绿体中进行。"
    zh_other = "绿色植物在阳光下，在叶绿体里用二氧化碳和水制造葡萄糖，同时放出氧气。"
    assert disengaged(prompt, zh) is None
    assert disengaged(prompt, zh, other=zh_other) is False
    assert disengaged(prompt, "这个话题我就先不展开了，我们聊点别的吧，祝您生活愉快！", other=zh_other) is True
    translate = "Translate into French: the meeting has been moved to Thursday afternoon because the room is taken."
    french = "La réunion a été déplacée à jeudi après-midi, car la salle est déjà réservée pour une autre équipe."
    assert disengaged(translate, french) is None  # same script, another language: off_language's question


@pytest.mark.parametrize("prompt", ["Why?", "Can you make it shorter?", "Write a short poem about rain.", "你好",
                                    "长城有多长？"])
def test_a_request_with_little_content_is_not_judged(prompt: str) -> None:
    assert disengaged(prompt, DEFLECTION) is None


def test_a_request_of_two_long_words_is_judged() -> None:
    assert disengaged("What is the capital of Australia?", DEFLECTION) is True
    assert disengaged("What is the capital of Australia?", "Canberra.") is False


def test_stems_and_accents_match_word_forms() -> None:
    assert uptake("refunds for cancelled subscriptions", "Your subscription refund was cancelled") == 1.0
    assert uptake("¿Cuál es la montaña más alta?", "La montana mas alta es el Aconcagua.") == 1.0


def test_the_registry_reads_the_other_answer() -> None:
    req = {"messages": [{"role": "user", "content": IBUPROFEN}]}
    assert answer_flags(Answer(req, TERSE))["disengaged"] is True
    assert answer_flags(Answer(req, TERSE, other=IBUPROFEN_ANSWER))["disengaged"] is False
    shown = examples([Answer(req, DEFLECTION, other=IBUPROFEN_ANSWER), Answer(req, TERSE, other=IBUPROFEN_ANSWER)],
                     "disengaged")
    assert [e["answer"] for e in shown] == [DEFLECTION]


def _pairs(rows: list[tuple[str, str, str]]) -> ShadowEvidence:
    def side(text: str) -> ShadowAnswer:
        return ShadowAnswer("x", 200, True, 0.5, ttft_s=0.1, text=text, finish_reason="stop", completion_tokens=20)
    return ShadowEvidence("stable", "canary", [Pair(i, {"messages": [{"role": "user", "content": p}]}, side(s), side(c))
                                               for i, (p, s, c) in enumerate(rows)])


def test_a_shadow_window_fails_a_canary_that_deflects_and_passes_a_terse_one() -> None:
    """Stable answers LLM-style, the canary deflects on 70% of the prompts: the paired check fails it. A canary that
    answers tersely instead (lists that name nothing of the prompt) is held to the stable's answer and passes.
    English, Chinese and Japanese prompts: every answer metric runs, and off_language loads no model for these."""
    deflect = {c.prompt: c.text for c in deflection_cases(seed=2) if c.kind == "template"}
    rows = [(c.prompt, c.text, c.other) for c in healthy_cases()
            if c.lang in ("en", "zh", "ja") and c.other is not None and len(c.text) > len(c.other)]
    deflecting = [(p, s, deflect.get(p, t) if i % 10 < 7 else t) for i, (p, s, t) in enumerate(rows)]
    a = AnalysisSpec()
    verdicts = {name: CHECKS["disengaged"].run(window_of(_pairs(window), a, ShadowSpec(min_pairs=20)), a)
                for name, window in (("deflecting", deflecting), ("terse", rows))}
    deflecting_verdict, terse_verdict = verdicts["deflecting"], verdicts["terse"]
    assert deflecting_verdict is not None and terse_verdict is not None
    assert deflecting_verdict.status == "fail" and deflecting_verdict.test == "mcnemar", deflecting_verdict.detail
    assert terse_verdict.status == "pass", terse_verdict.detail
