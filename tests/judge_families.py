"""Failure families in many disguises, and healthy styles, for the rollout's judge (issue 52).

A seeded generator: a multilingual deck of requests (support tickets in six languages, a Python error quoted
by the user, JSON classification, tool calls), the answers a healthy stable gives them, and canaries that
differ from it only in what they say. Each **family** (a deflection, a refusal in the prompt's language, a
broken tool call, misdecoded text, padding, a passage repeated mid-answer, chat-template debris, a language
switch, an answer to another request, a cut answer) comes in at least five **disguises**; each **healthy**
canary writes the same content in another ordinary style (a block quote of the user's error, 「」 and （）
endings, lists, tables, code, emoji, shorter, longer). The judge was not written against these strings: the
generator is how we prove a detector covers its family, in tests (the registry, offline) and through the real
router and ``qlift promote start`` (``benchmarks/judge_families.py``, the table in docs/promote-checks.md).

``Case.answer(body)`` returns (text, finish_reason, tool_calls or None) for one request body.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ToolCall = dict[str, Any]
Reply = tuple[str, str, list[ToolCall] | None]
Answerer = Callable[[dict[str, Any]], Reply]

MODULES = ("requests", "numpy", "yaml", "pandas", "httpx", "scipy", "dateutil", "jinja2")
CITIES = ("Paris", "Berlin", "Madrid", "Lisbon", "Seoul", "Osaka", "Toronto", "Nairobi")
CITIES_ZH = ("北京", "上海", "广州", "成都", "杭州", "南京", "西安", "重庆")
LANGS = ("en", "zh", "es", "ru", "ja", "ko")

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}}


# -- the deck: what users ask ---------------------------------------------------------------------------------

REFUND_ASK = {
    "en": "Please refund my order {o}. It arrived broken.",
    "zh": "我的订单 {o} 到货时已经损坏了，请帮我退款。",
    "es": "Mi pedido {o} llegó roto. ¿Pueden devolverme el dinero, por favor?",
    "ru": "Мой заказ {o} пришёл повреждённым. Верните, пожалуйста, деньги.",
    "ja": "注文 {o} の商品が壊れた状態で届きました。返金をお願いします。",
    "ko": "주문 {o} 상품이 파손된 상태로 도착했습니다. 환불해 주세요.",
}
REFUND_ANSWER = {
    "en": ("I'm sorry to hear that your order {o} arrived broken. I have issued a full refund for it, and the money "
           "will be back on your original payment method within five business days. You do not need to send the "
           "damaged item back."),
    "zh": ("非常抱歉，您的订单 {o} 到货时出现了损坏。我们已经为您办理全额退款，款项将在五个工作日内原路退回。"
           "损坏的商品无需寄回。"),
    "es": ("Lamento mucho que su pedido {o} haya llegado roto. Ya hemos tramitado el reembolso completo y el dinero "
           "volverá a su método de pago original en un plazo de cinco días hábiles. No es necesario devolver el "
           "artículo dañado."),
    "ru": ("Очень жаль, что заказ {o} пришёл повреждённым. Мы оформили полный возврат: деньги поступят на исходный "
           "способ оплаты в течение пяти рабочих дней. Возвращать повреждённый товар не нужно."),
    "ja": ("ご注文 {o} の商品が破損した状態で届いたとのこと、大変申し訳ございません。全額返金の手続きを完了しました。"
           "五営業日以内に元のお支払い方法へ返金されます。破損した商品の返送は不要です。"),
    "ko": ("주문 {o} 상품이 파손된 상태로 도착해 정말 죄송합니다. 전액 환불을 처리했으며, 영업일 기준 5일 이내에 원래 "
           "결제 수단으로 환불됩니다. 파손된 상품은 반송하지 않으셔도 됩니다."),
}
ERROR_ASK = {
    "en": "My Python script fails with ModuleNotFoundError: No module named '{m}'. How do I fix it?",
    "zh": "运行脚本时报错 ModuleNotFoundError: No module named '{m}'，该怎么解决？",
}
ERROR_ANSWER = {
    "en": ("The error means the package {m} is not installed in the Python environment that runs your script. "
           "Install it with `python -m pip install {m}`, so it goes into the same interpreter, then run the script "
           "again. If you use a virtual environment, activate it first."),
    "zh": ("这个错误说明运行脚本的 Python 环境里没有安装 {m} 包。请用 `python -m pip install {m}` 安装，确保装进同一个"
           "解释器，然后重新运行脚本。如果你使用虚拟环境，请先激活它。"),
}
WEATHER_ASK = {"en": "What's the weather like in {c} right now?", "zh": "{c}现在天气怎么样？"}


@dataclass(frozen=True)
class Prompt:
    kind: str  # refund, error, json, tool
    lang: str
    key: str  # the order id, module or city the prompt is about
    body: dict[str, Any]  # the request body (no model, no stream)


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def deck(n: int = 8) -> list[Prompt]:
    """``n`` of each kind of request, in every language it comes in: tickets in six languages, the Python error
    in English and Chinese, a JSON classification, a tool call (required and auto)."""
    out: list[Prompt] = []
    for i in range(n):
        o, m = f"A{1000 + i}", MODULES[i % len(MODULES)]
        out += [Prompt("refund", lang, o, {"messages": _user(REFUND_ASK[lang].format(o=o))}) for lang in LANGS]
        out += [Prompt("error", lang, m, {"messages": _user(ERROR_ASK[lang].format(m=m))}) for lang in ERROR_ASK]
        out.append(Prompt("json", "en", o, {"messages": _user(f"Classify this ticket: please cancel order {o}."),
                                            "response_format": {"type": "json_object"}}))
        c = CITIES[i % len(CITIES)], CITIES_ZH[i % len(CITIES_ZH)]
        for lang, city, choice in (("en", c[0], "required"), ("zh", c[1], "auto")):
            out.append(Prompt("tool", lang, city, {"messages": _user(WEATHER_ASK[lang].format(c=city)),
                                                   "tools": [WEATHER_TOOL], "tool_choice": choice}))
    return out


def _user_text(body: dict[str, Any]) -> str:
    return str(next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user"))


def classify(body: dict[str, Any]) -> Prompt:
    """The deck's prompt a request body came from (the backend sees bodies only)."""
    text = _user_text(body)
    lang = ("zh" if re.search("[\u4e00-\u9fff]", text) and not re.search("[\u3040-\u30ff]", text) else
            "ja" if re.search("[\u3040-\u30ff]", text) else "ko" if re.search("[\uac00-\ud7af]", text) else
            "ru" if re.search("[а-яё]", text, re.I) else "es" if re.search("[¿¡ñ]|pedido", text) else "en")
    if body.get("tools"):
        city = next((c for c in CITIES + CITIES_ZH if c in text), CITIES[0])
        return Prompt("tool", lang, city, body)
    if body.get("response_format"):
        return Prompt("json", "en", _order(text), body)
    if "ModuleNotFoundError" in text:
        return Prompt("error", lang, re.findall(r"'([^']+)'", text)[0], body)
    return Prompt("refund", lang, _order(text), body)


