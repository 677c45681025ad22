"""AReaL's loss-function contract (areal_m2po.algo.areal_compat): the signatures, the per-token
``stat`` tensors, 2-D padded and 1-D packed inputs (``cu_seqlens``) and the refused arguments.

The contract is AReaL's ``areal/utils/functional/functional.py`` (areal-project/AReaL at
12372a8b22d3964434452b3269d522e247f5b944). Expected values come from hand derivations in the
comments and from ``_Ref``, a plain per-sequence restatement of AReaL's formulas written here
(one sequence at a time, no code shared with the package), compared at EVERY position of every
stat tensor, masked-out ones included.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import pytest
import torch

from areal_m2po.api.cli_args import RejectionSamplingConfig
from areal_m2po.areal.trainer.ppo import actor as areal_actor
from areal_m2po.areal.trainer.ppo.actor import _apply_m2po_masking
from areal_m2po.areal.utils.functional import functional as areal_compat
from areal_m2po.areal.utils.functional.functional import (
    ContractError,
    cispo_loss_fn,
    ppo_actor_loss_fn,
    ppo_critic_loss_fn,
    sapo_loss_fn,
)

F64 = torch.float64

# ---------------------------------------------------------------------------------------------
# signatures
# ---------------------------------------------------------------------------------------------

AREAL_SIGNATURES = {
    "ppo_actor_loss_fn": [
        ("logprobs", inspect.Parameter.empty),
        ("proximal_logprobs", inspect.Parameter.empty),
        ("old_logprobs", inspect.Parameter.empty),
        ("advantages", inspect.Parameter.empty),
        ("eps_clip", inspect.Parameter.empty),
        ("loss_mask", inspect.Parameter.empty),
        ("eps_clip_higher", None),
        ("c_clip", None),
        ("rejection_sampling", None),
        ("importance_sampling_level", "token"),
        ("cu_seqlens", None),
    ],
    "sapo_loss_fn": [
        ("logprobs", inspect.Parameter.empty),
        ("old_logprobs", inspect.Parameter.empty),
        ("advantages", inspect.Parameter.empty),
        ("tau_pos", inspect.Parameter.empty),
        ("tau_neg", inspect.Parameter.empty),
        ("loss_mask", inspect.Parameter.empty),
        ("importance_sampling_level", "token"),
        ("cu_seqlens", None),
    ],
    "cispo_loss_fn": [
        ("logprobs", inspect.Parameter.empty),
        ("proximal_logprobs", inspect.Parameter.empty),
        ("advantages", inspect.Parameter.empty),
        ("eps_clip", inspect.Parameter.empty),
        ("loss_mask", inspect.Parameter.empty),
        ("eps_clip_higher", None),
        ("old_logprobs", None),
        ("rejection_sampling", None),
        ("cu_seqlens", None),
    ],
    "ppo_critic_loss_fn": [
        ("value", inspect.Parameter.empty),
        ("old_value", inspect.Parameter.empty),
        ("target_value", inspect.Parameter.empty),
        ("value_eps_clip", inspect.Parameter.empty),
        ("loss_mask", None),
        ("loss_fn_type", "mse"),
    ],
    "_apply_m2po_masking": [
        ("old_logp", inspect.Parameter.empty),
        ("prox_logp", inspect.Parameter.empty),
        ("loss_mask", inspect.Parameter.empty),
        ("m2_threshold", inspect.Parameter.empty),
    ],
    "_get_m2po_loss_mask": [
        ("sorted_m2", inspect.Parameter.empty),
        ("m2_threshold", inspect.Parameter.empty),
    ],
    "dpo_pair_logratios": [
        ("logprobs", inspect.Parameter.empty),
        ("ref_logprobs", inspect.Parameter.empty),
        ("cu_seqlens", inspect.Parameter.empty),
        ("loss_mask", inspect.Parameter.empty),
        ("valid_pairs", inspect.Parameter.empty),
    ],
    "dpo_preference_loss": [
        ("logits", inspect.Parameter.empty),
        ("beta", inspect.Parameter.empty),
        ("loss_type", "sigmoid"),
    ],
}
KEYWORD_ONLY = {"dpo_preference_loss": {"beta", "loss_type"}}


def _areal(name):
    """AReaL's function ``name`` where AReaL has it: the M2PO helpers in its actor module,
    the others in ``areal.utils.functional``."""
    return getattr(areal_actor if name.startswith("_") else areal_compat, name)


@pytest.mark.parametrize("name", sorted(AREAL_SIGNATURES))
def test_same_positional_and_keyword_arguments_as_areal(name):
    params = inspect.signature(_areal(name)).parameters.values()
    got = [(p.name, p.default) for p in params]
    assert got == AREAL_SIGNATURES[name]
    keyword_only = KEYWORD_ONLY.get(name, set())
    for p in params:
        want = (
            inspect.Parameter.KEYWORD_ONLY
            if p.name in keyword_only
            else inspect.Parameter.POSITIONAL_OR_KEYWORD
        )
        assert p.kind is want, p.name


def test_the_compat_layer_offers_areals_loss_names():
    public = set(areal_compat.__all__) | set(areal_actor.__all__)
    assert set(AREAL_SIGNATURES) <= public


def test_unknown_keyword_is_a_type_error():
    x = torch.zeros(1, 2)
    m = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(TypeError, match="m2po_mask"):
        ppo_actor_loss_fn(x, x, x, x, 0.2, m, m2po_mask=m)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="loss_agg_mode"):
        sapo_loss_fn(x, x, x, 1.0, 1.0, m, loss_agg_mode="token-mean")  # type: ignore[call-arg]


# ---------------------------------------------------------------------------------------------
# the independent reference: AReaL's formulas, one sequence at a time
# ---------------------------------------------------------------------------------------------


@dataclass
class _RS:
    level: str = "token"
    action: str = "mask"
    upper: float = 1.5
    lower: float | None = None  # metric "ratio", agg "mean" (geometric at sequence level)


def _bounded(x: torch.Tensor, rs: _RS) -> torch.Tensor:
    ok = x <= rs.upper
    return ok & (x >= rs.lower) if rs.lower is not None else ok


def _ref_rejection(prox, old, m, rs: _RS | None):
    """(keep, weight shown, affected count) of one sequence under AReaL's rejection sampling."""
    if rs is None:
        return m, None, 0
    lw = torch.where(m, prox - old, 0.0)
    if rs.level == "token":
        w = torch.exp(prox - old)
    else:
        w = torch.exp(lw.sum() / max(int(m.sum()), 1)).expand_as(prox)
    if rs.action == "mask":
        inb = _bounded(w, rs) if rs.level == "token" else _bounded(w[:1], rs).expand_as(m)
        keep = m & inb
        return keep, torch.where(keep, w, 0.0), int((m & ~inb).sum())
    if rs.level == "token":
        out = w.clamp(rs.lower or 0.0, rs.upper)
    else:
        out = w if bool(_bounded(w[:1], rs)) else w.clamp(rs.lower or 0.0, rs.upper)
    return m, torch.where(m, out, 0.0), int((m & (out != w)).sum())


