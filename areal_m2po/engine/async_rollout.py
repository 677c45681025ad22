"""The trainer's side of async mode: servers, weight hand-over and batches, behind three calls.

:class:`AsyncRollout` starts the rollout servers the config asks for (or uses
``rollout.server_addrs``), waits until they answer ``/health``, writes the starting weights
once (``<output_dir>/rollout_weights/v<version>``) and has every server load them, then starts a
:class:`~areal_m2po.engine.remote_rollout.RemoteRollout`. The trainer calls
:meth:`AsyncRollout.next_batch` for each step, :meth:`AsyncRollout.update` after each update, and
:meth:`AsyncRollout.close` at the end.

On resume, generation restarts from the checkpoint's policy version: the servers load the
checkpoint's weights, and samples that were in flight when the checkpoint was written are lost
(they were never saved); their prompts are skipped for that epoch, since the loader position
saved in the checkpoint already counts them (up to ``max_head_offpolicyness + 1`` batches).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from areal_m2po.api.cli_args import GenerationConfig, RolloutConfig
from areal_m2po.engine.remote_rollout import (
    RemoteRollout,
    RemoteRolloutOptions,
    RolloutServerError,
    ScoreFn,
)
from areal_m2po.engine.server_launcher import ServerProcesses
from areal_m2po.engine.sglang_client import SGLangClient
from areal_m2po.engine.weight_files import prune_weights, write_weights
from areal_m2po.utils.data import Batch
from areal_m2po.utils.staleness import StalenessBudget

logger = logging.getLogger("areal_m2po.async_rollout")

__all__ = ["AsyncRollout", "RolloutServerError", "sampling_params"]


def sampling_params(g: GenerationConfig) -> dict[str, Any]:
    """SGLang ``sampling_params`` for ``g`` (``max_new_tokens`` is set per request)."""
    params: dict[str, Any] = {
        "temperature": g.temperature,
        "top_p": g.top_p,
        "top_k": g.top_k if g.top_k > 0 else -1,
    }
    if g.min_new_tokens:
        params["min_new_tokens"] = g.min_new_tokens
    if g.stop:
        params["stop"] = list(g.stop)
    return params


async def _wait_healthy(addrs: list[str], timeout: float, check: Callable[[], None]) -> None:
    client = SGLangClient(request_timeout=timeout, health_timeout=5.0)
    deadline = time.monotonic() + timeout
    try:
        for addr in addrs:
            while not await client.health(addr):
                check()
                if time.monotonic() > deadline:
                    raise RolloutServerError(
                        f"rollout server {addr} did not answer /health within {timeout:g}s "
                        "(rollout.setup_timeout)"
                    )
                await asyncio.sleep(0.5)
    finally:
        await client.aclose()


class AsyncRollout:
    """Rollout servers plus the client that feeds the trainer.

    Args:
        rollout: the ``rollout`` config section (mode async).
        gconfig: sampling settings.
        batch_groups: prompt groups per training step (``train_dataset.batch_size``).
        model_path, tokenizer_path, dtype, attn_implementation: for servers started here.
        model_config: the policy's ``transformers`` config, saved next to the weights.
        output_dir: the run directory (weights go to ``rollout_weights/``, logs to ``logs/``).
        prompt_source, score, decode, pad_id: see :class:`RemoteRollout`.
    """

    def __init__(
        self,
        rollout: RolloutConfig,
        gconfig: GenerationConfig,
        batch_groups: int,
        server_args: dict[str, Any],
        model_config: Any,
        output_dir: str,
        prompt_source: Callable[[], tuple[list[dict[str, Any]], int]],
        score: ScoreFn,
        decode: Callable[[list[int]], str],
        pad_id: int,
    ) -> None:
        self.rollout = rollout
        self.model_config = model_config
        self.weights_root = os.path.join(output_dir, "rollout_weights")
        self.servers: ServerProcesses | None = None
        if rollout.server_addrs:
            addrs = list(rollout.server_addrs)
        else:
            self.servers = ServerProcesses(
                rollout.n_servers,
                log_dir=os.path.join(output_dir, "logs"),
                num_threads=rollout.server_threads,
                device=rollout.server_device,
                **server_args,
            )
            addrs = self.servers.addrs
        self.addrs = addrs
        n = gconfig.n_samples
        self.budget = StalenessBudget(
            groups_per_batch=batch_groups,
            samples_per_group=n,
            max_head_offpolicyness=rollout.max_head_offpolicyness or 0,
            max_concurrent_samples=rollout.max_concurrent_rollouts or batch_groups * n,
        )
        self._remote_args = dict(
            sampling_params=sampling_params(gconfig),
            max_new_tokens=gconfig.max_new_tokens,
            budget=self.budget,
            prompt_source=prompt_source,
            score=score,
            decode=decode,
            pad_id=pad_id,
            options=RemoteRolloutOptions(
                request_timeout=rollout.request_timeout,
                health_check_interval=rollout.health_check_interval,
                health_check_timeout=rollout.health_check_timeout,
                tolerate_server_failures=rollout.tolerate_server_failures,
            ),
        )
        self.remote: RemoteRollout | None = None

    def _check_processes(self) -> None:
        if self.servers is not None:
            try:
                self.servers.check_alive()
            except RuntimeError as exc:
                raise RolloutServerError(str(exc)) from None

    def start(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Wait for the servers, load ``state_dict`` as ``version`` into them, start sampling."""
        asyncio.run(_wait_healthy(self.addrs, self.rollout.setup_timeout, self._check_processes))
        path = write_weights(state_dict, self.weights_root, version, self.model_config)

        async def load_all() -> None:
            client = SGLangClient(self.rollout.request_timeout, self.rollout.health_check_timeout)
            try:
                await asyncio.gather(*(client.update_weights(a, path, version) for a in self.addrs))
            finally:
                await client.aclose()

        try:
            asyncio.run(load_all())
        except Exception as exc:
            raise RolloutServerError(str(exc)) from None
        self.remote = RemoteRollout(self.addrs, base_version=version, **self._remote_args)
        self.remote.start()
        logger.info(
            "async rollout: %d servers (%s), max_head_offpolicyness %d, %d samples in flight "
            "at most",
            len(self.addrs),
            ", ".join(self.addrs),
            self.budget.max_head_offpolicyness,
            self.budget.max_concurrent_samples,
        )

    def next_batch(self) -> tuple[Batch, dict[str, float]]:
        assert self.remote is not None, "start() first"
        return self.remote.next_batch()

    def update(self, state_dict: dict[str, torch.Tensor], version: int) -> float:
        """Write the weights once, have every server load them; returns the seconds it took."""
        assert self.remote is not None, "start() first"
        t0 = time.perf_counter()
        path = write_weights(state_dict, self.weights_root, version, self.model_config)
        self.remote.update_weights(path, version)
        prune_weights(self.weights_root, version)
        return time.perf_counter() - t0

    def close(self) -> None:
        try:
            if self.remote is not None:
                self.remote.close()
        finally:
            if self.servers is not None:
                self.servers.stop()