def _order(text: str) -> str:
    m = re.search(r"A\d{4}", text)
    return m.group(0) if m else "A1000"


def stable_reply(p: Prompt) -> Reply:
    """What the healthy stable answers: the prompt's own language, JSON where asked, a tool call where offered."""
    if p.kind == "tool":
        args = json.dumps({"city": p.key, "unit": "celsius"}, ensure_ascii=False)
        return "", "tool_calls", [{"id": "call_0", "type": "function",
                                   "function": {"name": "get_weather", "arguments": args}}]
    if p.kind == "json":
        return json.dumps({"intent": "cancel", "order_id": p.key}), "stop", None
    if p.kind == "error":
        return ERROR_ANSWER[p.lang].format(m=p.key), "stop", None
    return REFUND_ANSWER[p.lang].format(o=p.key), "stop", None


def stable(body: dict[str, Any]) -> Reply:
    return stable_reply(classify(body))


# -- disguises --------------------------------------------------------------------------------------------

Change = Callable[[Prompt, str, random.Random], str]  # (prompt, the stable's prose, rng) -> the canary's prose

DEFLECTIONS = {
    "en": ["Thanks for asking! That is a topic I would rather leave aside here, so let us talk about something else.",
           "What a thoughtful message! I think it's best if we focus on other things today. Anything else on your "
           "mind?",
           "I appreciate you sharing this with me. Let's keep our conversation light and move on to another subject, "
           "shall we?",
           "Great question! These things are often best explored on your own, and I'm happy to chat about anything "
           "else you like.",
           "Thank you for your patience. I'd suggest we look at a different topic together; there's so much else "
           "to talk about!"],
    "zh": ["谢谢你的提问！这个话题我们今天先放一放，不如聊点别的吧。",
           "感谢您的留言。我们换个轻松的话题聊聊怎么样？",
           "很高兴收到您的消息！这类事情最好由您自己慢慢探索，我们可以聊聊其他内容。",
           "您的问题很有意思，不过我们还是谈谈别的吧。",
           "感谢您的耐心。建议我们把注意力放在其他事情上，还有很多值得聊的。"],
    "es": ["¡Gracias por tu mensaje! Prefiero no entrar en ese tema ahora; ¿hablamos de otra cosa?",
           "Qué buena pregunta. Creo que es mejor centrarnos hoy en otros asuntos. ¿Hay algo más que te interese?",
           "Te agradezco que lo compartas. Mejor pasemos a otro tema más ligero, ¿te parece?",
           "¡Muchas gracias por escribir! Estas cosas conviene explorarlas por cuenta propia; charlemos de lo que "
           "quieras.", "Gracias por tu paciencia. Te propongo que miremos juntos un tema diferente."],
    "ru": ["Спасибо за вопрос! Давайте лучше поговорим о чём-нибудь другом.",
           "Благодарю за сообщение. Думаю, сегодня лучше сосредоточиться на других темах.",
           "Интересный вопрос! Такие вещи лучше изучать самостоятельно, а мы можем обсудить что-то ещё.",
           "Спасибо, что поделились. Предлагаю перейти к более лёгкой теме, хорошо?",
           "Спасибо за терпение. Давайте вместе посмотрим на другую тему, есть о чём поговорить."],
    "ja": ["ご質問ありがとうございます。その話題はまた今度にして、別のお話をしましょう。",
           "メッセージをありがとうございます。今日は他のことに目を向けてみませんか。",
           "興味深いご質問ですね。こうしたことはご自身で調べるのが一番です。他の話題ならいつでもどうぞ。",
           "共有していただき感謝します。もっと気軽な話題に移りましょうか。",
           "お待たせしました。せっかくなので違うテーマについて話しましょう。"],
    "ko": ["질문해 주셔서 감사합니다! 그 이야기는 잠시 접어 두고 다른 이야기를 나눠 볼까요?",
           "메시지 감사합니다. 오늘은 다른 주제에 집중하는 것이 좋겠어요.",
           "흥미로운 질문이네요. 이런 것은 직접 알아보시는 게 가장 좋아요. 다른 이야기라면 언제든지요.",
           "공유해 주셔서 고마워요. 좀 더 가벼운 주제로 넘어가 볼까요?",
           "기다려 주셔서 감사합니다. 다른 주제를 함께 살펴보면 어떨까요?"],
}
REFUSALS = {
    "en": ["I'm sorry, but I can't help with that request.", "I am not able to assist with this.",
           "Unfortunately, I cannot provide help with that.", "As an AI model, I must decline this request.",
           "That is not something I can help you with, I'm afraid."],
    "zh": ["抱歉，我无法帮助处理这个请求。", "很遗憾，我不能协助您完成这件事。", "对不起，这超出了我能提供帮助的范围。",
           "作为一个AI助手，我无法处理这个问题。", "不好意思，这个请求我没办法帮您。"],
    "es": ["Lo siento, pero no puedo ayudarte con esa solicitud.", "Lamentablemente, no puedo ayudar con esto.",
           "Como modelo de lenguaje, no puedo atender esta petición.",
           "Disculpa, pero no me es posible ayudarte con eso.",
           "No puedo proporcionar ayuda con ese tema."],
    "ru": ["Извините, но я не могу помочь с этим запросом.", "К сожалению, я не могу выполнить эту просьбу.",
           "Как языковая модель, я не могу помочь с этим.", "Боюсь, это не то, с чем я могу помочь.",
           "Я не в состоянии помочь с этим вопросом."],
    "ja": ["申し訳ありませんが、そのご依頼にはお応えできません。",
           "恐れ入りますが、この件についてはお手伝いできかねます。",
           "AIアシスタントとして、そのリクエストには対応できません。", "すみません、その質問にはお答えできません。",
           "残念ながら、その件は対応いたしかねます。"],
    "ko": ["죄송하지만 그 요청은 도와드릴 수 없습니다.", "안타깝게도 이 부분은 도와드리기 어렵습니다.",
           "AI 모델로서 그 요청에는 응할 수 없습니다.", "죄송합니다, 그 질문에는 답변드릴 수 없습니다.",
           "유감스럽지만 그 일은 제가 도와드릴 수 없어요."],
}
OTHER_LANGUAGE = {"en": "es", "zh": "en", "es": "ru", "ru": "en", "ja": "en", "ko": "zh"}


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?。！？])\s*", text) if s]