def _ref_ppo_seq(lp, prox, old, adv, m, eps, eps_hi, c_clip, rs, level):
    """AReaL's PPO on one sequence: (sum of kept token losses, per-token stats)."""
    keep, bw, affected = _ref_rejection(prox, old, m, rs)
    if level == "token":
        r = torch.where(m, torch.exp(lp - prox), 0.0)
        a = adv
    else:
        n = max(int(keep.sum()), 1)
        r = torch.where(keep, torch.exp(torch.where(keep, lp - prox, 0.0).sum() / n), 0.0)
        a = torch.where(keep, torch.where(keep, adv, 0.0).sum() / n, 0.0)
    pg1 = -a * r
    pg2 = -a * r.clamp(1 - eps, 1 + (eps if eps_hi is None else eps_hi))
    clip = pg1.detach() < pg2.detach()
    pg = torch.maximum(pg1, pg2)
    dual = torch.zeros_like(clip)
    if c_clip is not None:
        pg3 = torch.sign(a) * c_clip * a
        dual = pg3.detach() < pg.detach()
        pg = torch.minimum(pg, pg3)
    if bw is not None:
        pg = pg * bw
    stats = {
        "loss": pg.detach(),
        "importance_weight": r.detach(),
        "approx_kl": (lp - prox).detach(),
        "clip_mask": clip & m,
        "dual_clip_mask": dual & m,
    }
    if bw is not None:
        bmask = (bw > 0) & keep
        stats.update(
            behave_imp_weight=bw,
            behave_mask=bmask,
            behave_approx_kl=torch.where(bmask, prox - old, 0.0),
        )
    return torch.where(keep, pg, 0.0).sum(), stats, keep, affected


