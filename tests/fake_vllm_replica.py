"""A stand-in for one vLLM replica, as a process (so a test can SIGKILL it): /health, /v1/models (the base with
``root``, runtime adapters with ``root`` and ``parent``), /v1/chat/completions and /v1/completions (plain or
streamed; each answer names the replica that wrote it), /v1/load_lora_adapter, /v1/unload_lora_adapter, /metrics
(``process_start_time_seconds``, ``vllm:request_success_total`` and, after its first request,
``vllm:lora_requests_info{max_lora=...}``) and GET /fake/state (its requests and adapters).

Run as vLLM would be run (``qlift serve`` through QLIFT_VLLM_PYTHON pointing at a script that execs this):
``python fake_vllm_replica.py [-m qlift.vllm.cli_main serve] MODEL --host H --port P [--served-model-name N]``;
other arguments are ignored. Its name in answers is ``replica-PORT``; QLIFT_FAKE_PID_DIR: it writes PORT.pid there.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

START = time.time()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", dest="module")
    ap.add_argument("words", nargs="*")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--served-model-name")
    ap.add_argument("--max-loras", type=int, default=4)
    args, _ = ap.parse_known_args()
    model = next((w for w in args.words if w != "serve"), "model")
    served = args.served_model_name or Path(model).name
    me = f"replica-{args.port}"
    adapters: dict[str, str] = {}
    state: dict[str, Any] = {"requests": 0, "loads": 0, "name": me, "env_bind": os.environ.get(
        "VLLM_CPU_OMP_THREADS_BIND"), "env_cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if os.environ.get("QLIFT_FAKE_PID_DIR"):
        (Path(os.environ["QLIFT_FAKE_PID_DIR"]) / f"{args.port}.pid").write_text(str(os.getpid()))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

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
                self.reply(200, "", "text/plain")
            elif self.path == "/v1/models":
                models = [{"id": served, "object": "model", "root": model, "parent": None}]
                models += [{"id": n, "object": "model", "root": p, "parent": served} for n, p in adapters.items()]
                self.reply(200, {"object": "list", "data": models})
            elif self.path == "/metrics":
                text = (f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {START}\n"
                        f'vllm:request_success_total{{finished_reason="stop",model_name="{served}"}} '
                        f"{state['requests']}\n")
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
            elif self.path in ("/v1/chat/completions", "/v1/completions"):
                self.answer(body)
            else:
                self.reply(404, {"detail": "Not Found"})

        def answer(self, body: dict[str, Any]) -> None:
            name = body.get("model")
            if name != served and name not in adapters:
                self.reply(404, {"error": {"message": f"The model `{name}` does not exist.", "code": 404}})
                return
            state["requests"] += 1
            chat = self.path == "/v1/chat/completions"
            text = f"answered by {me}"
            usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
            if not body.get("stream"):
                choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text},
                                           "finish_reason": "stop"} if chat
                                          else {"index": 0, "text": text, "finish_reason": "stop"})
                self.reply(200, {"id": "x", "object": "chat.completion" if chat else "text_completion",
                                 "model": name, "choices": [choice], "usage": usage})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for i, part in enumerate(text.split(" ")):
                delta = {"content": (" " if i else "") + part}
                chunk = {"id": "x", "object": "chat.completion.chunk", "model": name,
                         "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            end = {"id": "x", "object": "chat.completion.chunk", "model": name,
                   "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}
            self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
            self.close_connection = True

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
