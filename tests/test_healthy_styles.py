"""Healthy writing is never thrown away: answers of many styles in many languages trip no answer check.

tests/data/healthy_styles.jsonl holds healthy answers (Chinese, Japanese, Korean, Russian, Arabic, some
English and Spanish) in the styles a live judge sees: code blocks, tables, lists, the user's English error
message quoted back, 「」 quotes, a closing full-width parenthesis, emoji and kaomoji, poems, formulas, JSON
where JSON was asked, an ending URL. Each (lang, kind) has two wordings: the first is a "stable" answer, the
second a "canary" one. Every entry of ``ANSWER_METRICS`` is run, so a check added to the registry is held to
the corpus from the start. The other tests here pin the families behind the fixes: quoted or copied text is
no language switch, every closing bracket and quote is an ending, while a real switch or cut is still caught.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from qlift.quality.language import off_language
from qlift.quality.registry import ANSWER_METRICS, Answer
from qlift.quality.repetition import loops
from qlift.quality.rephrase import near_repetition
from qlift.quality.schema import asks_json
from qlift.quality.unfinished import unfinished
from qlift.rollout.check_types import CheckStatus, Window, WindowKind
from qlift.rollout.checks import run_checks
from qlift.rollout.evidence import VersionEvidence
from qlift.rollout.spec import AnalysisSpec

DATA = Path(__file__).parent / "data"
STYLES = DATA / "healthy_styles.jsonl"
OTHERS = DATA / "healthy_answers.jsonl"  # the text-shape check's healthy answers, where that file exists
SYSTEM = "You are a helpful assistant. Answer the user's question clearly and accurately, in the language they use."
KINDS = {"code_block", "table", "numbered_list", "bulleted_list", "block_quote_error", "inline_code", "cjk_quotes",
         "fullwidth_paren_end", "fullwidth_punct", "emoji", "multi_paragraph", "json_answer", "url_end",
         "english_term", "poem", "math"}
METRICS = [m.name for m in ANSWER_METRICS]


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


STYLE_ROWS = _rows(STYLES)
HEALTHY = STYLE_ROWS + _rows(OTHERS)


def _answer(row: dict[str, Any]) -> Answer:
    """The row as the live judge sees it: a system prompt (so the leak check judges it too), the user's message,
    response_format json_object where the user asked for JSON."""
    request: dict[str, Any] = {"messages": [{"role": "system", "content": SYSTEM},
                                            {"role": "user", "content": row["prompt"]}]}
    if row["kind"] == "json_answer":
        request["response_format"] = {"type": "json_object"}
    return Answer(request, row["answer"], finish_reason=row.get("finish_reason", "stop"))


def test_the_corpus_holds_every_style_in_five_scripts_and_two_wordings_each() -> None:
    assert len(STYLE_ROWS) >= 60 and {r["kind"] for r in STYLE_ROWS} >= KINDS
    assert {"zh", "ja", "ko", "ru", "ar", "en", "es"} <= {r["lang"] for r in STYLE_ROWS}
    for r in STYLE_ROWS:
        assert set(r) == {"lang", "kind", "prompt", "answer", "finish_reason"} and r["finish_reason"] == "stop", r
    wordings = defaultdict(list)
    for r in STYLE_ROWS:
        wordings[(r["lang"], r["kind"])].append(r["answer"])
    assert all(len(w) == 2 and w[0] != w[1] for w in wordings.values()), wordings


@pytest.mark.parametrize("name", METRICS)
def test_no_answer_check_flags_a_healthy_answer(name: str) -> None:
    metric = next(m for m in ANSWER_METRICS if m.name == name)
    flagged = [r for r in HEALTHY if metric.flag(_answer(r))]
    assert not flagged, f"{name} flags {len(flagged)} healthy answers:\n" + "\n".join(
        f"  {r['kind']} ({r['lang']}): {r['answer'][-80:]!r}" for r in flagged)


def test_the_checks_the_corpus_is_about_judge_it_rather_than_skip_it() -> None:
    """Not vacuous: the answers are judged (False), not found not applicable (None)."""
    judged = {m.name: sum(m.flag(_answer(r)) is False for r in STYLE_ROWS) for m in ANSWER_METRICS}
    assert judged["unfinished"] == judged["loops"] == judged["refusal"] == judged["leak"] == len(STYLE_ROWS)
    assert judged["off_language"] >= 0.9 * len(STYLE_ROWS), judged
    assert judged["json_invalid"] == sum(r["kind"] == "json_answer" for r in STYLE_ROWS)


def _evidence(version: str, answers: list[Answer]) -> VersionEvidence:
    n = len(answers)
    return VersionEvidence(version, requests=n, errors=0, bad_answers=0, finishes=n, length_finishes=0,
                           completions=n, completion_tokens_sum=150.0 * n, empty=0, answers=answers)


def test_a_split_window_of_healthy_answers_fails_no_answer_check() -> None:
    """The live judge's split window (run_split, per prompt script too): the first wording of each style as the
    stable's answers, the second as the canary's."""
    sides: dict[str, list[Answer]] = {"stable": [], "canary": []}
    seen: set[tuple[str, str]] = set()
    for r in STYLE_ROWS:
        key = (r["lang"], r["kind"])
        sides["canary" if key in seen else "stable"].append(_answer(r))
        seen.add(key)
    w = Window(WindowKind.SPLIT, _evidence("canary", sides["canary"]), _evidence("stable", sides["stable"]),
               min_count=10)
    results = {r.name: r for r in run_checks(w, AnalysisSpec()) if r.name in METRICS}
    assert set(results) == set(METRICS)
    bad = {n: (r.status, r.detail, r.examples) for n, r in results.items()
           if r.status not in (CheckStatus.PASS, CheckStatus.SKIPPED)}
    assert not bad, bad
    for name in ("loops", "off_language", "refusal", "json_invalid", "unfinished", "near_repetition", "leak"):
        assert results[name].status == CheckStatus.PASS and results[name].canary == 0.0, results[name]


ERROR_PROMPT = "运行程序时报错：ModuleNotFoundError: No module named 'numpy'，这是什么原因？"
NO_SWITCH = {
    "block-quote": (ERROR_PROMPT, "这个错误的意思是：\n\n> ModuleNotFoundError: No module named 'numpy'\n\n"
                                  "当前环境里没有安装 numpy，执行 `python -m pip install numpy` 即可。"),
    "copied-unquoted": (ERROR_PROMPT, "报错 ModuleNotFoundError: No module named 'numpy' "
                                      "说明当前环境里没有安装 numpy，请先安装它。"),
    "long-paste": ("运行 pip install 的时候报错：ERROR: Could not find a version that satisfies the requirement "
                   "tensorflow==2.5.0 这是什么原因？",
                   "这是因为 tensorflow 2.5.0 不支持你当前的 Python 版本，换成 Python 3.8 的环境再安装就可以了。"),
    "terms": ("前端框架怎么选？", "建议用 React、Vue 或 Angular 写前端，再用 Node.js 和 Express 写后端 API。"),
    "poem-asked-in-english": ("What does this Chinese poem mean? 床前明月光，疑是地上霜。举头望明月，低头思故乡。",
                              "It is Li Bai's \"Quiet Night Thought\": the poet mistakes moonlight on the floor "
                              "for frost, looks up at the moon and thinks of home."),
    "translation": ("请把这句话翻译成英文：我今天很忙，明天再聊吧。", "I'm very busy today, let's talk tomorrow."),
    "reply-draft": ("老板发来一句话：Please send me the report by Friday. 我该怎么回复比较礼貌？",
                    "可以这样回复：\n\nSure, I will send you the report by Friday. Thank you for the reminder."
                    "\n\n这样既确认了时间，又表达了感谢。"),
    "formula": ("一元二次方程的求根公式是什么？",
                "方程 $ax^2 + bx + c = 0$ 的两个根为 $$x = \\frac{-b \\pm \\sqrt{b^2 - 4ac}}{2a}$$"),
    "greek-letters": ("两个角互补是什么意思？", "若 α + β = π，则称角 α 与角 β 互补，例如 α = π/3 时 β = 2π/3。"),
    "spanish-copy": ("Me sale este error: ModuleNotFoundError: No module named 'requests'. ¿Qué hago?",
                     "El error ModuleNotFoundError: No module named 'requests' significa que la biblioteca requests "
                     "no está instalada en el entorno con el que ejecutas el script. Instálala con pip."),
}
SWITCH = {
    "switch-after-quote": (ERROR_PROMPT, "> ModuleNotFoundError: No module named 'numpy'\n\n"
                                         "这个错误说明当前环境里没有安装 numpy。You should install it with pip and "
                                         "then restart the interpreter, because the old process will not see it."),
    "switch-after-copy": (ERROR_PROMPT, "报错 ModuleNotFoundError: No module named 'numpy' 的意思是没有安装 numpy。"
                                        "If you want to fix it, you should reinstall the package and restart."),
    "zh-to-en": ("我的退款什么时候到账？", "Your refund was issued on Monday and should reach your card by Friday."),
    "en-to-zh": ("When will my refund arrive?", "您的退款已于周一发出，预计五个工作日内到账。"),
    "ja-to-zh": ("先週買ったイヤホンを返品できますか？", "可以，三十日以内未使用的商品都可以免费退货。"),
    "ru-to-en": ("Как заварить чай в чайнике?", "Rinse the teapot with boiling water, add the tea and wait."),
    "ar-to-en": ("ما فوائد ممارسة الرياضة بانتظام؟", "Regular exercise strengthens the heart and improves your mood."),
    "ko-to-ja": ("고양이가 밥을 잘 안 먹어요", "猫はフードが変わったり、ストレスを感じたりすると、食欲が落ちます。"),
    "en-to-es": ("How do I make a potato omelette at home?", "Pela y corta las patatas, fríelas en aceite de oliva "
                                                         "y mézclalas con los huevos batidos antes de cuajarla."),
    "short-zh": ("When will my refund arrive?", "周一已退款"),
    "only-terms": ("常用的 Linux 命令有哪些？", "ls、cd、pwd、grep、chmod、tar"),
}


@pytest.mark.parametrize("case", NO_SWITCH)
def test_quoted_copied_and_named_text_is_no_switch(case: str) -> None:
    assert off_language(*NO_SWITCH[case]) is False


@pytest.mark.parametrize("case", SWITCH)
def test_a_real_switch_is_still_caught(case: str) -> None:
    assert off_language(*SWITCH[case]) is True


DONE = "这是一个已经写完的完整回答，内容覆盖了用户提出的全部问题"
ENDINGS = [DONE + c for c in "」』）】〕〗〙〛》〉”’»›\"')]}．｡！？；…‥"] + [
    DONE + "……", DONE + "❤️", DONE + "1️⃣", DONE + " (ง •̀_•́)ง", DONE + " ^_^", DONE + "ｗｗ",
    "정말 잘하셨어요 화이팅 ㅋㅋㅋ", DONE + "：`git reset --soft HEAD~1`", DONE + "<br>", DONE + " **Python**",
    "根为\n\n$$x = \\frac{-b}{2a}$$", "هل تريد أن أشرح لك الخطوات بالتفصيل؟", "هذه إجابة كاملة عن السؤال المطروح۔",
    "يمكنك الاطلاع على «الحب في زمن الكوليرا»", "यह एक पूरा उत्तर है जो सवाल का जवाब देता है।",
    "Սա ամբողջական պատասխան է ձեր հարցին։", "ይህ ለጥያቄዎ ሙሉ መልስ ነው።", "ဒါဟာ သင့်မေးခွန်းအတွက် အဖြေ ဖြစ်ပါတယ်။",
    "珠穆朗玛峰的最新测量高度是8848.86米", "详情见官网：https://docs.python.org/zh-cn/3/",
    "はい、明日の午前中にお届けできます", "네, 내일 오전에 배송됩니다",
    "雨落在窗台上\n像谁在轻轻敲门\n我没有去开\n只是把灯调暗了一些",
    "订单已经发货，请注意查收。\n\n祝好，\n客服小王", "订单已经发货。\n\n此致\n敬礼！\n\n张伟",
    "订单已经发货。\n\n—— 小助手",
    "شكرًا لتواصلك معنا، تم شحن طلبك.\n\nمع خالص التحية،\nفريق الدعم", "| 北京 | 2186 |\n\n*数据来源：国家统计局*",
    "红叶真的太美了，推荐大家秋天一定要去一次。\n\n#旅行 #日本", "两者都是中国人口最多的城市之一。\n\n来源：国家统计局",
]


@pytest.mark.parametrize("text", ENDINGS, ids=repr)
def test_every_closing_bracket_quote_and_sentence_end_is_an_ending(text: str) -> None:
    assert unfinished(text, "stop") is False


@pytest.mark.parametrize("text", [
    "您好，退款已经处理完毕。款项将在三到五个工作日内退回到您的",
    "Sure, I can walk you through the reset. Here are the steps:", "您好，请按照以下步骤操作：",
    "Привет! Ваш заказ уже отправлен, и курьер доставит его в течение",
    "شكرًا لتواصلك معنا. تم شحن طلبك وسيصل إليك خلال",
    "Hi Anna,\nThanks for your order.\nYour refund will be sent to the",
])
def test_a_cut_answer_is_still_unfinished(text: str) -> None:
    assert unfinished(text, "stop") is True


def test_thai_has_no_sentence_punctuation_so_its_endings_are_not_judged() -> None:
    assert unfinished("ขอบคุณสำหรับคำถาม คำตอบคือให้รีสตาร์ทเครื่องแล้วลองใหม่อีกครั้ง", "stop") is None


def test_the_other_checks_leave_data_lists_quotes_and_questions_about_json_alone() -> None:
    from qlift.quality.refusal import refuses

    assert not loops("结果如下：\n\n```\n" + "[[0. 0. 0. 0.]\n" * 5 + "```")  # a closed code block is data
    assert loops("结果如下：\n\n```\n" + "0. 0. 0. 0. " * 8)  # an unclosed one, where a loop ends, is searched
    fruit = "- Apples: rich in fibre and vitamin C.\n- Oranges: rich in vitamin C and folate.\n" \
            "- Kiwis: rich in vitamin C and vitamin E.\n- Strawberries: rich in vitamin C and antioxidants."
    assert near_repetition(fruit) is False  # list items are parallel by design
    assert near_repetition('[{"status": "shipped", "carrier": "UPS"}, {"status": "shipped", "carrier": "UPS"}]') is None
    assert not refuses("> We are unable to process your request at this time.\n\n这条提示来自支付网关，稍后重试即可。")
    assert not refuses('The message "I\'m sorry, but I can\'t help with that" comes from the safety filter.')
    assert refuses("I'm sorry, but I can't help with that.")
    for about in ("JSON格式是什么？", "如何用JSON保存配置文件？", "What is the format of a JSON file?"):
        assert not asks_json({}, "", about), about
    for asked in ("请以JSON格式返回", "用JSON格式输出结果", "提取成 JSON 输出", "Answer in JSON", "Return JSON only"):
        assert asks_json({}, "", asked), asked
