"""Reward-model training (python -m areal_m2po.train_rm) and scoring with a trained model.

* Preference data: every kind of bad record is one line naming file and line, before any model
  loads; a `datasets` directory loads like a file.
* A tiny reward model learns a separable synthetic preference (held-out pair accuracy > 0.9).
* The saved model is an ``AutoModelForSequenceClassification``: LearnedReward's scores equal a
  direct forward of ``from_pretrained`` on the same text, with left and right padding, and the
  scored position is the last non-pad token.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from areal_m2po.api.cli_args import ConfigError, RewardModelConfig, RWConfig
from areal_m2po.api.config_loader import load_config
from areal_m2po.dataset.preference import (
    load_preference_records,
    reward_model_text,
    tokenize_preference_pairs,
)
from areal_m2po.reward.reward_model import (
    LearnedReward,
    RunningMoments,
    forward_scores,
    load_reward_tokenizer,
    pad_sequences,
)
from areal_m2po.train_rm import main as train_rm_main


def _write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _separable_pairs(n: int, seed: int) -> list[dict[str, str]]:
    """The chosen answer ends in ' yes', the rejected in ' no': separable by the last words."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append(
            {"prompt": f"What is {a} + {b}?", "chosen": f"{a + b} yes", "rejected": f"{a + b} no"}
        )
    return rows


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return load_reward_tokenizer("builtin:tiny")


@pytest.fixture(scope="module")
def trained_rm(tmp_path_factory) -> Path:
    """A tiny reward model trained on separable pairs by the CLI; returns the run directory."""
    root = tmp_path_factory.mktemp("rm")
    train = _write_jsonl(root / "train.jsonl", _separable_pairs(64, seed=0))
    valid = _write_jsonl(root / "valid.jsonl", _separable_pairs(32, seed=1))
    status = train_rm_main(
        [
            "model.path=builtin:tiny",
            f"train_dataset.path={train}",
            f"--valid_dataset.path={valid}",
            "--output_dir",
            str(root / "run"),
            "total_train_epochs=3",
            "model.optimizer.lr=1e-3",
            "evaluator.freq_steps=null",
            "stats_logger.progress_bar=false",
            "stats_logger.console=false",
        ]
    )
    assert status == 0
    return root / "run"


# ---------------------------------------------------------------------------------------------
# learning
# ---------------------------------------------------------------------------------------------


def test_tiny_reward_model_learns_a_separable_preference(trained_rm: Path):
    lines = [json.loads(x) for x in (trained_rm / "metrics.jsonl").read_text().splitlines()]
    first, last = lines[0], lines[-1]
    assert first["step"] == 0 and "eval/accuracy" in first  # eval_at_start
    assert last["step"] == 12  # 64 pairs / 16 per step x 3 epochs
    assert last["eval/accuracy"] > 0.9
    assert last["eval/loss"] < first["eval/loss"]
    for key in (
        "train/loss",
        "train/accuracy",
        "train/margin",
        "train/mean_reward",
        "eval/n_pairs",
    ):
        assert key in last
    assert last["eval/n_pairs"] == 32
    assert (trained_rm / "config.yaml").is_file()


def test_saved_model_loads_as_sequence_classification(trained_rm: Path):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(trained_rm / "checkpoints" / "final")
    assert model.config.num_labels == 1
    assert model.config.pad_token_id is not None


def _rm_trainer(tmp_path: Path, name: str, **model_kw: object):
    from areal_m2po.api.cli_args import (
        EvaluatorConfig,
        MicroBatchSpec,
        OptimizerConfig,
        PreferenceDatasetConfig,
        RWModelConfig,
        StatsLoggerConfig,
    )
    from areal_m2po.trainer.rw_trainer import RWTrainer

    rows = _separable_pairs(12, seed=2)
    for i, row in enumerate(rows):  # a margin on some pairs only
        if i % 3 == 0:
            row["margin"] = 0.5
    data = _write_jsonl(tmp_path / "pairs.jsonl", rows)
    cfg = RWConfig(
        output_dir=str(tmp_path / name),
        total_train_steps=1,
        num_threads=1,
        center_rewards_coefficient=0.1,
        model=RWModelConfig(
            path="builtin:tiny",
            # plain SGD: the update is the gradient (Adam would magnify rounding in tiny ones)
            optimizer=OptimizerConfig(type="sgd", lr=0.5, beta1=0.0, gradient_clipping=0.0),
            mb_spec=MicroBatchSpec(**model_kw),  # type: ignore[arg-type]
        ),
        train_dataset=PreferenceDatasetConfig(path=str(data), batch_size=12, shuffle=False),
        evaluator=EvaluatorConfig(eval_at_start=False, eval_at_end=False, freq_steps=None),
        stats_logger=StatsLoggerConfig(console=False, progress_bar=False),
    )
    return RWTrainer(cfg)


