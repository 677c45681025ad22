"""The vLLM backend's pure parts, without vLLM: the tied head in every update, the update's name
check, per-token versions from vLLM's spans, the sampling payload, the config and its one-line
errors (these run in the main environment too)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from areal_m2po.api.cli_args import ConfigError, RolloutConfig, VLLMConfig
from areal_m2po.api.engine_api import SamplingParams
from areal_m2po.rollout.engines.remote.vllm import sampling_payload, span_versions
from areal_m2po.rollout.engines.vllm.setup import check_vllm_model, vllm_env
from areal_m2po.rollout.engines.vllm.weights import NameCheck, with_tied_head

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def test_tied_head_is_added_once_and_only_when_tied():
    e, w = torch.ones(3, 2), torch.zeros(2)
    out = list(with_tied_head(iter([(EMBED, e), ("x", w)]), tied=True))
    assert [n for n, _ in out] == [EMBED, "x", HEAD] and out[2][1] is e
    assert [n for n, _ in with_tied_head([(EMBED, e)], tied=False)] == [EMBED]
    given = [(EMBED, e), (HEAD, e + 1)]
    assert [n for n, _ in with_tied_head(given, tied=True)] == [EMBED, HEAD]  # not twice
    with pytest.raises(RuntimeError, match="neither 'lm_head.weight' nor"):
        list(with_tied_head([("x", w)], tied=True))


def test_name_check_lists_missing_tensors_but_not_a_tied_head():
    check = NameCheck({EMBED, HEAD, "a", "b"}, tied=True)
    list(check.wrap([(EMBED, torch.ones(1)), ("a", torch.ones(1))]))
    assert check.missing() == ["b"]
    assert NameCheck({HEAD}, tied=False).missing() == [HEAD]


def test_span_versions():
    spans = [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 5}]
    assert span_versions(spans, 5, default=9) == [3, 3, 4, 4, 4]
    assert span_versions([{"version": "default", "start": 0, "end": 2}], 2, 7) == [7, 7]
    assert span_versions(None, 3, 1) == [1, 1, 1]


def test_sampling_payload_continues_and_refuses_truncation():
    s = SamplingParams(max_new_tokens=8, temperature=0.7, min_new_tokens=3, stop_token_ids=(5,))
    p = sampling_payload(s, [2], done=2)
    assert p["max_tokens"] == 6 and p["min_tokens"] == 1 and p["logprobs"] == 0
    assert p["stop_token_ids"] == [2, 5] and p["temperature"] == 0.7
    greedy = sampling_payload(SamplingParams(max_new_tokens=4, temperature=0.0), [2], 0)
    assert greedy["temperature"] == 0.0 and "logprobs" not in greedy
    with pytest.raises(ValueError, match="top_k=5"):
        sampling_payload(SamplingParams(max_new_tokens=4, top_k=5), [2], 0)


def test_env_keeps_user_settings_and_fixes_threads():
    env = vllm_env(2, 3, in_process=True, base={"VLLM_CPU_KVCACHE_SPACE": "7"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "7" and env["OMP_NUM_THREADS"] == "2"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in vllm_env(None, 1, in_process=False, base={})


def test_cpu_head_size_check(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"hidden_size": 64, "num_attention_heads": 4, "head_dim": 16})
    )
    with pytest.raises(ValueError, match="head size 16 is not supported by vLLM's CPU"):
        check_vllm_model(str(tmp_path), on_gpu=False)
    check_vllm_model(str(tmp_path), on_gpu=True)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 2}))
    check_vllm_model(str(tmp_path), on_gpu=False)


def test_config():
    assert RolloutConfig().backend == "hf"
    assert RolloutConfig(mode="async", backend="hf").vllm_placement == "servers"
    assert RolloutConfig().vllm_placement == "in_process"
    with pytest.raises(ConfigError, match="backend: must be one of"):
        RolloutConfig(backend="sglang")
    with pytest.raises(ConfigError, match="placement: must be one of"):
        VLLMConfig(placement="remote")
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization: must be in \(0, 1\]"):
        VLLMConfig(gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match="server_args: must be a list of strings"):
        VLLMConfig(server_args="--foo")
    # servers reached at given addresses or run by another interpreter need no vLLM here
    remote = RolloutConfig(backend="vllm", mode="async", server_addrs=["127.0.0.1:1"])
    other = RolloutConfig(backend="vllm", vllm=VLLMConfig(placement="servers", python="/x/py"))
    assert not remote.needs_local_vllm and not other.needs_local_vllm
    assert RolloutConfig(backend="vllm").needs_local_vllm and not RolloutConfig().needs_local_vllm


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_missing_vllm_is_one_line_before_anything_loads():
    from areal_m2po.api.cli_args import PPOConfig
    from areal_m2po.trainer.preflight import check_config

    cfg = PPOConfig(rollout=RolloutConfig(backend="vllm", staleness=1))  # a value check only
    with pytest.raises(ConfigError) as info:
        check_config(cfg)  # the start-up check looks the package up
    msg = str(info.value)
    assert msg.startswith("rollout.backend: vllm: vLLM is not importable in ") and "\n" not in msg
    assert "bash scripts/install.sh --vllm" in msg


def test_server_command():
    from areal_m2po.rollout.servers.launch import VLLMServerOptions, vllm_server_command

    o = VLLMServerOptions(model_path="/m", max_model_len=64, seed=2, extra_args=("--x", "1"))
    cpu = vllm_server_command(o, 1234, 1, on_gpu=False)
    assert cpu[1:3] == ["-m", "areal_m2po.rollout.vllm_server_main"]
    after = cpu[cpu.index("--") + 1 :]
    for flag, value in (("--port", "1234"), ("--seed", "2001"), ("--tokenizer", "/m")):
        assert after[after.index(flag) + 1] == value
    assert after[after.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert (
        "--enforce-eager" in after and "--enable-scale-out" in after and after[-2:] == ["--x", "1"]
    )
    gpu = vllm_server_command(o, 1234, 0, on_gpu=True)
    assert "--enforce-eager" not in gpu and "--gpu-memory-utilization" in gpu


def test_engine_options_take_the_rollout_keys_of_their_names():
    from areal_m2po.api.cli_args import RolloutConfig
    from areal_m2po.rollout.engines.remote.base import RemoteEngineOptions

    roll = RolloutConfig(setup_timeout=7.0, request_timeout=8.0, health_check_timeout=9.0)
    remote = roll.engine_options(RemoteEngineOptions)
    assert (remote.setup_timeout, remote.request_timeout, remote.health_check_timeout) == (7, 8, 9)
    assert remote.health_check_interval == roll.health_check_interval
    assert remote.tolerate_server_failures == roll.tolerate_server_failures
    given = roll.engine_options(RemoteEngineOptions, weights_root="/w", setup_timeout=1.0)
    assert given == RemoteEngineOptions(
        weights_root="/w",
        setup_timeout=1.0,
        request_timeout=8.0,
        health_check_interval=roll.health_check_interval,
        health_check_timeout=9.0,
        tolerate_server_failures=roll.tolerate_server_failures,
    )