def _join(parts: list[str], like: str) -> str:
    return ("" if re.search("[\u3040-\u30ff\u4e00-\u9fff]", like) else " ").join(parts)


def deflect(pick: int) -> Change:
    return lambda p, text, rng: DEFLECTIONS[p.lang][pick]


def refuse(pick: int) -> Change:
    return lambda p, text, rng: REFUSALS[p.lang][pick]


def _mojibake(s: str, codec: str) -> str:
    return s.encode("utf-8").decode(codec, errors="replace")


def garble(way: str) -> Change:
    def change(p: Prompt, text: str, rng: random.Random) -> str:
        parts = _sentences(text)
        if way == "cp1252_all":
            return _mojibake(text, "cp1252")
        if way == "latin1_fifth":  # C1 controls and Latin-1 letters in one sentence of five
            i = rng.randrange(len(parts))
            parts[i] = _mojibake(parts[i], "latin-1")
            return _join(parts, text)
        if way == "replacement":
            chars = list(text)
            for i in rng.sample(range(len(chars)), max(2, len(chars) // 25)):
                chars[i] = "\ufffd"
            return "".join(chars)
        if way == "double":
            return _mojibake(_mojibake(text, "cp1252"), "cp1252")
        i = rng.randrange(len(parts))  # "cp1252_sentence"
        parts[i] = _mojibake(parts[i], "cp1252")
        return _join(parts, text)
    return change


PADDING = {"blank": "\n\n\n\n\n\n\n\n", "dots": "\n...\n...\n...\n...\n...\n", "emoji": " 😊😊😊✨✨✨👍👍👍🙏🙏🙏",
           "dashes": "\n— — — — — — — — — — — —\n· · · · · · · · · · · ·", "spaces": "\u00a0" * 40 + "\u200b" * 30}


def pad(way: str) -> Change:
    def change(p: Prompt, text: str, rng: random.Random) -> str:
        first = _sentences(text)[0]
        padding = PADDING[way]
        return first + padding * max(1, (len(text) - len(first)) // max(1, len(padding.strip()) or 1) // 3)
    return change


def repeat(way: str) -> Change:
    def change(p: Prompt, text: str, rng: random.Random) -> str:
        parts = _sentences(text)
        if way == "paragraph":
            return text + "\n\n" + text + "\n\n" + parts[-1]
        if way == "first_again":
            return _join([*parts[:2], *parts, *parts[2:]], text)
        if way == "middle_three":
            mid = len(parts) // 2
            return _join(parts[:mid] + [parts[mid]] * 3 + parts[mid + 1:], text)
        if way == "head_twice":
            head = _join(parts[:-1], text)
            return head + "\n\n" + head + "\n\n" + parts[-1]
        return _join(parts + parts[:2] + parts, text)  # "interleaved"
    return change


TEMPLATES = {
    "im_start": lambda t: f"<|im_start|>assistant\n{t}",
    "think": lambda t: f"<think>\nThe user wants help. I should answer briefly.\n</think>\n\n{t}",
    "turn_mid": lambda t: f"{t}<|im_end|>\n<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\nYou're welcome!",
    "inst": lambda t: f"[INST] {t} [/INST]",
    "llama3": lambda t: f"{t}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{t[:40]}",
}


def debris(way: str) -> Change:
    return lambda p, text, rng: TEMPLATES[way](text)


def switch_language(way: str) -> Change:
    def change(p: Prompt, text: str, rng: random.Random) -> str:
        other = OTHER_LANGUAGE[p.lang]
        table = REFUND_ANSWER if p.kind == "refund" else ERROR_ANSWER
        theirs = table.get(other, table["en"]).format(o=p.key, m=p.key)
        parts, their_parts = _sentences(text), _sentences(theirs)
        if way == "whole":
            return theirs
        if way == "mid":
            return _join(parts[:1], text) + " " + _join(their_parts[1:], theirs)
        if way == "last":
            return _join(parts[:-1], text) + " " + their_parts[-1]
        if way == "english":
            return table["en"].format(o=p.key, m=p.key) if p.lang != "en" else theirs
        return theirs + "\n\n" + text  # "both"
    return change


def another_request(way: str) -> Change:
    def change(p: Prompt, text: str, rng: random.Random) -> str:
        if way == "other_kind":
            table, key = (ERROR_ANSWER, MODULES[0]) if p.kind == "refund" else (REFUND_ANSWER, "A0042")
            return table.get(p.lang, table["en"]).format(o=key, m=key)
        if way == "recipe":
            return ("Here is a simple pancake recipe: mix one cup of flour, one egg and one cup of milk, then cook "
                    "small rounds in a hot buttered pan for two minutes on each side.")
        if way == "weather":
            return "It is sunny and 22 degrees today, with a light breeze from the west in the afternoon."
        if way == "summary":
            return ("In summary, the French Revolution began in 1789 and changed the political order of Europe, "
                    "ending the absolute monarchy and spreading ideas of citizenship.")
        return ("Sure! The capital of Australia is Canberra, which was chosen as a compromise between Sydney and "
                "Melbourne.")  # "trivia"
    return change


def cut(way: str) -> Change:
    share = {"two_thirds": 0.66, "half": 0.5, "most": 0.85, "third": 0.4, "word": 0.75}[way]

    def change(p: Prompt, text: str, rng: random.Random) -> str:
        at = int(len(text) * share)
        out = text[:at].rstrip(" ,.。，")
        return out if way != "word" else out + (" and the" if p.lang in ("en", "es") else "")
    return change


# -- broken tool calls -------------------------------------------------------------------------------------

def _call(name: str, args: str) -> list[ToolCall]:
    return [{"id": "call_0", "type": "function", "function": {"name": name, "arguments": args}}]


def broken_tool(way: str) -> Callable[[Prompt], Reply]:
    def reply(p: Prompt) -> Reply:
        if way == "truncated":
            return "", "tool_calls", _call("get_weather", json.dumps({"city": p.key}, ensure_ascii=False)[:-4])
        if way == "python_dict":
            return "", "tool_calls", _call("get_weather", f"{{'city': '{p.key}', 'unit': 'celsius'}}")
        if way == "schema":
            return "", "tool_calls", _call("get_weather", json.dumps({"town": p.key, "unit": "kelvin"},
                                                                     ensure_ascii=False))
        if way == "unknown_tool":
            return "", "tool_calls", _call("weather_lookup", json.dumps({"city": p.key}, ensure_ascii=False))
        if way == "prose":
            return f"The weather in {p.key} is mild and sunny today.", "stop", None
        return (f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{p.key}", }}\n</tool_call>',
                "stop", None)  # "text_call": a Hermes-style call left in the text, its JSON broken
    return reply


# -- healthy styles of the same content ----------------------------------------------------------------------

def healthy(way: str) -> Change:
    def change(p: Prompt, text: str, rng: random.Random) -> str:
        parts = _sentences(text)
        zh = p.lang in ("zh", "ja")
        if way == "quote_error":  # the user's own English error, quoted back in a block quote or code span
            if p.kind == "error":
                err = f"ModuleNotFoundError: No module named '{p.key}'"
                return f"> {err}\n\n{text}" if p.lang != "en" else f"You are seeing `{err}`. {text}"
            return text
        if way == "cjk_brackets":
            if p.lang == "zh":
                return text.rstrip("。") + "（通常为五个工作日）" if p.kind == "refund" else (
                    text.rstrip("。") + "，命令是「python -m pip install " + p.key + "」")
            if p.lang == "ja":
                return text.rstrip("。") + "（通常五営業日）"
            if p.lang == "ru":
                return text.rstrip(".") + " («полный возврат»)"
            return text
        if way == "list":
            return ("\n".join(f"{i}. {s}" for i, s in enumerate(parts, 1)) if not zh else
                    "\n".join(f"- {s}" for s in parts))
        if way == "table":
            rows = "\n".join(f"| {i} | {s} |" for i, s in enumerate(parts, 1))
            return f"| # | {'步骤' if zh else 'Step'} |\n|---|---|\n{rows}"
        if way == "emoji":
            return text + (" 🙏" if zh else " 🙂")
        if way == "shorter":
            return _join(parts[:2], text)
        if way == "longer":
            extra = {"en": "If you have any other questions, just reply to this message.",
                     "zh": "如有其他问题，欢迎随时联系我们。",
                     "es": "Si tiene cualquier otra pregunta, responda a este mensaje.",
                     "ru": "Если появятся вопросы, просто ответьте на это письмо.",
                     "ja": "他にご不明な点がございましたら、お気軽にご連絡ください。",
                     "ko": "다른 문의 사항이 있으시면 언제든지 연락해 주세요."}[p.lang]
            return _join([*parts, extra], text)
        if way == "code":
            if p.kind == "error":
                return f"{text}\n\n```bash\npython -m pip install {p.key}\npython your_script.py\n```"
            return text
        return text  # "same"
    return change


# -- cases ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    family: str
    disguise: str
    healthy: bool
    answer: Answerer
    share: float  # of the canary's prose answers it changes (the rest are the stable's)

    @property
    def name(self) -> str:
        return f"{self.family}/{self.disguise}"


def _canary(change: Change | None, share: float, seed: int, tool: Callable[[Prompt], Reply] | None = None,
            kinds: tuple[str, ...] = ("refund", "error")) -> Answerer:
    def answer(body: dict[str, Any]) -> Reply:
        p = classify(body)
        text, finish, calls = stable_reply(p)
        rng = random.Random(f"{seed}:{json.dumps(body, sort_keys=True, ensure_ascii=False)}")
        if rng.random() >= share:
            return text, finish, calls
        if tool is not None and p.kind == "tool":
            return tool(p)
        if change is not None and p.kind in kinds:
            return change(p, text, rng), finish, None
        return text, finish, calls
    return answer


FAMILIES: dict[str, tuple[Callable[[Any], Change], tuple[Any, ...]]] = {
    "deflection": (deflect, (0, 1, 2, 3, 4)),
    "refusal_in_language": (refuse, (0, 1, 2, 3, 4)),
    "misdecoded": (garble, ("cp1252_all", "latin1_fifth", "replacement", "double", "cp1252_sentence")),
    "padding": (pad, tuple(PADDING)),
    "repeat_mid_answer": (repeat, ("paragraph", "first_again", "middle_three", "head_twice", "interleaved")),
    "template_debris": (debris, tuple(TEMPLATES)),
    "language_switch": (switch_language, ("whole", "mid", "last", "english", "both")),
    "another_request": (another_request, ("other_kind", "recipe", "weather", "summary", "trivia")),
    "cut_short": (cut, ("two_thirds", "half", "most", "third", "word")),
}
TOOL_DISGUISES = ("truncated", "python_dict", "schema", "unknown_tool", "prose", "text_call")
HEALTHY_STYLES = ("same", "quote_error", "cjk_brackets", "list", "table", "emoji", "shorter", "longer", "code")


def cases(seed: int = 0, share: float = 0.7) -> list[Case]:
    """Every family in every disguise (``share`` of the prose answers changed, or of the tool calls broken), then
    every healthy style (all answers)."""
    out = [Case(family, str(d), False, _canary(make(d), share, seed), share)
           for family, (make, disguises) in FAMILIES.items() for d in disguises]
    out += [Case("broken_tool_call", d, False, _canary(None, share, seed, tool=broken_tool(d)), share)
            for d in TOOL_DISGUISES]
    out += [Case("healthy", s, True, _canary(healthy(s), 1.0, seed), 1.0) for s in HEALTHY_STYLES]
    return out