def test_micro_batches_give_the_step_of_one_forward(tmp_path: Path):
    """model.mb_spec splits a step's pairs over the train engine's micro-batches (a pair's two
    texts together, margins with their pairs): the loss, metrics and updated weights are those
    of one forward over all pairs."""
    from areal_m2po.trainer.rw_trainer import collate_pairs

    whole = _rm_trainer(tmp_path, "whole", max_tokens_per_mb=None)  # one micro-batch
    split = _rm_trainer(tmp_path, "split", n_mbs=5, max_tokens_per_mb=None)  # 1 to 3 pairs
    initial = {k: v.clone() for k, v in whole.model.state_dict().items()}
    pairs = whole.loader.next_batch()[0]
    assert pairs == split.loader.next_batch()[0] and any("margin" in p for p in pairs)
    a = whole.train_step(pairs)
    b = split.train_step(pairs)
    batch = collate_pairs(pairs, split.tokenizer.pad_token_id)
    assert len(whole.engine.micro_batches(batch)) == 1
    assert sorted(len(mb["input_ids"]) for mb in split.engine.micro_batches(batch)) == [
        1,
        2,
        3,
        3,
        3,
    ]
    for key, value in a.items():
        assert b[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    want = whole.model.state_dict()
    moved = max(float((w - initial[k]).abs().max()) for k, w in want.items())
    assert moved > 1e-3  # the step changed the weights
    for name, w in split.model.state_dict().items():
        torch.testing.assert_close(w, want[name], rtol=1e-5, atol=1e-6, msg=name)
    whole.close()
    split.close()


# ---------------------------------------------------------------------------------------------
# scoring equals a direct forward of the saved model; padding side; scored position
# ---------------------------------------------------------------------------------------------

_TEXTS = [
    ("What is 12 + 30?", "42 yes"),
    ("What is 99 + 99? Reply with only the number.", "198 no"),
    ("What is 10 + 10?", "It is 20, I am quite sure about that one"),
]


def _direct_scores(path: Path, tokenizer) -> list[float]:
    """One unpadded sequence at a time through the saved model's own forward (HF pooling)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    out = []
    for prompt, completion in _TEXTS:
        text, special = reward_model_text(tokenizer, prompt, completion)
        enc = tokenizer(text, add_special_tokens=special, return_tensors="pt")
        with torch.no_grad():
            out.append(float(model(**enc).logits[0, 0]))
    return out


def test_learned_reward_equals_direct_forward(trained_rm: Path):
    path = trained_rm / "checkpoints" / "final"
    reward = LearnedReward(RewardModelConfig(path=str(path), batch_size=2), "cpu")
    expected = _direct_scores(path, reward.tokenizer)
    got = reward.raw_scores([p for p, _ in _TEXTS], [c for _, c in _TEXTS])
    assert got.tolist() == pytest.approx(expected, abs=1e-5)
    assert len(set(round(x, 4) for x in expected)) == 3  # three different scores


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_side_does_not_change_scores(trained_rm: Path, side: str):
    path = trained_rm / "checkpoints" / "final"
    reward = LearnedReward(RewardModelConfig(path=str(path)), "cpu")
    tok = reward.tokenizer
    expected = _direct_scores(path, tok)
    seqs = []
    for prompt, completion in _TEXTS:
        text, special = reward_model_text(tok, prompt, completion)
        seqs.append(tok(text, add_special_tokens=special)["input_ids"])
    ids, mask = pad_sequences(seqs, tok.pad_token_id, side)
    assert int(mask.sum(-1).min()) < ids.shape[1]  # some rows are padded
    with torch.no_grad():
        scores = forward_scores(reward.model, ids, mask)
    assert scores.tolist() == pytest.approx(expected, abs=1e-5)


def test_scored_position_is_the_last_non_pad_token(trained_rm: Path):
    """The head output at the last real token is the score; tokens after it (padding) do not
    matter, and the last real token does."""
    path = trained_rm / "checkpoints" / "final"
    reward = LearnedReward(RewardModelConfig(path=str(path)), "cpu")
    model, tok = reward.model, reward.tokenizer
    text, special = reward_model_text(tok, *_TEXTS[2])
    seq = tok(text, add_special_tokens=special)["input_ids"]
    short = seq[:-5]  # a shorter real sequence, right-padded to the same width
    ids, mask = pad_sequences([seq, short], tok.pad_token_id, "right")
    with torch.no_grad():
        scores = forward_scores(model, ids, mask)
        hidden = model.base_model(input_ids=ids[1:, : len(short)]).last_hidden_state
        head_at_last = float(model.score(hidden)[0, -1, 0])
        # garbage in the padded columns changes nothing
        junk = ids.clone()
        junk[1, len(short) :] = 5
        scores_junk = forward_scores(model, junk, mask)
        # a different last real token changes the score
        other = ids.clone()
        other[1, len(short) - 1] = 7
        scores_other = forward_scores(model, other, mask)
    assert float(scores[1]) == pytest.approx(head_at_last, abs=1e-5)
    assert float(scores_junk[1]) == pytest.approx(float(scores[1]), abs=1e-6)
    assert abs(float(scores_other[1]) - float(scores[1])) > 1e-4


# ---------------------------------------------------------------------------------------------
# normalisation and the mixed reward
# ---------------------------------------------------------------------------------------------


def test_running_moments_merge_equals_the_concatenation():
    gen = torch.Generator().manual_seed(0)
    chunks = [torch.randn(n, generator=gen, dtype=torch.float64) * 3 + 1 for n in (5, 1, 9)]
    moments = RunningMoments()
    for x in chunks:
        moments.update(float(x.numel()), float(x.mean()), float(((x - x.mean()) ** 2).sum()))
    allx = torch.cat(chunks)
    assert moments.count == 15
    assert moments.mean == pytest.approx(float(allx.mean()), abs=1e-12)
    assert moments.std == pytest.approx(float(allx.std(unbiased=False)), abs=1e-12)
    restored = RunningMoments()
    restored.load_state_dict(moments.state_dict())
    assert restored.state_dict() == moments.state_dict()


def test_rewards_mix_and_normalise(trained_rm: Path):
    path = str(trained_rm / "checkpoints" / "final")
    prompts, completions = [p for p, _ in _TEXTS], [c for _, c in _TEXTS]
    verifiable = torch.tensor([1.0, 0.0, 1.0])
    raw_reward = LearnedReward(RewardModelConfig(path=path, weight=2.0), "cpu")
    raw = raw_reward.raw_scores(prompts, completions)
    rewards, stats = raw_reward.rewards(prompts, completions, verifiable)
    assert rewards.tolist() == pytest.approx((2 * raw).tolist(), abs=1e-6)
    assert stats["reward/model_score"] == pytest.approx(float(raw.mean()), abs=1e-6)
    assert stats["reward/verifiable"] == pytest.approx(2 / 3)
    corr = torch.corrcoef(torch.stack([raw.double(), verifiable.double()]))[0, 1]
    assert stats["reward/model_verifiable_corr"] == pytest.approx(float(corr), abs=1e-6)

    mixed = LearnedReward(
        RewardModelConfig(path=path, norm="batch", norm_eps=0.0, verifiable_weight=0.5), "cpu"
    )
    rewards, _ = mixed.rewards(prompts, completions, verifiable)
    z = (raw.double() - raw.double().mean()) / raw.double().std(unbiased=False)
    assert rewards.tolist() == pytest.approx((z + 0.5 * verifiable).tolist(), abs=1e-5)

    running = LearnedReward(RewardModelConfig(path=path, norm="running", norm_eps=0.0), "cpu")
    running.rewards(prompts[:2], completions[:2], verifiable[:2])
    second, _ = running.rewards(prompts[2:], completions[2:], verifiable[2:])
    # after two calls the statistics are those of all three scores
    expected = (raw[2].double() - raw.double().mean()) / raw.double().std(unbiased=False)
    assert float(second[0]) == pytest.approx(float(expected), abs=1e-5)
    assert running.state_dict()["moments"]["count"] == 3


def test_reward_model_config_errors():
    with pytest.raises(ConfigError, match=r"^reward\.model\.path: must be set"):
        load_config(["reward.model.norm=batch"])
    with pytest.raises(ConfigError, match=r"^reward\.model\.norm: must be one of"):
        load_config(["reward.model.path=/x", "reward.model.norm=median"])
    with pytest.raises(ConfigError, match=r"^reward\.model\.weight: .*both 0"):
        load_config(["reward.model.path=/x", "reward.model.weight=0"])


# ---------------------------------------------------------------------------------------------
# preference data: bad records give one line naming file and line
# ---------------------------------------------------------------------------------------------

_GOOD = {"prompt": "p", "chosen": "a", "rejected": "b"}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"prompt": "p", "rejected": "b"}, "missing field 'chosen'"),
        ({"prompt": "p", "chosen": "", "rejected": "b"}, "field 'chosen' is empty"),
        ({"prompt": "p", "chosen": "a", "rejected": "  "}, "field 'rejected' is empty"),
        ({"prompt": "p", "chosen": 3, "rejected": "b"}, "field 'chosen' must be a string"),
        # fields are checked one by one, in order: the bad prompt before the missing chosen
        ({"prompt": 1, "rejected": "b"}, "field 'prompt' must be a string"),
        ({"prompt": "p", "chosen": "", "rejected": 2}, "field 'chosen' is empty"),
        ({"prompt": "p", "chosen": "a", "rejected": "a"}, "are the same text"),
        ({**_GOOD, "margin": "big"}, "field 'margin' must be a number"),
        (["not", "an", "object"], "expected a JSON object"),
    ],
)
def test_bad_record_names_file_and_line(tmp_path: Path, bad: object, message: str):
    path = _write_jsonl(tmp_path / "prefs.jsonl", [_GOOD, _GOOD, bad])
    with pytest.raises(ValueError) as info:
        load_preference_records(str(path))
    text = str(info.value)
    assert text.startswith(f"{path}:3: ")
    assert message in text
    assert "\n" not in text


def test_invalid_json_line_names_file_and_line(tmp_path: Path):
    path = tmp_path / "prefs.jsonl"
    path.write_text(json.dumps(_GOOD) + "\n{oops\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{path}:2: invalid JSON"):
        load_preference_records(str(path))


def test_pair_longer_than_max_length_names_file_and_line(tmp_path: Path, tiny_tokenizer):
    rows = [_GOOD, {"prompt": "p", "chosen": "a", "rejected": "x" * 200}]
    path = _write_jsonl(tmp_path / "prefs.jsonl", rows)
    records = load_preference_records(str(path))
    with pytest.raises(ValueError) as info:
        tokenize_preference_pairs(records, tiny_tokenizer, max_length=64)
    assert str(info.value).startswith(f"{path}:2: prompt + rejected is ")
    assert "longer than max_length=64" in str(info.value)
    # within the limit: token ids of the rendered chat text, margin kept when present
    ok = tokenize_preference_pairs(records[:1], tiny_tokenizer, max_length=64)
    text, special = reward_model_text(tiny_tokenizer, "p", "a")
    assert ok[0]["chosen_ids"] == tiny_tokenizer(text, add_special_tokens=special)["input_ids"]


def test_json_list_and_datasets_directory(tmp_path: Path):
    as_json = tmp_path / "prefs.json"
    as_json.write_text(json.dumps([_GOOD, {**_GOOD, "margin": 1}, {"prompt": "p"}]))
    with pytest.raises(ValueError, match=rf"^{as_json}: item 2: missing field 'chosen'"):
        load_preference_records(str(as_json))
    folder = tmp_path / "ds"
    folder.mkdir()
    _write_jsonl(folder / "train.jsonl", [_GOOD, {**_GOOD, "margin": 0.5}])
    records = load_preference_records(str(folder), split="train")
    assert [r["chosen"] for r in records] == ["a", "a"]
    assert "margin" not in records[0] and records[1]["margin"] == 0.5


def test_cli_bad_data_exits_2_before_the_model_loads(tmp_path: Path, capsys):
    path = _write_jsonl(tmp_path / "prefs.jsonl", [_GOOD, {"prompt": "p", "rejected": "b"}])
    unloadable = tmp_path / "model"  # passes the start-up path check, fails any load
    unloadable.mkdir()
    (unloadable / "config.json").write_text("not json")
    status = train_rm_main(
        [
            f"model.path={unloadable}",  # never reached: the data fails first
            "tokenizer_path=builtin:tiny",
            f"train_dataset.path={path}",
            f"output_dir={tmp_path / 'run'}",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err == [
        f"error: {path}:2: missing field 'chosen' (a pair needs ('prompt', 'chosen', 'rejected'))"
    ]
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# CLI and config
# ---------------------------------------------------------------------------------------------


def test_cli_help_print_config_and_errors(capsys, tmp_path: Path):
    assert train_rm_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m areal_m2po.train_rm")
    assert "center_rewards_coefficient" in out and "train_dataset.path" in out

    forms = [
        ["--max_length=77", "--model.path=builtin:tiny"],
        ["--max_length", "77", "--model.path", "builtin:tiny"],
        ["max_length=77", "model.path=builtin:tiny"],
    ]
    printed = []
    for form in forms:
        assert train_rm_main([*form, "--print-config"]) == 0
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] == printed[2]
    assert "max_length: 77" in printed[0]

    assert train_rm_main(["model.pth=x"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("error: model.pth: unknown key 'model.pth' (did you mean 'model.path'?)")
    assert train_rm_main(["model.path=builtin:tiny"]) == 2
    assert "train_dataset.path: must be set" in capsys.readouterr().err
    assert train_rm_main(["center_rewards_coefficient=-1", "train_dataset.path=x.jsonl"]) == 2
    assert "center_rewards_coefficient: must be >= 0" in capsys.readouterr().err

    yaml_file = tmp_path / "rm.yaml"
    yaml_file.write_text("max_length: 33\nmodel:\n  optimizer:\n    lr: 3.0e-4\n")
    cfg = load_config(["--config", str(yaml_file), "seed=5"], RWConfig)
    assert (cfg.max_length, cfg.model.optimizer.lr, cfg.seed) == (33, 3e-4, 5)
    assert RWConfig(max_length=12).max_length == 12


def test_docs_list_every_train_rm_key():
    from areal_m2po.api.config_loader import leaf_keys

    text = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    region = text.split("BEGIN GENERATED RW REFERENCE", 1)[1].split("END GENERATED RW", 1)[0]
    missing = [k for k in leaf_keys(RWConfig) if f"| `{k}` |" not in region]
    assert not missing


# ---------------------------------------------------------------------------------------------
# the learned reward in the PPO loop
# ---------------------------------------------------------------------------------------------


def _ppo_config(tmp_path: Path, rm_path: Path, steps: int, **reward_model: object):
    from areal_m2po.api.cli_args import (
        ActorConfig,
        CriticConfig,
        DatasetConfig,
        EvaluatorConfig,
        GenerationConfig,
        NormConfig,
        OptimizerConfig,
        PPOConfig,
        RecoverConfig,
        RewardConfig,
        RolloutConfig,
        StatsLoggerConfig,
    )

    return PPOConfig(
        seed=3,
        output_dir=str(tmp_path / "ppo"),
        total_train_steps=steps,
        actor=ActorConfig(
            path="builtin:tiny",
            m2_threshold=0.04,
            use_decoupled_loss=True,
            kl_ctl=0.1,
            adv_norm=NormConfig(mean_level="batch", std_level="batch"),
            optimizer=OptimizerConfig(lr=3e-3),
        ),
        critic=CriticConfig(enabled=True, path="builtin:tiny"),
        gconfig=GenerationConfig(n_samples=4, max_new_tokens=8),
        rollout=RolloutConfig(staleness=1),
        train_dataset=DatasetConfig(batch_size=4),
        valid_dataset=DatasetConfig(split="test", batch_size=8, max_samples=8, shuffle=False),
        reward=RewardConfig(model=RewardModelConfig(path=str(rm_path), **reward_model)),
        evaluator=EvaluatorConfig(freq_steps=None, eval_at_start=False, eval_at_end=True),
        recover=RecoverConfig(mode="auto", freq_steps=1),
        stats_logger=StatsLoggerConfig(console=False, progress_bar=False),
    )


def test_ppo_loop_scores_equal_a_direct_forward_of_the_saved_model(tmp_path, trained_rm: Path):
    from areal_m2po.trainer.rl_trainer import RLTrainer

    rm_path = trained_rm / "checkpoints" / "final"
    trainer = RLTrainer(_ppo_config(tmp_path, rm_path, steps=1, batch_size=5))
    seen: list[tuple[list[str], list[str], torch.Tensor]] = []
    real = trainer.learned_reward.raw_scores

    def spy(prompts, completions):
        out = real(prompts, completions)
        seen.append((list(prompts), list(completions), out))
        return out

    trainer.learned_reward.raw_scores = spy
    try:
        batch, info = trainer.rollout.generate_batch()
    finally:
        trainer.close()
    # one reward-model call per group (groups score concurrently: put them in batch order)
    decoded = trainer.rollout.engine.generator.decode_completions(batch)
    n = trainer.config.gconfig.n_samples
    order = [decoded[g : g + n] for g in range(0, len(decoded), n)]
    seen.sort(key=lambda s: order.index(s[1]))
    assert len(seen) == trainer.config.train_dataset.batch_size
    prompts = [p for s in seen for p in s[0]]
    completions = [c for s in seen for c in s[1]]
    scores = torch.cat([s[2] for s in seen])
    assert completions == decoded
    assert all(p.startswith("What is ") and "<|im_start|>" not in p for p in prompts)
    # raw scores (no norm, weight 1, verifiable_weight 0) are the rewards the batch trains on
    assert batch["rewards"].tolist() == pytest.approx(scores.tolist(), abs=1e-6)
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(rm_path).eval()
    tok = trainer.learned_reward.tokenizer
    direct = []
    for p, c in zip(prompts, completions):
        text, special = reward_model_text(tok, p, c)
        enc = tok(text, add_special_tokens=special, return_tensors="pt")
        with torch.no_grad():
            direct.append(float(model(**enc).logits[0, 0]))
    assert scores.tolist() == pytest.approx(direct, abs=1e-5)
    assert info["reward/model_score"] == pytest.approx(sum(direct) / len(direct), abs=1e-5)


def test_ppo_with_learned_reward_critic_kl_m2po_and_resume(tmp_path, trained_rm: Path):
    """Two steps of PPO on the learned reward alone (running-normalised) with a critic, a KL
    penalty and M2PO on one-step-stale rollouts; then a resumed third step continues the
    running normaliser from the checkpoint."""
    from areal_m2po.trainer.rl_trainer import RLTrainer

    rm_path = trained_rm / "checkpoints" / "final"
    cfg = _ppo_config(tmp_path, rm_path, steps=2, norm="running")
    trainer = RLTrainer(cfg)
    try:
        trainer.train()
    finally:
        trainer.close()
    # 3 rollout batches of 16 samples (staleness 1 generates one ahead)
    assert trainer.learned_reward.moments.count == 48
    lines = [json.loads(x) for x in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
    for r in lines:
        for key in (
            "reward/model_score",
            "reward/verifiable",
            "reward/model_verifiable_corr",
            "critic/value_loss",
            "actor/kl_ref",
            "m2po/masked_fraction",
        ):
            assert key in r, key
        assert abs(r["reward/mean"]) < 3  # normalised scores, not raw ones
    assert "eval/accuracy" in lines[-1]

    cfg3 = _ppo_config(tmp_path, rm_path, steps=3, norm="running")
    resumed = RLTrainer(cfg3)
    try:
        resumed.train()
    finally:
        resumed.close()
    # restored 48 from the step-2 checkpoint, then one more batch of 16
    assert resumed.learned_reward.moments.count == 64


def test_shipped_rlhf_configs_load():
    from areal_m2po.api.cli_args import PPOConfig
    from areal_m2po.api.config_loader import config_to_yaml

    configs = Path(__file__).resolve().parents[2] / "configs" / "rlhf"
    rm = load_config(["--config", str(configs / "reward_model.yaml")], RWConfig)
    assert rm.center_rewards_coefficient == 0.01 and rm.valid_dataset is not None
    ppo = load_config(["--config", str(configs / "ppo.yaml")], PPOConfig)
    assert ppo.critic.enabled and ppo.actor.kl_ctl > 0 and ppo.actor.m2_threshold == 0.04
    assert ppo.reward.model is not None and ppo.reward.model.verifiable_weight == 0.0
    # the PPO config reads the model where the reward-model config writes it
    assert ppo.reward.model.path == f"{rm.output_dir}/checkpoints/final"
    assert config_to_yaml(load_config(["--config", str(configs / "ppo.yaml")])) == config_to_yaml(
        ppo
    )
