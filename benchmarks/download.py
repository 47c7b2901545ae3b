"""qlift download vs huggingface_hub.snapshot_download, same repo, same local hub, same run.

qlift adds a sha256 of every file against the published hash, the lockfile, the lineage
manifest (which hashes the output again) and the hard-linked atomic output; this measures
what that costs against the plain client. The hub is tests/hubserver (Python's http.server)
on 127.0.0.1; on a 2-core machine it serves about 40 MiB/s, so the hashing mostly overlaps
the transfer, as it would behind a real network link.

    .venv/bin/python benchmarks/download.py [--mib 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("HF_HUB_OFFLINE", None)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def repo_files(mib: int) -> dict[str, bytes]:
    shard = (mib // 2) * 1024 * 1024
    return {
        "config.json": b'{"model_type": "qwen2"}',
        "tokenizer.json": os.urandom(4 * 1024 * 1024),
        "tokenizer_config.json": b"{}",
        "model-00001-of-00002.safetensors": os.urandom(shard),
        "model-00002-of-00002.safetensors": os.urandom(shard),
        "model.safetensors.index.json": b'{"weight_map": {}}',
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512, help="total weight size")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from click.testing import CliRunner
    from hubserver import HubServer
    from huggingface_hub import snapshot_download

    from qlift.cli import cli

    work = Path(tempfile.mkdtemp(prefix="qlift-bench-download-"))
    peer_s: list[float] = []
    qlift_s: list[float] = []
    try:
        with HubServer() as hub:
            hub.commit("bench/model", repo_files(args.mib))
            for i in range(args.repeats):
                t = time.perf_counter()
                snapshot_download("bench/model", local_dir=work / f"peer{i}", endpoint=hub.url, max_workers=8)
                peer_s.append(time.perf_counter() - t)
                t = time.perf_counter()
                r = CliRunner().invoke(cli, ["-q", "download", "bench/model", "-o", str(work / f"q{i}"),
                                             "--endpoint", hub.url])
                qlift_s.append(time.perf_counter() - t)
                assert r.exit_code == 0, r.stderr
                shutil.rmtree(work / f"peer{i}")
                shutil.rmtree(work / f"q{i}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    peer, ours = statistics.median(peer_s), statistics.median(qlift_s)
    size = args.mib + 4
    print(f"repo: {size} MiB in 6 files, hub on 127.0.0.1, median of {args.repeats}")
    print(f"huggingface_hub.snapshot_download: {peer:.2f} s ({size / peer:.0f} MiB/s)")
    print(f"qlift download (verify + lock + manifest): {ours:.2f} s ({size / ours:.0f} MiB/s)")
    print(f"ratio qlift / snapshot_download: {ours / peer:.2f}x")


if __name__ == "__main__":
    main()