def _ref_ppo(seqs, eps, eps_hi=None, c_clip=None, rs=None, level="token"):
    """AReaL's ppo_actor_loss_fn over sequences ``[(lp, prox, old, adv, m), ...]``: the loss
    and the stats concatenated in sequence order."""
    total, parts, keeps, affected = 0.0, [], [], 0
    for lp, prox, old, adv, m in seqs:
        s, st, keep, aff = _ref_ppo_seq(lp, prox, old, adv, m, eps, eps_hi, c_clip, rs, level)
        total, affected = total + s, affected + aff
        parts.append(st)
        keeps.append(keep)
    n_mask = sum(int(x[4].sum()) for x in seqs)
    stats = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    n_tok = sum(x[0].numel() for x in seqs)
    n_valid = int(torch.cat(keeps).sum())
    stats.update(n_total_tokens=float(n_tok), n_valid_tokens=float(n_valid))
    stats.update(n_masked_tokens=float(n_tok - n_valid))
    if rs is not None:
        stats["filtered_fraction"] = affected / max(n_mask, 1)
    return total / max(n_mask, 1), stats


def _ref_sapo(seqs, tau_pos, tau_neg, level="token"):
    total, parts = 0.0, []
    for lp, old, adv, m in seqs:
        log_r = lp - old
        if level == "token":
            r, a = torch.exp(log_r), adv
        else:
            n = max(int(m.sum()), 1)
            r = torch.where(m, torch.exp(torch.where(m, log_r, 0.0).sum() / n), 0.0)
            a = torch.where(m, torch.where(m, adv, 0.0).sum() / n, 0.0)
        pos = 4.0 / tau_pos * torch.sigmoid(tau_pos * (r - 1))
        neg = 4.0 / tau_neg * torch.sigmoid(tau_neg * (r - 1))
        gate = torch.where(a > 0, pos, neg)
        pg = -gate * a
        total = total + torch.where(m, pg, 0.0).sum()
        parts.append(
            {
                "loss": pg.detach(),
                "importance_weight": r.detach(),
                "approx_kl": log_r.detach(),
                "sapo_soft_gate": gate.detach(),
                "sapo_scaled_gate_pos": pos.detach(),
                "sapo_scaled_gate_neg": neg.detach(),
            }
        )
    n_mask = sum(int(x[3].sum()) for x in seqs)
    return total / max(n_mask, 1), {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


# ---------------------------------------------------------------------------------------------
# inputs in the two layouts
# ---------------------------------------------------------------------------------------------

LENGTHS = [5, 2, 7, 1, 4]


def _sequences(seed: int, n_inputs: int = 4) -> list[list[torch.Tensor]]:
    """Per sequence: n_inputs float64 tensors (log-probs near -1, advantages of both signs)
    and a bool mask with a masked prompt-like head."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(LENGTHS):
        lp = -1.0 + 0.4 * torch.randn(n, generator=g, dtype=F64)
        prox = lp + 0.25 * torch.randn(n, generator=g, dtype=F64)
        old = prox + 0.35 * torch.randn(n, generator=g, dtype=F64)
        adv = torch.randn(n, generator=g, dtype=F64)
        m = torch.rand(n, generator=g) < 0.8
        m[0] = i % 2 == 1  # some sequences start with a masked token
        out.append([lp, prox, old, adv][:n_inputs] + [m])
    out[3][-1][:] = False  # one sequence without any valid token
    return out


def _packed(seqs):
    cols = list(zip(*seqs, strict=True))
    cu = torch.tensor([0, *torch.cumsum(torch.tensor(LENGTHS), 0).tolist()], dtype=torch.int32)
    return [torch.cat(c) for c in cols], cu


def _padded(seqs):
    """[B, T] rows (padding: log-prob 0, mask False) and the caller-order index of each real
    token, to compare with the reference's concatenation."""
    width = max(LENGTHS)
    cols = []
    for c in zip(*seqs, strict=True):
        fill = False if c[0].dtype == torch.bool else 0.0
        rows = [torch.cat([x, torch.full((width - x.numel(),), fill, dtype=x.dtype)]) for x in c]
        cols.append(torch.stack(rows))
    real = torch.stack([torch.arange(width) < n for n in LENGTHS])
    return cols, real


def _with_grad(x: torch.Tensor) -> torch.Tensor:
    return x.clone().requires_grad_(True)


def _assert_stats(got: dict, want: dict, select=None) -> None:
    for key, value in want.items():
        assert key in got, key
        if isinstance(value, float):
            assert got[key] == pytest.approx(value), key
            continue
        g = got[key] if select is None else got[key][select]
        assert g.shape == value.shape, key
        if value.dtype == torch.bool:
            assert g.dtype == torch.bool and torch.equal(g, value), key
        else:
            torch.testing.assert_close(g.to(F64), value, rtol=1e-9, atol=1e-12, msg=key)


PPO_CASES = [
    {"level": "token"},
    {"level": "sequence"},
    {"level": "token", "c_clip": 3.0, "eps_hi": 0.28},
    {"level": "token", "rs": _RS("token", "mask", 1.3, 0.8)},
    {"level": "token", "rs": _RS("token", "clamp", 1.2, 0.9)},
    {"level": "sequence", "rs": _RS("sequence", "mask", 1.1, 0.9)},
    {"level": "sequence", "rs": _RS("sequence", "clamp", 1.05)},
    {"level": "sequence", "rs": _RS("token", "mask", 1.3)},
]


def _rs_arg(rs: _RS | None):
    if rs is None:
        return None
    return {"level": rs.level, "action": rs.action, "upper": rs.upper, "lower": rs.lower}


@pytest.mark.parametrize("case", PPO_CASES)
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_ppo_matches_the_reference_at_every_position(case, layout):
    seqs = _sequences(7)
    ref_seqs = [[_with_grad(s[0]), *s[1:]] for s in seqs]
    kw = {"eps": 0.2, "eps_hi": case.get("eps_hi"), "c_clip": case.get("c_clip")}
    want_loss, want = _ref_ppo(ref_seqs, **kw, rs=case.get("rs"), level=case["level"])
    want_loss.backward()
    want_grad = torch.cat([s[0].grad for s in ref_seqs])
    args = {
        "eps_clip_higher": kw["eps_hi"],
        "c_clip": kw["c_clip"],
        "rejection_sampling": _rs_arg(case.get("rs")),
        "importance_sampling_level": case["level"],
    }
    if layout == "packed":
        (lp, prox, old, adv, m), cu = _packed(seqs)
        lp = _with_grad(lp)
        loss, stat = ppo_actor_loss_fn(lp, prox, old, adv, 0.2, m, **args, cu_seqlens=cu)
        select, grad_of = None, lambda: lp.grad
    else:
        (lp, prox, old, adv, m), real = _padded(seqs)
        lp = _with_grad(lp)
        loss, stat = ppo_actor_loss_fn(lp, prox, old, adv, 0.2, m, **args)
        select, grad_of = real, lambda: lp.grad[real]
        want["n_total_tokens"] = float(m.numel())
        want["n_masked_tokens"] = m.numel() - want["n_valid_tokens"]
    loss.backward()
    torch.testing.assert_close(loss, want_loss)
    torch.testing.assert_close(grad_of(), want_grad)
    assert set(stat) == set(want) | {"masked_token_ratio"}
    _assert_stats(stat, want, select)
    if select is not None:  # every stat tensor has the input's shape
        assert all(v.shape == m.shape for v in stat.values() if torch.is_tensor(v))


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_sapo_matches_the_reference_at_every_position(level, layout):
    seqs = [[s[0], s[2], s[3], s[4]] for s in _sequences(11)]
    ref_seqs = [[_with_grad(s[0]), *s[1:]] for s in seqs]
    want_loss, want = _ref_sapo(ref_seqs, 1.0, 1.05, level)
    want_loss.backward()
    want_grad = torch.cat([s[0].grad for s in ref_seqs])
    if layout == "packed":
        (lp, old, adv, m), cu = _packed(seqs)
        lp = _with_grad(lp)
        loss, stat = sapo_loss_fn(lp, old, adv, 1.0, 1.05, m, level, cu)
        select, grad_of = None, lambda: lp.grad
    else:
        (lp, old, adv, m), real = _padded(seqs)
        lp = _with_grad(lp)
        loss, stat = sapo_loss_fn(lp, old, adv, 1.0, 1.05, m, importance_sampling_level=level)
        select, grad_of = real, lambda: lp.grad[real]
    loss.backward()
    torch.testing.assert_close(loss, want_loss)
    torch.testing.assert_close(grad_of(), want_grad)
    _assert_stats(stat, want, select)
    assert not stat["clip_mask"].any() and not stat["dual_clip_mask"].any()
    assert stat["clip_mask"].shape == m.shape


# ---------------------------------------------------------------------------------------------
# packed inputs: sequence-level importance sampling per packed sequence, by hand
# ---------------------------------------------------------------------------------------------


def test_packed_gspo_reduces_per_packed_sequence_by_hand():
    # two packed sequences, cu = [0, 2, 3]; lp - prox = [log 2, 0 | log 3], A = [1, 3 | -1]
    # seq 1: r = exp((log 2 + 0) / 2) = sqrt 2, A_mean = 2; r in [0.5, 1.5]: pg = -2 sqrt 2
    # seq 2: r = 3, A = -1: pg1 = 3, pg2 = -(-1) * 1.5 = 1.5 -> pg = 3 (clipped branch not taken)
    # loss = (2 * (-2 sqrt 2) + 3) / 3
    lp = torch.tensor([math.log(2.0), 0.0, math.log(3.0)], dtype=F64, requires_grad=True)
    zero = torch.zeros(3, dtype=F64)
    adv = torch.tensor([1.0, 3.0, -1.0], dtype=F64)
    m = torch.ones(3, dtype=torch.bool)
    cu = torch.tensor([0, 2, 3])
    loss, stat = ppo_actor_loss_fn(lp, zero, zero, adv, 0.5, m, None, None, None, "sequence", cu)
    assert loss.item() == pytest.approx((-4 * math.sqrt(2) + 3) / 3)
    r2 = math.sqrt(2.0)
    torch.testing.assert_close(stat["importance_weight"], torch.tensor([r2, r2, 3.0], dtype=F64))
    assert stat["clip_mask"].tolist() == [False, False, False]
    # d loss / d lp: seq 1 tokens each -2 * r / 2 * 2 / 3 = -2 sqrt 2 / 3; seq 2: -(-1) * 3 / 3
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([-2 * r2 / 3, -2 * r2 / 3, 1.0], dtype=F64))
    # the same tokens as ONE sequence (no cu_seqlens) are refused, as AReaL refuses them
    with pytest.raises(ValueError, match="cu_seqlens is required"):
        ppo_actor_loss_fn(lp, zero, zero, adv, 0.5, m, importance_sampling_level="sequence")


