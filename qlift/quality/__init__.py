"""What an answer says, judged the same way offline (``qlift eval``) and live (``qlift promote``).

``registry.ANSWER_METRICS`` is the one list: each entry scores one answer to one request
(looping, another language than the prompt's, a refusal, a broken request schema). The eval's
metric table and the rollout judge's checks are both built from it.
"""
