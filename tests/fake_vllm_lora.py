"""A stand-in for a vLLM server with runtime LoRA loading, as a process (a restart is a new process): /health,
/v1/models (the base with ``root``, adapters with ``root`` and ``parent``), /v1/load_lora_adapter and
/v1/unload_lora_adapter, /v1/completions, and /metrics with ``process_start_time_seconds`` and, after its first
request, ``vllm:lora_requests_info{max_lora=...}`` as vLLM writes them. GET /fake/state: its loads so far.

Run: python fake_vllm_lora.py --port P --base-root DIR --max-loras N [--lora NAME=DIR ...] [--pid-file F]
(other arguments, such as a `qlift serve` line's, are ignored)."""

from __future__ import annotations

import argparse
import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

START = time.time()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--base-root", required=True)
    ap.add_argument("--served-model-name", default="base")
    ap.add_argument("--max-loras", type=int, default=3)
    ap.add_argument("--lora", action="append", default=[])
    ap.add_argument("--pid-file")
    args, _ = ap.parse_known_args()
    adapters = dict(x.split("=", 1) for x in args.lora)
    state: dict[str, Any] = {"loads": 0, "requests": 0, "argv": args.lora}
    if args.pid_file:
        with open(args.pid_file, "w") as f:
            f.write(str(os.getpid()))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            return None

        def reply(self, code: int, body: Any, ctype: str = "application/json") -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self.reply(200, {})
            elif self.path == "/v1/models":
                models = [{"id": args.served_model_name, "root": args.base_root, "parent": None}]
                models += [{"id": n, "root": p, "parent": args.served_model_name} for n, p in adapters.items()]
                self.reply(200, {"object": "list", "data": models})
            elif self.path == "/metrics":
                text = f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {START}\n"
                if state["requests"]:
                    text += (f'vllm:lora_requests_info{{max_lora="{args.max_loras}",running_lora_adapters="",'
                             f'waiting_lora_adapters=""}} {time.time()}\n')
                self.reply(200, text, "text/plain")
            elif self.path == "/fake/state":
                self.reply(200, {**state, "adapters": adapters, "start": START})
            else:
                self.reply(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/v1/load_lora_adapter":
                state["loads"] += 1
                adapters[body["lora_name"]] = body["lora_path"]
                self.reply(200, f"Success: LoRA adapter '{body['lora_name']}' added successfully.", "text/plain")
            elif self.path == "/v1/unload_lora_adapter":
                if adapters.pop(body["lora_name"], None) is None:
                    self.reply(404, {"error": {"message": "not found", "code": 404}})
                else:
                    self.reply(200, "Success", "text/plain")
            elif self.path == "/v1/completions":
                state["requests"] += 1
                self.reply(200, {"choices": [{"text": "x", "finish_reason": "length"}]})
            else:
                self.reply(404, {"detail": "Not Found"})

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
