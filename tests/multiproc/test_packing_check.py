"""The one-time packing check of a sharded (fsdp2) engine is a collective: every rank takes part
before its first forward, also a rank that holds no micro-batch or nothing to score (two gloo
processes; before the fix, a rank without a micro-batch skipped the check and the others waited
in it forever, which the timeout here turns into a failure)."""

from __future__ import annotations

import re
import subprocess

import psutil
import pytest
from procs import launch_command, popen

pytestmark = pytest.mark.multiproc

WORKER = """
import sys
import torch
from accelerate import Accelerator
from areal_m2po.api.cli_args import MicroBatchSpec, TrainEngineConfig
from areal_m2po.engine.builtin_models import build_tiny_llama
from areal_m2po.engine.train_engine import HFTrainEngine

case = sys.argv[1]
acc = Accelerator(cpu=True)
rank = acc.process_index
g = torch.Generator().manual_seed(0)
ids = torch.randint(3, 97, (4, 12), generator=g)
attn = torch.ones(4, 12, dtype=torch.bool)
loss = torch.zeros(4, 12, dtype=torch.bool)
loss[:, 6:] = True
batch = {"input_ids": ids, "attention_mask": attn, "loss_mask": loss,
         "advantages": torch.randn(4, 12, generator=g) * loss}
if rank == 1 and case == "no_rows":
    batch = {k: v[:0] for k, v in batch.items()}
if rank == 1 and case == "nothing_to_score":
    batch["loss_mask"] = torch.zeros_like(loss)
model = build_tiny_llama(97, 0, hidden_size=32, intermediate_size=64,
                         max_position_embeddings=64)
cfg = TrainEngineConfig(path="unused", backend="fsdp2", mb_spec=MicroBatchSpec(packing=True))
eng = HFTrainEngine(cfg, acc, 1, model=model)
logp, _ = eng.forward_tokens(batch, 1.0)
verdict = eng.checks.packing_ok
weight = lambda mb: float(mb["loss_mask"].sum())
loss_fn = lambda lp, ent, mb: (-(lp * mb["advantages"]).sum(), {})
stats, _ = eng.train_batch(batch, loss_fn, weight)
print(f"RESULT {rank} {verdict} {eng.checks.packing_ok} {stats['grad_norm']:.6f}", flush=True)
"""


@pytest.mark.parametrize("case", ["no_rows", "nothing_to_score"])
def test_every_rank_takes_part_in_the_packing_check(tmp_path, case: str) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    proc = popen([*launch_command(2), str(worker), case], tmp_path)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        # the launcher starts each rank in a session of its own: kill the whole tree
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the ranks hung in the packing check:\n{out[-3000:]}")
    assert proc.returncode == 0, out[-4000:]
    # the two ranks share one pipe: their lines may run into each other
    results = sorted(list(r) for r in re.findall(r"RESULT (\d) (\S+) (\S+) ([\d.]+)", out))
    assert [r[0] for r in results] == ["0", "1"], out[-3000:]
    # both ranks reach the same verdict, from rank 0's rows, and the same step
    assert results[0][1:] == results[1][1:] == [results[0][1], "True", results[0][3]]
    assert results[0][1] == "True"
