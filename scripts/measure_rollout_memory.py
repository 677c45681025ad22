"""Resident memory of the trainer process with a sync-mode and an async-mode rollout.

Sync mode keeps the behaviour policy in process (the in-process engine's copy of the model);
async mode hands weights to rollout servers through disk and keeps none. Each mode is built in
a fresh subprocess (``RLTrainer(cfg)``, no training; the async run names a server address it
never contacts, so no server starts) and reports ``VmRSS`` from ``/proc/self/status`` after
construction, and its peak ``VmHWM`` after one weight hand-over to the engine (async: the
safetensors write, with no server to load it). The difference is the memory async mode no
longer holds, next to the size of the policy's parameters.

    python scripts/measure_rollout_memory.py                       # SmolLM2-135M (fp32)
    python scripts/measure_rollout_memory.py --model builtin:tiny  # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, sys, tempfile
from areal_m2po.api.config_loader import load_config
from areal_m2po.trainer.rl_trainer import RLTrainer

def status(key):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)

mode, model, out = sys.argv[1], sys.argv[2], sys.argv[3]
overrides = [f"actor.path={model}", f"output_dir={out}", "actor.kl_ctl=0", "num_threads=1",
             f"rollout.mode={mode}", "rollout.staleness=0", "stats_logger.progress_bar=false"]
if mode == "async":
    overrides.append("rollout.server_addrs=[127.0.0.1:9]")
trainer = RLTrainer(load_config(overrides))
rss = status("VmRSS")
params = sum(p.numel() * p.element_size() for p in trainer.actor_engine.unwrapped.parameters())
engine = trainer.rollout.engine
tensors = trainer.actor_engine.full_tensors()
if mode == "async":  # the write the servers would load (no server: write only)
    from areal_m2po.rollout.common.weight_files import write_weights
    write_weights(dict(tensors), engine.weights_root, 1, engine.model_config)
else:
    engine.update_weights_from_tensors(tensors, 1)
print(json.dumps({"rss": rss, "hwm": status("VmHWM"), "params": params}))
"""


def measure(mode: str, model: str) -> dict[str, int]:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", WANDB_MODE="disabled")
    with tempfile.TemporaryDirectory(prefix=f"areal_m2po_mem_{mode}_") as out:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, mode, model, out],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, dict[str, int]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="builtin:smollm2-135m-instruct")
    args = p.parse_args(argv)
    result = {mode: measure(mode, args.model) for mode in ("sync", "async")}
    mib = 1 << 20
    params = result["sync"]["params"]
    print(f"model {args.model}: parameters {params / mib:.1f} MiB")
    for mode, r in result.items():
        print(f"  {mode:5s}: VmRSS after build {r['rss'] / mib:8.1f} MiB, "
              f"VmHWM after a weight hand-over {r['hwm'] / mib:8.1f} MiB")  # fmt: skip
    saved = result["sync"]["rss"] - result["async"]["rss"]
    print(f"  async keeps {saved / mib:.1f} MiB less resident after build "
          f"({saved / params:.2f}x the parameters)")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
