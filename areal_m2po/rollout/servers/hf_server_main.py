"""``python -m areal_m2po.rollout_server``: serve a causal LM for asynchronous rollout.

    python -m areal_m2po.rollout_server --model-path builtin:tiny --host 127.0.0.1 --port 30000

Takes SGLang's launch flags ``--model-path`` (alias ``--model``), ``--tokenizer-path``,
``--host``, ``--port``, ``--dtype``, ``--random-seed``, ``--max-running-requests``,
``--device``, ``--api-key`` and ``--context-length``, plus our own ``--num-threads``,
``--attn-implementation``, ``--weights-root`` (weights load only from below it),
``--max-body-bytes`` and ``--parent-pid`` (exit when that process is gone: the trainer passes
its pid, so no server outlives it). The key is read from ``AREAL_M2PO_SERVER_API_KEY`` when
``--api-key`` is not given (the trainer passes it so, keeping it off the command line, which
``ps`` shows to everyone). The protocol is described in
:mod:`areal_m2po.rollout.servers.hf_server`.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys

from areal_m2po.rollout.common.connections import uvicorn_limits
from areal_m2po.rollout.common.guard import API_KEY_ENV, DEFAULT_MAX_BODY_BYTES
from areal_m2po.rollout.servers.watchdog import watch_parent
from areal_m2po.utils.console import print_error
from areal_m2po.utils.extras import require_extra
from areal_m2po.utils.fd_limit import raise_open_file_limit

__all__ = ["main", "parse_args"]

_DTYPES = {"auto": "float32", "float": "float32", "float32": "float32", "half": "float16"}
_DTYPES.update({"float16": "float16", "bfloat16": "bfloat16"})
_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
_TRACE = 5
"""uvicorn's ``trace`` level, below ``debug`` (the logging module has no name for it)."""


def _port(text: str) -> int:
    """``--port``: an integer 0-65535 (else argparse's one-line error, not a bind traceback)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535, got {port}")
    return port


def _refusal(args: argparse.Namespace) -> str | None:
    """The one-line error for arguments that cannot work or must not, found before the model
    loads: a public ``--host`` without a key, a local model or tokenizer path that is not there
    (else the hub client's "Repo id must be in the form ..." names neither flag), an address
    that cannot be listened on."""
    from areal_m2po.rollout.openai.endpoint import is_loopback

    if not is_loopback(args.host) and not (args.api_key or os.environ.get(API_KEY_ENV)):
        return (
            f"--host {args.host}: not a loopback address, and no key (--api-key or "
            f"${API_KEY_ENV}): whoever reaches it could generate and load weights"
        )
    for flag, path in (
        ("--model-path", args.model_path),
        ("--tokenizer-path", args.tokenizer_path),
    ):
        if path is None or path.startswith("builtin:") or os.path.isdir(path):
            continue
        if os.path.exists(path):
            return f"{flag}: {path} is a file; a model is a directory or a hub id"
        first, sep, _ = path.partition("/")
        if path.startswith(("/", "./", "../", "~")) or (sep and first and os.path.isdir(first)):
            return f"{flag}: {path} does not exist (a local model directory)"
    return _cannot_listen(args.host, args.port)


def _cannot_listen(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now (in use, not an address of this machine),
    or None; checked before the model loads, as uvicorn's bind would fail only after it."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            return f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})"
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m areal_m2po.rollout_server",
        description="Serve a causal LM for asynchronous rollout, with SGLang's launch flags "
        "(--model-path, --host, --port, ...) and the subset of its HTTP protocol the trainer "
        "uses (docs/scaling.md). The trainer starts these servers itself; start one by hand to "
        "share it, and give the trainer rollout.server_addrs=[HOST:PORT].",
    )
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=30000)
    p.add_argument("--dtype", default="auto", choices=sorted(_DTYPES))
    p.add_argument("--random-seed", type=int, default=0)
    p.add_argument("--max-running-requests", type=int, default=256)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    p.add_argument(
        "--attn-implementation", default="sdpa", choices=("sdpa", "eager", "flash_attention_2")
    )
    p.add_argument(
        "--api-key",
        default=None,
        help=f"every request but /health must carry 'Authorization: Bearer KEY' (default: "
        f"${API_KEY_ENV}; neither: no key, a warning, and a non-loopback --host is refused)",
    )
    p.add_argument(
        "--weights-root",
        default=None,
        help="/update_weights_from_disk loads only paths below this folder (symlinks resolved)",
    )
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="tokens of prompt + max_new_tokens a request may take (default: the model's "
        "max_position_embeddings)",
    )
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this pid is gone")
    p.add_argument("--log-level", default="warning", type=str.lower, choices=_LOG_LEVELS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.model_path = os.path.expanduser(args.model_path)
    if args.tokenizer_path is not None:
        args.tokenizer_path = os.path.expanduser(args.tokenizer_path)
    try:
        feature, modules = "the rollout server", ("fastapi", "uvicorn")
        require_extra("python -m areal_m2po.rollout_server", feature, "server", modules)
    except ValueError as exc:
        print_error(exc)
        return 2
    refusal = _refusal(args)
    if refusal is not None:
        print_error(refusal)
        return 2
    if args.parent_pid is not None:
        if os.getppid() != args.parent_pid:
            print(f"error: --parent-pid {args.parent_pid} is not our parent", file=sys.stderr)
            return 2
        watch_parent(args.parent_pid, lambda: os._exit(0))
    level = _TRACE if args.log_level == "trace" else args.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(name)s: %(message)s")
    raise_open_file_limit()

    import torch
    import uvicorn
    from transformers import AutoTokenizer

    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.engine.train_engine import load_causal_lm
    from areal_m2po.rollout.engines.hf_generator import HFGenerator
    from areal_m2po.rollout.engines.request_limits import model_limits
    from areal_m2po.rollout.servers.hf_server import GenerationWorker, ServerLimits, build_app

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    tok_path = args.tokenizer_path or args.model_path
    try:
        model = load_causal_lm(args.model_path, _DTYPES[args.dtype], args.attn_implementation)
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(tok_path))
    except (OSError, ValueError) as exc:
        print_error(exc)
        return 2
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    engine = HFGenerator(model, tokenizer, torch.device(device))
    del model
    requests = model_limits(engine.model)
    if args.context_length is not None:
        requests = dataclasses.replace(
            requests, context_len=args.context_length, context_name="--context-length"
        )
    limits = ServerLimits(
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        weights_root=args.weights_root,
        max_body_bytes=args.max_body_bytes,
        requests=requests,
    )
    if limits.api_key is None:
        logging.getLogger("areal_m2po.rollout_server").warning(
            "no --api-key: whoever reaches %s:%d can generate and load weights",
            args.host,
            args.port,
        )
    worker = GenerationWorker(engine, args.max_running_requests, args.random_seed)
    app = build_app(worker, args.model_path, tok_path, limits)
    try:
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            **uvicorn_limits(),
        )
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
