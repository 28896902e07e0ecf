"""A scripted LLM server on loopback that speaks the OpenAI chat-completions and Anthropic
messages protocols well enough for the real SDKs: each request gets the next scripted reply
(a text, or an HTTP error such as a 429 rate limit). Requests are recorded for assertions."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptedLLMServer:
    """`replies`: dicts with `text` (and optional `input_tokens`, `output_tokens`), or `status`
    (an HTTP error code) with optional `retry_after` seconds."""

    def __init__(self, replies: list[dict[str, Any]]):
        self.replies = list(replies)
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                with server._lock:
                    server.requests.append((self.path, body))
                    reply = server.replies.pop(0) if server.replies else {"status": 500}
                anthropic = self.path.endswith("/messages")
                if "status" in reply:
                    kind = "rate_limit_error" if reply["status"] == 429 else "api_error"
                    payload = ({"type": "error", "error": {"type": kind, "message": "scripted error"}} if anthropic
                               else {"error": {"message": "scripted error", "type": kind, "code": None}})
                    headers = {"retry-after": str(reply["retry_after"])} if "retry_after" in reply else {}
                    return self._send(reply["status"], payload, headers)
                n_in, n_out = reply.get("input_tokens", 100), reply.get("output_tokens", 50)
                if anthropic:
                    payload = {"id": "msg_1", "type": "message", "role": "assistant", "model": body.get("model"),
                               "content": [{"type": "text", "text": reply["text"]}], "stop_reason": "end_turn",
                               "stop_sequence": None, "usage": {"input_tokens": n_in, "output_tokens": n_out}}
                else:
                    payload = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body.get("model"),
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": reply["text"]}}],
                               "usage": {"prompt_tokens": n_in, "completion_tokens": n_out,
                                         "total_tokens": n_in + n_out}}
                self._send(200, payload, {})

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> "ScriptedLLMServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
