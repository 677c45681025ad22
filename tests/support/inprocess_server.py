"""The HF rollout server's application served in this process by uvicorn on loopback, so a
test can look inside it (transformers' caches, a patched check) while it speaks real HTTP."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import torch
from agentic_helpers import tiny_model_and_tokenizer

from areal_m2po.rollout.engines.hf_generator import HFGenerator
from areal_m2po.rollout.engines.request_limits import model_limits
from areal_m2po.rollout.servers.hf_server import GenerationWorker, ServerLimits, build_app


@dataclass
class InProcessServer:
    """A started server: its address, key, weights root and worker."""

    addr: str
    key: str
    root: str
    worker: GenerationWorker

    def post(self, endpoint: str, **kwargs: object) -> httpx.Response:
        auth = {"Authorization": f"Bearer {self.key}"}
        return httpx.post(f"http://{self.addr}{endpoint}", headers=auth, timeout=60, **kwargs)


@contextlib.contextmanager
def serve_tiny(root: str, key: str = "k" * 32) -> Iterator[InProcessServer]:
    """A tiny model's HF server on a free loopback port, weights loaded below ``root``."""
    import uvicorn

    model, tokenizer = tiny_model_and_tokenizer()
    engine = HFGenerator(model, tokenizer, torch.device("cpu"))
    worker = GenerationWorker(engine, max_batch=8)
    limits = ServerLimits(api_key=key, weights_root=root, requests=model_limits(engine.model))
    app = build_app(worker, "tiny", "tiny", limits)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield InProcessServer(f"127.0.0.1:{port}", key, root, worker)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        worker.close()
        sock.close()