def test_packed_sequence_rejection_sampling_per_packed_sequence():
    # cu = [0, 2, 4]; prox - old = [0, 0 | log 4, log 4]: sequence 2's geometric-mean weight 4
    # is above upper=2 and the whole sequence is rejected; seq 1 (weight 1) stays.
    # Token level PPO, r = 1, A = 1: kept tokens' loss -1 each -> loss = -2 / 4 valid tokens
    prox = torch.zeros(4, dtype=F64)
    old = -torch.tensor([0.0, 0.0, math.log(4.0), math.log(4.0)], dtype=F64)
    lp = prox.clone().requires_grad_(True)
    m = torch.ones(4, dtype=torch.bool)
    rs = {"level": "sequence", "upper": 2.0}
    cu = torch.tensor([0, 2, 4])
    loss, stat = ppo_actor_loss_fn(
        lp, prox, old, torch.ones(4, dtype=F64), 0.2, m, None, None, rs, cu_seqlens=cu
    )
    assert loss.item() == pytest.approx(-0.5)
    assert stat["behave_mask"].tolist() == [True, True, False, False]
    assert stat["behave_imp_weight"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert stat["filtered_fraction"] == pytest.approx(0.5)
    assert stat["n_valid_tokens"] == 2.0
    with pytest.raises(ValueError, match="cu_seqlens is required for 1D packed tensors"):
        ppo_actor_loss_fn(lp, prox, old, torch.ones(4, dtype=F64), 0.2, m, rejection_sampling=rs)


def test_token_level_1d_without_cu_seqlens_is_one_sequence():
    (lp, prox, old, adv, m), _ = _packed(_sequences(3))
    a, sa = ppo_actor_loss_fn(lp, prox, old, adv, 0.2, m, c_clip=2.0)
    b, sb = ppo_actor_loss_fn(lp[None], prox[None], old[None], adv[None], 0.2, m[None], c_clip=2.0)
    assert a == b
    assert all(torch.equal(sa[k], sb[k][0]) for k in sa if torch.is_tensor(sa[k]))


@pytest.mark.parametrize(
    "cu, message",
    [
        (torch.tensor([0, 3, 4]), "boundaries from 0 to the 19 packed"),
        (torch.tensor([1, 19]), "boundaries"),
        (torch.tensor([0, 10, 5, 19]), "non-decreasing"),
        (torch.tensor([0.0, 19.0]), "integer"),
    ],
)
def test_bad_cu_seqlens_is_refused_in_one_line(cu, message):
    (lp, old, adv, m), _ = _packed([[s[0], s[2], s[3], s[4]] for s in _sequences(3)])
    with pytest.raises(ValueError, match=message):
        sapo_loss_fn(lp, old, adv, 1.0, 1.0, m, "sequence", cu)


# ---------------------------------------------------------------------------------------------
# CISPO
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("band", [(0.2, 0.28), (1.0, 4.0)])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_cispo_value_gradient_and_stop_gradient(band, layout):
    eps_lo, eps_hi = band
    seqs = _sequences(5)
    if layout == "packed":
        (lp, prox, old, adv, m), cu = _packed(seqs)
    else:
        (lp, prox, old, adv, m), _ = _padded(seqs)
        cu = None
    lp = _with_grad(lp)
    prox = _with_grad(prox)  # a correct stop-gradient leaves the ratio's reference without one
    rs = {"level": "token", "action": "clamp", "upper": 3.0}
    loss, stat = cispo_loss_fn(lp, prox, adv, eps_lo, m, eps_hi, old, rs, cu)
    loss.backward()
    r = torch.exp(lp.detach() - prox.detach())
    r_hat = r.clamp(1 - eps_lo, 1 + eps_hi)
    w = torch.where(m, torch.exp(prox.detach() - old).clamp(max=3.0), 0.0)
    n = int(m.sum())
    want = torch.where(m, -r_hat * adv * lp.detach() * w, 0.0).sum() / n
    torch.testing.assert_close(loss, want)
    # gradient: -r_hat * A * w / N on valid tokens; with the weight differentiable it would
    # gain a term -A * w * logp * d r_hat / d logp (r_hat = r inside the band)
    torch.testing.assert_close(lp.grad, torch.where(m, -r_hat * adv * w / n, 0.0))
    assert prox.grad is None or not prox.grad.any()
    torch.testing.assert_close(stat["importance_weight"], r)
    torch.testing.assert_close(stat["loss"], -r_hat * adv * lp.detach() * w)
    assert torch.equal(stat["clip_mask"], (r_hat != r) & m)
    assert not stat["dual_clip_mask"].any()
    torch.testing.assert_close(stat["behave_imp_weight"], w)
    assert torch.equal(stat["behave_mask"], (w > 0) & m)


def test_cispo_refuses_what_areal_refuses():
    x = torch.zeros(1, 3)
    m = torch.ones(1, 3, dtype=torch.bool)
    for bad in (None, 0.0, -1.0):
        with pytest.raises(ValueError, match="eps_clip_higher"):
            cispo_loss_fn(x, x, x, 1.0, m, eps_clip_higher=bad)
    with pytest.raises(ValueError, match="old_logprobs is required"):
        cispo_loss_fn(x, x, x, 1.0, m, 4.0, rejection_sampling={"upper": 2.0})


# ---------------------------------------------------------------------------------------------
# hand cases, M2PO through the loss mask, AReaL's config section
# ---------------------------------------------------------------------------------------------


def test_ppo_hand_values_and_no_behaviour_weight_without_rejection_sampling():
    # two valid tokens and a masked one: r = [1.5, 0.5], A = [2, -1], eps 0.2
    # token 1: pg1 = -3, pg2 = -2 * 1.2 = -2.4 -> -2.4 (clipped); token 2: pg1 = 0.5,
    # pg2 = 0.8 -> 0.8 (clipped). Behaviour log-probs far away change nothing (no weight).
    lp = torch.tensor([[math.log(1.5), math.log(0.5), 9.0]], dtype=F64, requires_grad=True)
    zero = torch.zeros(1, 3, dtype=F64)
    adv = torch.tensor([[2.0, -1.0, 4.0]], dtype=F64)
    m = torch.tensor([[True, True, False]])
    loss, stat = ppo_actor_loss_fn(lp, zero, zero - 3.0, adv, 0.2, m)
    assert loss.item() == pytest.approx((-2.4 + 0.8) / 2)
    assert stat["clip_mask"].tolist() == [[True, True, False]]
    torch.testing.assert_close(
        stat["importance_weight"], torch.tensor([[1.5, 0.5, 0.0]], dtype=F64)
    )
    # the masked token: AReaL's ratio 0 there, A = 4: max(-0, -4 * 0.8) = 0
    torch.testing.assert_close(stat["loss"], torch.tensor([[-2.4, 0.8, 0.0]], dtype=F64))
    assert "behave_imp_weight" not in stat and "filtered_fraction" not in stat
    loss.backward()
    assert lp.grad.tolist() == [[0.0, 0.0, 0.0]]  # both on the clipped branch


def test_m2po_through_the_loss_mask_divides_by_the_kept_count():
    # AReaL's actor narrows loss_mask with _apply_m2po_masking, then calls the loss: m2 of the
    # tokens (behave - prox)^2 = [4, 0, 0] with threshold 1: the first token is masked (mean of
    # the rest 0 < 1) and the loss is the mean over the 2 kept tokens (AReaL's denominator).
    prox = torch.zeros(1, 3, dtype=F64)
    old = torch.tensor([[2.0, 0.0, 0.0]], dtype=F64)
    m = torch.ones(1, 3, dtype=torch.bool)
    kept = _apply_m2po_masking(old, prox, m, 1.0)
    assert kept.tolist() == [[False, True, True]]
    adv = torch.tensor([[5.0, 1.0, 3.0]], dtype=F64)
    loss, stat = ppo_actor_loss_fn(prox.clone(), prox, old, adv, 0.2, kept)
    assert loss.item() == pytest.approx(-(1.0 + 3.0) / 2)
    assert stat["n_valid_tokens"] == 2.0


def test_rejection_sampling_takes_areal_config_sections():
    seqs = _sequences(2)
    (lp, prox, old, adv, m), _ = _padded(seqs)
    section = RejectionSamplingConfig(level="token", action="clamp", upper=1.3, lower=0.7)

    class Plain:  # any object with the field names, as AReaL's own dataclass
        level, action, metric, agg, upper, lower = "token", "clamp", "ratio", "mean", 1.3, 0.7

    a, sa = ppo_actor_loss_fn(lp, prox, old, adv, 0.2, m, rejection_sampling=section)
    b, sb = ppo_actor_loss_fn(lp, prox, old, adv, 0.2, m, rejection_sampling=Plain())
    c, sc = ppo_actor_loss_fn(lp, prox, old, adv, 0.2, m, rejection_sampling=_rs_arg(
        _RS("token", "clamp", 1.3, 0.7)))  # fmt: skip
    assert a == b == c
    assert torch.equal(sa["behave_imp_weight"], sc["behave_imp_weight"])
    assert sa["filtered_fraction"] == sb["filtered_fraction"] > 0


# ---------------------------------------------------------------------------------------------
# critic
# ---------------------------------------------------------------------------------------------


def test_critic_loss_mse_huber_and_mask_by_hand():
    # v = [0, 30], old = [0, 29], R = [1, 0], eps 0.5; clipped v = [0, 29.5]
    # mse: token 1: 0.5 * 1 = 0.5 (both terms); token 2: max(0.5*900, 0.5*870.25) = 450
    # huber (delta 10): token 1: 0.5; token 2: max(10 (30 - 5), 10 (29.5 - 5)) = 250
    v = torch.tensor([0.0, 30.0])
    old = torch.tensor([0.0, 29.0])
    ret = torch.tensor([1.0, 0.0])
    loss, stat = ppo_critic_loss_fn(v, old, ret, 0.5)
    assert loss.item() == pytest.approx((0.5 + 450.0) / 2)
    assert stat["loss"].tolist() == pytest.approx([0.5, 450.0])
    assert stat["clip_mask"].tolist() == [False, False]
    loss, stat = ppo_critic_loss_fn(v, old, ret, 0.5, torch.tensor([False, True]), "huber")
    assert loss.item() == pytest.approx(250.0)
    assert stat["loss"].tolist() == pytest.approx([0.5, 250.0])
    # v moved away from old (old = 0, v = 2, R = 3, eps 0.5): the clipped value 0.5 is farther
    # from R, so the clipped term wins
    loss, stat = ppo_critic_loss_fn(
        torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([3.0]), 0.5
    )
    assert loss.item() == pytest.approx(0.5 * 2.5**2)
    assert stat["clip_mask"].tolist() == [True]


def test_critic_refuses_what_areal_refuses():
    x32 = torch.zeros(2)
    with pytest.raises(AssertionError, match="value must be torch.float32"):
        ppo_critic_loss_fn(x32.double(), x32, x32, 0.2)
    with pytest.raises(NotImplementedError, match="Unknown loss fn type: l1"):
        ppo_critic_loss_fn(x32, x32, x32, 0.2, None, "l1")


# ---------------------------------------------------------------------------------------------
# refused arguments
# ---------------------------------------------------------------------------------------------


def test_refused_arguments_with_areals_messages():
    x = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="Invalid importance_sampling_level: seq. Must be"):
        ppo_actor_loss_fn(x, x, x, x, 0.2, m, importance_sampling_level="seq")
    with pytest.raises(ValueError, match="Invalid importance_sampling_level"):
        sapo_loss_fn(x, x, x, 1.0, 1.0, m, importance_sampling_level="tokens")
    # AReaL asserts c_clip > 1: ContractError is an AssertionError and a ValueError
    for kind in (AssertionError, ValueError):
        with pytest.raises(kind, match="c_clip"):
            ppo_actor_loss_fn(x, x, x, x, 0.2, m, c_clip=1.0)
    assert issubclass(ContractError, AssertionError) and issubclass(ContractError, ValueError)
    for taus in ((0.0, 1.0), (1.0, -1.0)):
        with pytest.raises(ValueError, match=r"SAPO temperatures \(tau_pos, tau_neg\) must be"):
            sapo_loss_fn(x, x, x, *taus, m)
    x3 = torch.zeros(1, 2, 3)
    with pytest.raises(
        ValueError, match="Expected 1D \\(packed\\) or 2D \\(padded\\) tensors, got ndim=3"
    ):
        ppo_actor_loss_fn(x3, x3, x3, x3, 0.2, torch.ones(1, 2, 3, dtype=torch.bool))
    x1 = torch.zeros(3)
    with pytest.raises(ValueError, match="cu_seqlens is required for 1D tensors"):
        sapo_loss_fn(x1, x1, x1, 1.0, 1.0, torch.ones(3, dtype=torch.bool), "sequence")
    # also refused here (AReaL would compute something): mismatched shapes, non-bool masks
    with pytest.raises(ValueError, match="advantages shape"):
        ppo_actor_loss_fn(x, x, x, torch.zeros(2, 2), 0.2, m)
    with pytest.raises(TypeError, match="loss_mask must be torch.bool"):
        ppo_actor_loss_fn(x, x, x, x, 0.2, m.int())
    with pytest.raises(ValueError, match="eps_clip must be >= 0"):
        ppo_actor_loss_fn(x, x, x, x, -0.1, m)
