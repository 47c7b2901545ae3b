"""The answer metrics' limits: one field of the rollout spec's ``analysis`` section for each entry of
``registry.ANSWER_METRICS``, generated from this table (``AnalysisSpec``: its flags, docs and validation).

Kept apart from the metrics so that reading a rollout spec (or ``qlift promote start --help``) does not load
them: the registry imports every check's tables (~0.1 s).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShareLimit:
    """``AnalysisSpec.<field>``: the highest canary/stable share ratio of an answer metric's flagged answers
    that passes (then a one-sided proportion test decides)."""

    field: str
    flagged: str  # the flagged answers, as the field's description names them
    default: float = 2.0

    @property
    def description(self) -> str:
        return f"Highest canary/stable share of {self.flagged}"


SHARE_LIMITS = {  # an answer metric's name -> its limit, in the spec's order
    "loops": ShareLimit("max_loop_share_ratio", "answers that end in a loop (qlift.quality)."),
    "off_language": ShareLimit("max_off_language_share_ratio", "answers in another language than the prompt."),
    "refusal": ShareLimit("max_refusal_share_ratio", "refusals."),
    "schema_broken": ShareLimit("max_schema_broken_share_ratio",
                                "answers that break their request's json_schema."),
    "json_invalid": ShareLimit("max_json_invalid_share_ratio",
                               "answers that are no JSON where the request asked for JSON (response_format, the "
                               "system prompt or the user message)."),
    "unfinished": ShareLimit("max_unfinished_share_ratio",
                             "answers that end mid-sentence although the server finished them (finish_reason "
                             "stop)."),
    "near_repetition": ShareLimit("max_near_repetition_share_ratio",
                                  "answers that restate one claim several ways (qlift.quality)."),
    "leak": ShareLimit("max_leak_share_ratio", "answers that repeat a verbatim run of their system prompt."),
    "content_filtered": ShareLimit("max_content_filtered_share_ratio",
                                   "answers cut by the router's content filter (finish_reason content_filter)."),
    "text_shape": ShareLimit("max_text_shape_share_ratio",
                             "answers with garbled, padded, repeated or template text (mojibake, U+FFFD, "
                             "blank-line or emoji padding, a passage repeated anywhere, <|im_start|> or <think> "
                             "debris; qlift.quality.textshape)."),
    "disengaged": ShareLimit("max_disengaged_share_ratio",
                             "answers that take up none of the request's content words (deflections, another "
                             "subject, the answer to another request; qlift.quality.engagement)."),
    "tool_call_broken": ShareLimit("max_tool_call_broken_share_ratio",
                                   "answers to requests that offered tools whose tool calls are broken (arguments no "
                                   "JSON object or off the tool's schema, an unknown tool, no call where tool_choice "
                                   "required one)."),
}
