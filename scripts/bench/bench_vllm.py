"""vLLM in process vs the HF engine at the main job's shape: generation, weight update, RL step.

Run from an environment with vLLM (``bash scripts/install.sh --vllm``)::

    OMP_NUM_THREADS=1 python scripts/bench/bench_vllm.py                 # SmolLM2-135M, 8 x 8 x 16
    OMP_NUM_THREADS=1 python scripts/bench/bench_vllm.py --train-steps 0 # engines only

Both engines hold the same weights (``--model``, fp32) and serve the main job's batch: 8 prompts
of the built-in arithmetic task through the chat template, 8 samples each, at most 16 new tokens,
temperature 1. With the thread count fixed (``--threads``, default 1), it alternates the two
engines ``--rounds`` times and prints ``name=value`` lines:

* ``hf_gen_s``, ``vllm_gen_s``: median seconds of one batch; ``vllm_vs_hf_gen_time``: their
  ratio (< 1: vLLM is faster); ``*_tokens_per_s``: generated tokens per second;
* ``hf_update_s``, ``vllm_update_s``: median seconds of one in-memory weight update;
* ``vllm_max_logp_gap``: max |vLLM - HF recomputed| behaviour log-prob over the last batch;
* with ``--train-steps N`` (default 3): the trainer (the main job's config: staleness 1, M2PO,
  decoupled loss) run for N steps with ``rollout.backend`` hf and vllm one after the other,
  ``--train-repeats`` times alternately; per backend the medians over every step after each
  run's first: ``{hf,vllm}_step_s`` (``timing/step_s``), ``{hf,vllm}_train_{gen,prox,update,
  sync}_s`` (the step's phases; ``sync`` is the weight hand-over to the engine), and
  ``vllm_vs_hf_step_time``.

Never run it beside another multi-threaded job: ratios are only meaningful with the cores to
itself (docs/performance.md says how the published figures were taken).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _prompts(tokenizer: Any, n: int) -> list[list[int]]:
    from areal_m2po.dataset.arithmetic import make_arithmetic_split

    records = make_arithmetic_split("train", n, seed=0)
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": r["question"]}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
        for r in records
    ]


def _batch(engine: Any, prompts: list[list[int]], n: int, max_new: int) -> tuple[float, list]:
    from areal_m2po.api.engine_api import ModelRequest, SamplingParams

    sampling = SamplingParams(max_new_tokens=max_new, temperature=1.0)

    async def run() -> list:
        reqs = [ModelRequest(p, sampling) for p in prompts for _ in range(n)]
        return list(await asyncio.gather(*(engine.agenerate(r) for r in reqs)))

    t0 = time.perf_counter()
    out = asyncio.run(run())
    return time.perf_counter() - t0, out


def _max_gap(model: Any, responses: list) -> float:
    import torch

    gap = 0.0
    for r in responses:
        ids = torch.tensor([r.input_ids + r.output_ids])
        with torch.no_grad():
            logits = model(ids).logits[0].double()
        p = len(r.input_ids)
        ref = torch.log_softmax(logits[p - 1 : p - 1 + len(r.output_ids)], -1)
        ref = ref.gather(-1, torch.tensor(r.output_ids)[:, None])[:, 0]
        gap = max(
            gap, float((torch.tensor(r.output_logprobs, dtype=torch.float64) - ref).abs().max())
        )
    return gap


def bench_engines(model_path: str, rounds: int, threads: int) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_m2po.rollout.engines.hf import HFInProcessEngine
    from areal_m2po.rollout.engines.vllm.in_process import VLLMEngineOptions, VLLMInProcessEngine

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    prompts = _prompts(tok, 8)
    hf = HFInProcessEngine(model, tok, torch.device("cpu"))
    vllm = VLLMInProcessEngine(
        model_path, tok, options=VLLMEngineOptions(max_model_len=512, num_threads=threads)
    )
    t0 = time.perf_counter()
    vllm.initialize()
    out: dict[str, float] = {"vllm_start_s": time.perf_counter() - t0}
    print(f"vllm_start_s={out['vllm_start_s']:.4g}", flush=True)
    times: dict[str, list[float]] = {k: [] for k in ("hf_gen", "vllm_gen", "hf_upd", "vllm_upd")}
    tokens = {"hf": 0, "vllm": 0}
    last: list = []
    for i in range(rounds + 1):  # round 0 warms both up and is not counted
        for name, engine in (("hf", hf), ("vllm", vllm)):
            seconds, responses = _batch(engine, prompts, 8, 16)
            t1 = time.perf_counter()
            engine.update_weights_from_tensors(model.state_dict(), version=i + 1)
            upd = time.perf_counter() - t1
            print(f"round {i} {name}: gen {seconds:.3f} s, update {upd:.3f} s", flush=True)
            if i:
                times[f"{name}_gen"].append(seconds)
                times[f"{name}_upd"].append(upd)
                tokens[name] += sum(len(r.output_ids) for r in responses)
            if name == "vllm":
                last = responses
    for name in ("hf", "vllm"):
        gen = statistics.median(times[f"{name}_gen"])
        out[f"{name}_gen_s"] = gen
        out[f"{name}_tokens_per_s"] = tokens[name] / sum(times[f"{name}_gen"])
        out[f"{name}_update_s"] = statistics.median(times[f"{name}_upd"])
    out["vllm_vs_hf_gen_time"] = out["vllm_gen_s"] / out["hf_gen_s"]
    out["vllm_max_logp_gap"] = _max_gap(model, last)
    vllm.destroy()
    return out


def _train(backend: str, steps: int, threads: int, model: str) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix=f"bench_vllm_{backend}_") as run_dir:
        cmd = [sys.executable, "-m", "areal_m2po.train", f"actor.path={model}"]
        cmd += [f"ref.path={model}", f"output_dir={run_dir}", f"total_train_steps={steps}"]
        cmd += [f"num_threads={threads}", f"rollout.backend={backend}"]
        cmd += ["evaluator.eval_at_start=false", "evaluator.eval_at_end=false"]
        cmd += ["evaluator.freq_steps=null", "saver.save_at_end=false"]
        cmd += ["stats_logger.progress_bar=false"]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=REPO)
        subprocess.run(cmd, check=True, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
        with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
            return [json.loads(line) for line in fh if line.strip()]


PHASE_KEYS = {"gen": "timing/gen_s", "prox": "timing/prox_s", "update": "timing/update_s"}
PHASE_KEYS["sync"] = "timing/sync_s"


def bench_training(steps: int, threads: int, model: str, repeats: int = 1) -> dict[str, float]:
    rows: dict[str, list[dict[str, Any]]] = {"hf": [], "vllm": []}
    for i in range(repeats):
        for backend in ("hf", "vllm"):
            run = _train(backend, steps, threads, model)[1:]  # the first step warms up
            for r in run:
                print(f"train run {i} {backend} step {r['step']}: " + ", ".join(
                    f"{k} {r[v]:.2f} s" for k, v in [("step", "timing/step_s"), *PHASE_KEYS.items()]
                ), flush=True)  # fmt: skip
            rows[backend] += run
    out: dict[str, float] = {}
    for backend, got in rows.items():
        out[f"{backend}_step_s"] = statistics.median(r["timing/step_s"] for r in got)
        for name, key in PHASE_KEYS.items():
            out[f"{backend}_train_{name}_s"] = statistics.median(r[key] for r in got)
    out["vllm_vs_hf_step_time"] = out["vllm_step_s"] / out["hf_step_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct")
    p.add_argument("--rounds", type=int, default=5, help="timed batches per engine (0: none)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of both engines")
    p.add_argument("--train-steps", type=int, default=3, help="0: skip the training runs")
    p.add_argument("--train-repeats", type=int, default=1, help="training runs per backend")
    args = p.parse_args(argv)
    from areal_m2po.engine.builtin_models import resolve_model_path

    model_path = resolve_model_path(args.model)
    results = bench_engines(model_path, args.rounds, args.threads) if args.rounds else {}
    if args.train_steps >= 2:
        results.update(
            bench_training(args.train_steps, args.threads, args.model, args.train_repeats)
        )
    print(f"threads={args.threads}")
    for k, v in results.items():
        print(f"{k}={v:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
