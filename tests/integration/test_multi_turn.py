"""The multi-turn workflow: exact token sequences, masks, behaviour log-probs and versions."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from agentic_helpers import VersionedTinyEngine, forward_logprobs, tiny_model_and_tokenizer

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.api.engine_api import SamplingParams
from areal_m2po.api.workflow_api import WorkflowContext
from areal_m2po.rollout.executor import arun_group
from areal_m2po.rollout.workflows.multi_turn.chat_turns import TurnAppender
from areal_m2po.rollout.workflows.multi_turn.episode import Generated, cut_at_stop
from areal_m2po.rollout.workflows.multi_turn.tool_env import RetryEnvironment
from areal_m2po.rollout.workflows.multi_turn.workflow import MultiTurnWorkflow
from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer

RETRY_TURN = (
    "<|im_start|>user\n" + RetryEnvironment.retry_message + "<|im_end|>\n<|im_start|>assistant\n"
)


def _run_group(workflow, engine, record):
    """The group of ``record``: ``gconfig.n_samples`` episodes, as the executor runs them."""
    n = workflow.context.gconfig.n_samples
    return asyncio.run(arun_group(workflow, engine, record, n))


def _context(tokenizer, gconfig: GenerationConfig) -> WorkflowContext:
    return WorkflowContext(
        tokenizer=tokenizer,
        gconfig=gconfig,
        sampling=SamplingParams.from_gconfig(gconfig),
        eos_token_ids=[tokenizer.eos_token_id],
        reward=None,
    )


def _record(tokenizer, question: str, answer: str) -> dict:
    messages = [{"role": "user", "content": question}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return {
        "question": question,
        "answer": answer,
        "prompt_ids": tokenizer(ids, add_special_tokens=False)["input_ids"],
    }


def test_appended_turn_equals_the_template_rendering_of_the_conversation() -> None:
    tokenizer = build_tiny_tokenizer()
    appender = TurnAppender(tokenizer)
    assert appender.before_text == "<|im_end|>\n<|im_start|>user\n"
    assert appender.after_text == "<|im_end|>\n<|im_start|>assistant\n"
    conversation = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A1"}]
    full = tokenizer.apply_chat_template(
        [*conversation, {"role": "user", "content": "R"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    prompt = tokenizer.apply_chat_template(
        conversation[:1], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    a1 = tokenizer("A1", add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    expected = tokenizer(full, add_special_tokens=False)["input_ids"]
    # the policy ended its turn with EOS (= <|im_end|>): it is not appended twice
    assert prompt_ids + a1 + [eos] + appender.ids("R", policy_ended_with_eos=True) == expected
    # the policy's turn was cut (stop string, length): the template's turn end is appended
    assert prompt_ids + a1 + appender.ids("R", policy_ended_with_eos=False) == expected


def test_plain_turns_without_a_chat_template() -> None:
    tokenizer = build_tiny_tokenizer()
    appender = TurnAppender(tokenizer, use_chat_template=False)
    assert tokenizer.decode(appender.ids("R", False)) == "\n\nR\n\n"


def test_env_role_the_template_cannot_render_is_refused() -> None:
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = "{{ raise_exception('only user') if messages[2]['role'] != 'user' }}"
    with pytest.raises(ValueError, match=r"rollout.workflow_kwargs.env_role: .*'tool'"):
        MultiTurnWorkflow(_context(tokenizer, GenerationConfig()), env_role="tool")


def test_cut_at_stop_keeps_exactly_the_prefix_through_the_stop_string() -> None:
    tokenizer = build_tiny_tokenizer()
    ids = tokenizer("a<calc>1+2</calc> and more", add_special_tokens=False)["input_ids"]
    out = Generated(ids, [-0.1 * i for i in range(len(ids))], list(range(len(ids))), "length")
    cut = cut_at_stop(out, tokenizer, ["</calc>"])
    assert tokenizer.decode(cut.ids) == "a<calc>1+2</calc>"
    k = len(cut.ids)
    assert cut.logprobs == out.logprobs[:k] and cut.versions == out.versions[:k]
    assert cut.finish_reason == "stop"
    assert cut_at_stop(out, tokenizer, ["<none>"]) is out


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"environment": "web"}, "environment: 'web' is not one of calculator, retry"),
        ({"max_turns": 0}, "max_turns: must be an integer >= 1"),
        ({"turn_discount": 1.5}, r"turn_discount: must be in \(0, 1\]"),
        ({"max_total_tokens": 1}, "max_total_tokens: must be an integer >= 2 or null"),
        ({"reward_fn": "no_such_module:f"}, "rollout.workflow_kwargs.reward_fn"),
    ],
)
def test_bad_workflow_kwargs_are_refused_in_one_line(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MultiTurnWorkflow(_context(build_tiny_tokenizer(), GenerationConfig()), **kwargs)


def _check_episode(traj, engine, calls, tokenizer, temperature: float) -> None:
    """The trajectory is the concatenation of the engine calls and the appended turns."""
    ids = traj.input_ids
    position = traj.prompt_len
    assert not any(traj.loss_mask[:position])
    for k, (request, response) in enumerate(calls):
        assert request.input_ids == ids[: len(request.input_ids)]  # the engine saw this prefix
        if k:  # what came in between is exactly one appended retry turn
            between = tokenizer.decode(ids[position : len(request.input_ids)])
            ended_with_eos = calls[k - 1][1].output_ids[-1] == tokenizer.eos_token_id
            assert between == ("\n" if ended_with_eos else "<|im_end|>\n") + RETRY_TURN
            assert not any(traj.loss_mask[position : len(request.input_ids)])
            assert set(traj.versions[position : len(request.input_ids)]) == {-1}
        start, end = len(request.input_ids), len(request.input_ids) + len(response.output_ids)
        assert ids[start:end] == response.output_ids
        assert all(traj.loss_mask[start:end])
        assert traj.logprobs[start:end] == pytest.approx(response.output_logprobs, abs=0)
        assert traj.versions[start:end] == response.output_versions
        position = end
    assert position == len(ids)
    assert sum(traj.loss_mask) == sum(len(r.output_ids) for _, r in calls)
    # every behaviour log-prob equals a forward pass of the version that produced the token
    for version in sorted(set(traj.versions) - {-1}):
        reference = forward_logprobs(
            engine.generator.model, engine.weights[version], ids, temperature
        )
        at = [t for t, v in enumerate(traj.versions) if v == version]
        assert torch.tensor([traj.logprobs[t] for t in at]) == pytest.approx(
            reference[at], abs=1e-4
        )


def test_random_retry_episodes_are_token_exact_across_weight_versions() -> None:
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    engine = VersionedTinyEngine(model, tokenizer, bump_every=2)
    gconfig = GenerationConfig(n_samples=2, max_new_tokens=7, temperature=0.8)
    workflow = MultiTurnWorkflow(_context(tokenizer, gconfig), environment="retry", max_turns=3)
    rng = random.Random(5)
    n_checked = 0
    for _ in range(3):
        # an answer no random model writes: every episode runs all three turns
        record = _record(tokenizer, f"What is {rng.randint(10, 99)} + 1?", "9876543210123")
        before = len(engine.calls)
        group = _run_group(workflow, engine, record)
        assert group is not None and len(group) == 2
        calls = engine.calls[before:]
        rids = set()
        for traj in group.trajectories:
            mine = [c for c in calls if c[0].input_ids == traj.input_ids[: len(c[0].input_ids)]]
            mine = [
                c
                for c in mine
                if traj.input_ids[len(c[0].input_ids) :][: len(c[1].output_ids)] == c[1].output_ids
            ]
            assert len(mine) == traj.info["turns"] == 3
            # an episode's turns go under one request id (one server of a remote engine)
            assert len({c[0].rid for c in mine}) == 1
            rids.add(mine[0][0].rid)
            _check_episode(traj, engine, mine, tokenizer, 0.8)
            assert traj.reward == 0.0 and traj.info["tool_calls"] == 0
            n_checked += 1
        assert group.stats["multi_turn/turns"] == 6 and group.stats["multi_turn/episodes"] == 2
        assert len(rids) == 2  # one id per episode
    assert n_checked == 6
    assert len(engine.weights) >= 5  # the episodes' turns came from several versions


def test_eval_script_reports_fractions_of_greedy_episodes(tmp_path, capsys) -> None:
    import json
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "eval_multi_turn.py"
    main = runpy.run_path(str(script), run_name="eval_multi_turn")["main"]
    out = tmp_path / "eval.json"
    args = ["--model", "builtin:tiny", "--n", "6", "--max-new-tokens", "4", "--out", str(out)]
    assert main([*args, "--environment", "retry", "--max-turns", "2"]) == 0
    line = json.loads(capsys.readouterr().out.strip())
    assert line == json.loads(out.read_text())
    assert line["n"] == 6 and line["environment"] == "retry"
    # a random model never answers right: every retry episode takes both turns
    assert line["solved"] == 0.0 and line["second_turn"] == 1.0 and line["mean_turns"] == 2.0
    assert line["solved_se"] == 0.0 and line["used_tool"] == 0.0
