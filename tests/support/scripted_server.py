"""A small real rollout server for the remote-engine tests: uvicorn on a loopback port, in a
thread, answering the SGLang-protocol and the vLLM-server calls the remote engines make with
scripted replies, and recording every call.

Replies: ``/generate`` and ``/inference/v1/generate`` continue the context with
``max_new_tokens`` tokens ``last + 1, last + 2, ...`` (log-prob ``-0.5`` each) and finish
``length``; a context holding :data:`REFUSED_TOKEN` gets a 400 (the request is bad, the server is
fine), as a real server refuses a prompt it cannot take. ``fail_with`` makes an endpoint answer
that status instead. The weight version it reports is the last one it was told
(``/update_weights_from_disk``'s ``weight_version``, ``/update_weight_version``), or
``version_label`` when set. The first ``abort_first`` SGLang ``/generate`` calls are cut short
after 2 tokens (finish ``abort``) and the version then goes up by one, as a weight update does.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

REFUSED_TOKEN = 999
"""A context holding this token id is refused with a 400."""


class ScriptedServer:
    """One server; ``calls`` holds ``(endpoint, body)`` of every request, in order.

    Args:
        fail_with: ``{endpoint: status}``: that endpoint answers the status (e.g. 500).
        abort_first: SGLang ``/generate`` calls answered ``abort`` first.
        version_label: the ``weight_version`` SGLang replies carry (default: the version).
    """

    def __init__(
        self,
        fail_with: dict[str, int] | None = None,
        abort_first: int = 0,
        version_label: str | None = None,
    ) -> None:
        self.fail_with = dict(fail_with or {})
        self.abort_first = abort_first
        self.version_label = version_label
        self.calls: list[tuple[str, Any]] = []
        self.fail_health_next = 0
        """The next this many ``/health`` probes are answered 503 (counted in
        ``health_refused``)."""
        self.health_refused = 0
        self.version = 0
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.addr = ""

    def endpoints(self, name: str) -> list[Any]:
        """The bodies of the calls to ``name``, in order."""
        with self._lock:
            return [body for endpoint, body in self.calls if endpoint == name]

    def _record(self, endpoint: str, body: Any) -> int | None:
        with self._lock:
            self.calls.append((endpoint, body))
        return self.fail_with.get(endpoint)

    def _tokens(self, context: list[int], n: int) -> list[int]:
        return [(context[-1] + 1 + i) % 500 for i in range(n)]

    def _app(self) -> Any:
        app = FastAPI()

        def refused(status: int | None, body: Any) -> Any:
            if status is not None:
                return JSONResponse({"error": {"message": f"scripted {status}"}}, status)
            ids = body.get("input_ids") or body.get("token_ids") or []
            if REFUSED_TOKEN in ids:
                return JSONResponse({"error": {"message": "token id 999 is refused"}}, 400)
            return None

        @app.get("/health")
        async def health() -> Any:
            status = self._record("/health", None) or 200
            with self._lock:
                if self.fail_health_next > 0:
                    self.fail_health_next -= 1
                    self.health_refused += 1
                    status = 503
            return Response(status_code=status)

        @app.post("/generate")
        async def generate(request: Request) -> Any:
            body = await request.json()
            if (bad := refused(self._record("/generate", body), body)) is not None:
                return bad
            n = int(body["sampling_params"]["max_new_tokens"])
            finish, version = "length", str(self.version)
            if self.abort_first > 0 and n > 2:
                self.abort_first -= 1
                finish, n = "abort", 2
                self.version += 1
            out = self._tokens(body["input_ids"], n)
            meta = {
                "finish_reason": {"type": finish},
                "weight_version": self.version_label or version,
                "output_token_logprobs": [[-0.5, t, None] for t in out],
            }
            return {"text": "", "output_ids": out, "meta_info": meta}

        @app.post("/inference/v1/generate")
        async def vllm_generate(request: Request) -> Any:
            body = await request.json()
            if (bad := refused(self._record("/inference/v1/generate", body), body)) is not None:
                return bad
            out = self._tokens(body["token_ids"], int(body["sampling_params"]["max_tokens"]))
            choice = {
                "token_ids": out,
                "finish_reason": "length",
                "logprobs": {"content": [{"logprob": -0.5} for _ in out]},
                "weight_versions": [{"start": 0, "end": len(out), "version": str(self.version)}],
            }
            return {"choices": [choice]}

        @app.post("/update_weights_from_disk")
        async def update(request: Request) -> Any:
            body = await request.json()
            if (status := self._record("/update_weights_from_disk", body)) is not None:
                return JSONResponse({"success": False, "message": "scripted"}, status)
            self.version = int(body["weight_version"])
            return {"success": True, "message": "ok", "num_paused_requests": 0}

        @app.post("/update_weight_version")
        async def label(request: Request) -> Any:
            body = await request.json()
            if (status := self._record("/update_weight_version", body)) is not None:
                return JSONResponse({"error": "scripted"}, status)
            self.version = int(body["new_version"])
            return {}

        for path in (
            "/pause_generation",
            "/continue_generation",
            "/pause",
            "/resume",
            "/collective_rpc",
            "/reset_prefix_cache",
        ):
            app.add_api_route(path, self._plain(path), methods=["POST"])
        return app

    def _plain(self, path: str) -> Any:
        async def handler(request: Request) -> Any:
            raw = await request.body()
            status = self._record(path, raw.decode() or None)
            if status is not None:
                return JSONResponse({"error": "scripted"}, status)
            return {"status": "ok"}

        return handler

    def start(self) -> ScriptedServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self._app(), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            assert time.monotonic() < deadline, "scripted server did not start"
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._server = self._thread = None
