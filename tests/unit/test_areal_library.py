"""AReaL's library functions under ``areal_m2po.areal`` that AReaL's own vendored tests
(tests/areal_vendored) do not reach, against numbers worked out by hand; and AReaL's reward
paths in ``reward.path``."""

from __future__ import annotations

import math

import pytest
import torch

from areal_m2po.api.cli_args import ConfigError
from areal_m2po.areal.utils.data import KLEstimator, pack_tensor_dict
from areal_m2po.areal.utils.dynamic_import import import_from_string
from areal_m2po.areal.utils.functional import masked_normalization, reward_overlong_penalty
from areal_m2po.areal.utils.hf_utils import apply_chat_template
from areal_m2po.reward import load_reward_fn


def test_reward_overlong_penalty_by_hand() -> None:
    """max_response_length 10, overlong_tokens 4, factor 1: lengths up to 6 keep their
    reward; 8 loses (8 - 6) / 4 = 0.5; 10 loses 1."""
    mask = torch.zeros(3, 10)
    for row, n in enumerate((5, 8, 10)):
        mask[row, :n] = 1
    rewards = torch.tensor([1.0, 1.0, 0.0])
    data = {"rewards": rewards, "input_ids": torch.zeros(3, 10), "loss_mask": mask}
    out = reward_overlong_penalty(
        data, overlong_tokens=4, overlong_penalty_factor=1.0, max_response_length=10
    )
    assert out is data and out["rewards"] is rewards  # in place, as AReaL's
    torch.testing.assert_close(rewards, torch.tensor([1.0, 0.5, -1.0]))


def test_masked_normalization_by_hand() -> None:
    """Masked values 1, 2, 3 (4 masked out): mean 2, population std sqrt(2/3)."""
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[True, True], [True, False]])
    out = masked_normalization(x, mask, eps=0.0)
    std = math.sqrt(2 / 3)
    expected = torch.tensor([[-1 / std, 0.0], [1 / std, -2 / std]])  # x*mask - mean outside
    torch.testing.assert_close(out, expected)
    assert out.dtype == torch.float32
    unbiased = masked_normalization(x, mask, unbiased=True, eps=0.0)
    torch.testing.assert_close(unbiased[0, 0], torch.tensor(-1.0))  # sample std is 1
    per_row = masked_normalization(torch.tensor([[1.0, 3.0], [2.0, 6.0]]), dim=1, eps=0.0)
    torch.testing.assert_close(per_row, torch.tensor([[-1.0, 1.0], [-1.0, 1.0]]))


@pytest.mark.parametrize(
    ("name", "value"),
    [("k1", 0.5), ("k2", 0.125), ("k3", math.exp(-0.5) - 1 + 0.5)],
)
def test_kl_estimator_by_hand(name: str, value: float) -> None:
    est = KLEstimator(name)
    out = est(torch.tensor([-1.0, 30.0]), torch.tensor([-1.5, 0.0]))
    assert out.dtype == torch.float32
    assert out[0].item() == pytest.approx(value, rel=1e-6)
    assert out[1].item() <= 10.0  # clamped
    assert KLEstimator(name, apply_clamp=False)(torch.tensor([30.0]), torch.tensor([0.0])) > 10
    with pytest.raises(ValueError, match="Invalid KL estimator: k4"):
        KLEstimator("k4")


def test_pack_tensor_dict_by_hand() -> None:
    data = {
        "attention_mask": torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool),
        "input_ids": torch.tensor([[5, 6, 0], [7, 8, 9]]),
        "rewards": torch.tensor([1.0, 2.0]),
    }
    packed = pack_tensor_dict(data)
    assert packed["input_ids"].tolist() == [5, 6, 7, 8, 9]
    assert packed["cu_seqlens"].tolist() == [0, 2, 5] and packed["cu_seqlens"].dtype == torch.int32
    assert packed["max_seqlen"] == 3 and packed["rewards"] is data["rewards"]


def test_import_from_string() -> None:
    assert import_from_string("math.sqrt") is math.sqrt
    with pytest.raises(ValueError, match="Expected format"):
        import_from_string("sqrt")
    with pytest.raises(ImportError, match="Failed to import module 'no_such_mod'"):
        import_from_string("no_such_mod.x")
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        import_from_string("math.nope")


def test_apply_chat_template_gives_a_list() -> None:
    class DictTokenizer:  # transformers >= 5 returns a mapping of input_ids
        def apply_chat_template(self, messages, tokenize=True, **kwargs):
            return {"input_ids": (1, 2, 3)} if tokenize else "text"

    assert apply_chat_template(DictTokenizer(), [], tokenize=True) == [1, 2, 3]
    assert apply_chat_template(DictTokenizer(), [], tokenize=False) == "text"


def test_areals_own_reward_paths_load_here() -> None:
    """AReaL's example configs name ``areal.reward.gsm8k.gsm8k_reward_fn``."""
    fn = load_reward_fn("areal.reward.gsm8k.gsm8k_reward_fn")
    assert fn.__name__ == "gsm8k_reward_fn"
    assert fn("q", "\\boxed{12}", [], [], "12") == 1.0
    with pytest.raises(ConfigError, match=r"^reward\.path: .*AReaL is not installed"):
        load_reward_fn("areal.reward.clevr_count_70k.clevr_count_70k_reward_fn")
