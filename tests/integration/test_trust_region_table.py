"""docs/m2po.md's table "Which loss terms act", measured: for each loss set-up, on-policy and
one version stale, with one and two minibatches per step, a two-step tiny run and the terms
whose statistic shows them acting at step 2.

A term acts when its statistic leaves its neutral value: the PPO clip when
``actor/clip_fraction`` > 0, the SAPO gate when ``sapo/gate_min`` < 0.99, the behaviour weight
when ``actor/behave_imp_weight_max`` > 1.01, the M2PO mask when ``m2po/masked_fraction`` > 0.
The learning rate (1e-2, :func:`tiny_runs.tiny_overrides`) moves the tiny policy far enough in
one optimizer step for each of them to show where it can act.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_runs import tiny_overrides

from areal_m2po.api.config_loader import load_config

# the loss set-ups of the table, as actor keys over the built-in demo's
SETUPS = {
    "clip, ratio vs behaviour": [
        "actor.recompute_logprob=false",
        "actor.use_decoupled_loss=false",
        "actor.m2_threshold=null",
    ],
    "clip, ratio vs proximal": [
        "actor.recompute_logprob=true",
        "actor.use_decoupled_loss=false",
        "actor.m2_threshold=0.04",
    ],
    "decoupled": [
        "actor.recompute_logprob=true",
        "actor.use_decoupled_loss=true",
        "actor.m2_threshold=0.04",
    ],
    "SAPO, ratio vs proximal": [
        "actor.use_sapo_loss=true",
        "actor.use_decoupled_loss=false",
        "actor.recompute_logprob=true",
        "actor.m2_threshold=0.04",
    ],
    "SAPO, ratio vs behaviour": [
        "actor.use_sapo_loss=true",
        "actor.use_decoupled_loss=false",
        "actor.recompute_logprob=false",
        "actor.m2_threshold=null",
    ],
}

# (set-up, staleness, minibatches) -> the terms that act; the table of docs/m2po.md
TABLE = {
    ("clip, ratio vs behaviour", 0, 1): set(),
    ("clip, ratio vs behaviour", 0, 2): {"clip"},
    ("clip, ratio vs behaviour", 1, 1): {"clip"},
    ("clip, ratio vs behaviour", 1, 2): {"clip"},
    ("clip, ratio vs proximal", 0, 1): set(),
    ("clip, ratio vs proximal", 0, 2): {"clip"},
    ("clip, ratio vs proximal", 1, 1): {"m2po"},
    ("clip, ratio vs proximal", 1, 2): {"clip", "m2po"},
    ("decoupled", 0, 1): set(),
    ("decoupled", 0, 2): {"clip"},
    ("decoupled", 1, 1): {"weight", "m2po"},
    ("decoupled", 1, 2): {"clip", "weight", "m2po"},
    ("SAPO, ratio vs proximal", 0, 1): set(),
    ("SAPO, ratio vs proximal", 0, 2): {"gate"},
    ("SAPO, ratio vs proximal", 1, 1): {"m2po"},
    ("SAPO, ratio vs proximal", 1, 2): {"gate", "m2po"},
    ("SAPO, ratio vs behaviour", 0, 1): set(),
    ("SAPO, ratio vs behaviour", 0, 2): {"gate"},
    ("SAPO, ratio vs behaviour", 1, 1): {"gate"},
    ("SAPO, ratio vs behaviour", 1, 2): {"gate"},
}


def _acting(m: dict[str, float]) -> set[str]:
    terms = {
        "clip": m.get("actor/clip_fraction", 0.0) > 0,
        "gate": m.get("sapo/gate_min", 1.0) < 0.99,
        "weight": m.get("actor/behave_imp_weight_max", 1.0) > 1.01,
        "m2po": m.get("m2po/masked_fraction", 0.0) > 0,
    }
    return {name for name, on in terms.items() if on}


def test_table_covers_every_cell():
    assert set(TABLE) == {(s, lag, k) for s in SETUPS for lag in (0, 1) for k in (1, 2)}


@pytest.mark.slow
@pytest.mark.parametrize(("setup", "staleness", "minibatches"), sorted(TABLE))
def test_loss_terms_that_act(setup: str, staleness: int, minibatches: int, tmp_path: Path):
    from areal_m2po.trainer.rl_trainer import run

    run_dir = tmp_path / "run"
    cfg = load_config(
        [
            *tiny_overrides(run_dir),
            *SETUPS[setup],
            f"rollout.staleness={staleness}",
            f"actor.ppo_n_minibatches={minibatches}",
        ]
    )
    assert run(cfg) == 0
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    step2 = [json.loads(x) for x in lines if x.strip()][-1]
    assert step2["step"] == 2
    assert _acting(step2) == TABLE[(setup, staleness, minibatches)]
