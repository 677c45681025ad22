"""Async HTTP calls to one SGLang-protocol rollout server (ours or SGLang's), with httpx.

The calls are those AReaL's remote SGLang engine makes: ``/generate`` (one sample, continued
after an ``abort`` finish until it stops or reaches ``max_new_tokens``), ``/pause_generation``,
``/update_weights_from_disk``, ``/continue_generation`` and ``/health``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Sample", "ServerError", "SGLangClient", "parse_weight_version"]

_DONE = ("stop", "length")


class ServerError(RuntimeError):
    """A rollout server failed a request (connection, timeout, HTTP error, bad reply)."""

    def __init__(self, addr: str, message: str) -> None:
        self.addr = addr
        super().__init__(f"rollout server {addr}: {message}")


@dataclass
class Sample:
    """One generated completion.

    ``logprobs[i]`` is the behaviour log-prob (nats) of ``output_ids[i]`` and ``versions[i]``
    the weight version of the server that produced it; a sample continued after a weight
    update spans several versions.
    """

    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str = ""


def parse_weight_version(meta: dict[str, Any], addr: str) -> int:
    raw = meta.get("weight_version")
    try:
        return int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ServerError(
            addr,
            f"meta_info.weight_version is {raw!r}, not an integer: load weights with "
            "/update_weights_from_disk and a weight_version first",
        ) from None


class SGLangClient:
    """Requests to rollout servers over one shared ``httpx.AsyncClient``.

    Args:
        request_timeout: seconds one ``/generate`` or weight-update call may take.
        health_timeout: seconds a ``/health`` probe may take.
    """

    def __init__(self, request_timeout: float, health_timeout: float) -> None:
        self.request_timeout = request_timeout
        self.health_timeout = health_timeout
        import httpx  # the [server] extra: imported only by a run that talks to servers

        self._http = httpx.AsyncClient(timeout=request_timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _post(self, addr: str, endpoint: str, payload: dict[str, Any]) -> Any:
        import httpx

        try:
            resp = await self._http.post(f"http://{addr}{endpoint}", json=payload)
        except httpx.TimeoutException:
            raise ServerError(
                addr, f"{endpoint} timed out after {self.request_timeout:g}s"
            ) from None
        except httpx.HTTPError as exc:
            raise ServerError(addr, f"{endpoint} failed: {type(exc).__name__}: {exc}") from None
        if resp.status_code != 200:
            raise ServerError(addr, f"{endpoint} returned {resp.status_code}: {resp.text[:300]}")
        return resp.json()

    async def health(self, addr: str) -> bool:
        import httpx

        try:
            resp = await self._http.get(f"http://{addr}/health", timeout=self.health_timeout)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    async def generate(
        self, addr: str, sample: Sample, sampling_params: dict[str, Any], max_new_tokens: int
    ) -> Sample:
        """Complete ``sample`` on ``addr`` (continuing from the tokens it already holds)."""
        # greedy (temperature 0): no log-probs (0.0), the tokens are output_ids
        with_logprobs = float(sampling_params.get("temperature", 1.0)) != 0.0
        while sample.finish not in _DONE and len(sample.output_ids) < max_new_tokens:
            params = dict(sampling_params, max_new_tokens=max_new_tokens - len(sample.output_ids))
            payload = {
                "input_ids": sample.prompt_ids + sample.output_ids,
                "sampling_params": params,
                "return_logprob": with_logprobs,
                "stream": False,
            }
            out = await self._post(addr, "/generate", payload)
            meta = out.get("meta_info") or {}
            finish = (meta.get("finish_reason") or {}).get("type")
            if with_logprobs:
                pairs = meta.get("output_token_logprobs")
            else:
                ids = out.get("output_ids")
                pairs = None if ids is None else [(0.0, t) for t in ids]
            if finish not in (*_DONE, "abort") or pairs is None:
                raise ServerError(addr, f"/generate gave an unexpected reply: {str(out)[:300]}")
            version = parse_weight_version(meta, addr)
            sample.output_ids += [int(p[1]) for p in pairs]
            sample.logprobs += [float(p[0]) for p in pairs]
            sample.versions += [version] * len(pairs)
            sample.finish = finish
            if finish == "abort":  # cut short by a weight update: continue when it is done
                await asyncio.sleep(0.05)
        if sample.finish not in _DONE:
            sample.finish = "length"
        return sample

    async def pause(self, addr: str) -> None:
        """``/pause_generation`` (mode abort): running requests end with finish ``abort``."""
        await self._post(addr, "/pause_generation", {"mode": "abort"})

    async def resume(self, addr: str) -> None:
        await self._post(addr, "/continue_generation", {})

    async def update_weights(self, addr: str, path: str, version: int) -> None:
        """Pause ``addr``, load ``path`` as ``version``, continue."""
        await self._post(addr, "/pause_generation", {"mode": "abort"})
        try:
            out = await self._post(
                addr,
                "/update_weights_from_disk",
                {"model_path": path, "weight_version": str(version), "abort_all_requests": True},
            )
            if not out.get("success", False):
                raise ServerError(addr, f"weight update failed: {out.get('message')}")
        finally:
            await self._post(addr, "/continue_generation", {})
