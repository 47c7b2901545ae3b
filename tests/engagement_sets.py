"""Healthy answers and seeded deflections for the engagement check (tests/test_engagement.py).

The healthy set is tests/data/engagement_healthy.jsonl: prompts in 15 languages, each with two answers of
different styles. The deflections are generated: per language, 8 deflections that use no refusal word
(small talk, boilerplate, a changed subject, "consult a professional", another user's answer), each with a
seeded opener and closer, plus the healthy answer to another prompt of the same language ("answers another
request") and English boilerplate for every prompt.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

HEALTHY = Path(__file__).parent / "data" / "engagement_healthy.jsonl"

DEFLECTIONS: dict[str, list[str]] = {
    "en": [
        "That is a topic I would rather leave aside here, so let us talk about something else.",
        "Let me know if you have any other questions, I'm always happy to help!",
        "I'd recommend consulting a qualified professional who can look at your specific situation and give "
        "you advice tailored to it.",
        "By the way, have you ever tried baking sourdough bread at home? It's a wonderful weekend hobby and the "
        "smell alone is worth it.",
        "I'm here to help with a wide range of tasks, such as writing, brainstorming, and answering general "
        "knowledge questions. What would you like to do today?",
        "That's something many people wonder about. Everyone's situation is different, so it's best to keep an "
        "open mind and explore what works for you.",
        "Here's a quick tip: staying hydrated and getting enough sleep can make a big difference in how you "
        "feel every day.",
        "As I mentioned to the previous user, the meeting has been moved to Thursday at 3 pm in room 204, and "
        "the slides are in the shared folder.",
    ],
    "es": [
        "Es un tema que prefiero dejar de lado por ahora, así que hablemos de otra cosa.",
        "Si tienes alguna otra pregunta, no dudes en escribirme. ¡Estoy aquí para ayudarte!",
        "Te recomiendo consultar a un profesional cualificado que pueda valorar tu situación concreta y "
        "orientarte de forma personalizada.",
        "Por cierto, ¿has probado alguna vez a cultivar tomates en el balcón? Es un pasatiempo muy relajante "
        "y los resultados son deliciosos.",
        "Puedo ayudarte con muchas tareas, como redactar textos, generar ideas o responder preguntas de cultura "
        "general. ¿Qué te gustaría hacer hoy?",
        "Es algo que mucha gente se plantea. Cada situación es distinta, así que lo mejor es mantener la mente "
        "abierta y ver qué funciona en tu caso.",
        "Un consejo rápido: dormir bien y beber suficiente agua marca una gran diferencia en cómo te sientes "
        "cada día.",
        "Como le comenté al usuario anterior, la reunión se ha trasladado al jueves a las 15:00 en la sala 204 "
        "y las diapositivas están en la carpeta compartida.",
    ],
    "zh": [
        "这个话题我就先不展开了，我们聊点别的吧。",
        "如果您还有其他问题，随时告诉我，我很乐意为您提供帮助！",
        "建议您咨询相关领域的专业人士，他们可以根据您的具体情况给出更合适的建议。",
        "对了，您最近有没有试过在家里烤面包？周末做做烘焙，既放松又有成就感。",
        "我可以帮您完成很多任务，比如写作、头脑风暴、回答常识性问题等。今天您想做些什么呢？",
        "很多人都会思考这个问题。每个人的情况都不一样，保持开放的心态，找到适合自己的方式最重要。",
        "给您一个小建议：保持充足的睡眠和多喝水，会让您每天的状态好很多。",
        "正如我刚才跟上一位用户说的，会议改到了周四下午三点，在204会议室，幻灯片已经放在共享文件夹里了。",
    ],
    "ru": [
        "Эту тему я бы предпочёл здесь не затрагивать, так что давайте поговорим о чём-нибудь другом.",
        "Если у вас появятся другие вопросы, обращайтесь, я всегда рад помочь!",
        "Рекомендую обратиться к квалифицированному специалисту, который сможет оценить вашу ситуацию и дать "
        "персональный совет.",
        "Кстати, вы когда-нибудь пробовали печь хлеб на закваске дома? Это замечательное хобби для выходных.",
        "Я могу помочь с самыми разными задачами: написать текст, придумать идеи или ответить на общие вопросы. "
        "Чем займёмся сегодня?",
        "Об этом задумываются многие. У каждого своя ситуация, поэтому лучше сохранять открытость и искать то, "
        "что подходит именно вам.",
        "Небольшой совет: достаточный сон и питьевой режим сильно влияют на самочувствие каждый день.",
        "Как я уже говорил предыдущему пользователю, встреча перенесена на четверг на 15:00 в переговорную 204, "
        "а слайды лежат в общей папке.",
    ],
    "ja": [
        "その話題はここでは控えさせていただきますので、別のお話をしましょう。",
        "ほかにご不明な点があれば、いつでもお気軽にお尋ねください。喜んでお手伝いします！",
        "具体的な状況に合わせたアドバイスができる専門家に相談されることをおすすめします。",
        "ところで、最近おうちでパン作りをしてみたことはありますか？週末の趣味にぴったりですよ。",
        "文章作成やアイデア出し、一般的な知識に関する質問など、さまざまなお手伝いができます。今日は何をしましょうか？",
        "多くの方が気になっていることですね。人それぞれ状況が違うので、柔軟に考えて自分に合う方法を見つけるのが一番です。",
        "ちょっとしたアドバイスです。十分な睡眠と水分補給で、毎日の体調がずいぶん変わりますよ。",
        "前のユーザーの方にもお伝えしましたが、会議は木曜日の午後3時に204会議室へ変更になり、資料は共有フォルダにあります。",
    ],
}
OPENERS = {"en": ["", "Thanks for asking!", "Great question!", "Good point."],
           "es": ["", "¡Gracias por preguntar!", "¡Buena pregunta!"],
           "zh": ["", "谢谢您的提问！", "好问题！"],
           "ru": ["", "Спасибо за вопрос!", "Хороший вопрос!"],
           "ja": ["", "ご質問ありがとうございます。", "いい質問ですね！"]}
CLOSERS = {"en": ["", "Have a great day!"], "es": ["", "¡Que tengas un buen día!"], "zh": ["", "祝您生活愉快！"],
           "ru": ["", "Хорошего дня!"], "ja": ["", "良い一日をお過ごしください。"]}
# Deflections that name the request's topic first: uptake cannot tell these (reported apart).
ECHOES = {"en": "You asked about {topic}. That's not something I'll go into here, but feel free to ask me anything "
                "else!",
          "es": "Me preguntas sobre {topic}. No voy a entrar en eso aquí, ¡pero pregúntame lo que quieras!",
          "zh": "您问的是关于{topic}的事情。这方面我就不多说了，欢迎问我其他问题！",
          "ru": "Вы спрашиваете про {topic}. Здесь я не буду в это углубляться, но спрашивайте о чём угодно другом!",
          "ja": "{topic}についてのご質問ですね。ここでは詳しく触れませんが、ほかのことなら何でもどうぞ！"}
BOILERPLATE = "Great question! Let me know if you have any other questions."


@dataclass(frozen=True)
class Case:
    lang: str
    prompt: str
    text: str
    kind: str  # healthy, template, another_request, boilerplate, echo
    other: str | None = None  # the other version's (healthy) answer to the same prompt


def healthy_rows() -> list[dict[str, str]]:
    lines = HEALTHY.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip() and not line.startswith("#")]


def healthy_cases() -> list[Case]:
    """Each prompt's two answers, each with the other as the other version's."""
    return [Case(r["lang"], r["prompt"], text, "healthy", other)
            for r in healthy_rows() for text, other in ((r["answer"], r["alt"]), (r["alt"], r["answer"]))]


def deflection_cases(seed: int = 0) -> list[Case]:
    """Every prompt's deflections; each has the prompt's healthy answer as the other version's."""
    rng = random.Random(seed)
    rows = healthy_rows()
    out = []
    for r in rows:
        lang, real = r["lang"], r["answer"]
        for body in DEFLECTIONS.get(lang, []):
            text = " ".join(p for p in (rng.choice(OPENERS[lang]), body, rng.choice(CLOSERS[lang])) if p)
            out.append(Case(lang, r["prompt"], text, "template", real))
        same = [x for x in rows if x["lang"] == r["lang"] and x["prompt"] != r["prompt"]]
        if same:
            out.append(Case(lang, r["prompt"], rng.choice(same)["answer"], "another_request", real))
        out.append(Case(lang, r["prompt"], BOILERPLATE, "boilerplate", real))
    return out


def echo_cases() -> list[Case]:
    return [Case(r["lang"], r["prompt"], ECHOES[r["lang"]].format(topic=r["topic"]), "echo", r["answer"])
            for r in healthy_rows() if r["lang"] in ECHOES]
