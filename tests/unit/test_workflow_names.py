"""The built-in workflow names the config accepts are exactly the ones rollout/ can build."""

from __future__ import annotations

import pytest

from areal_m2po.api.cli_args import ConfigError, RolloutConfig
from areal_m2po.rollout.workflows import BUILTIN_WORKFLOWS
from areal_m2po.utils.imports import load_object


@pytest.mark.parametrize("name", sorted(BUILTIN_WORKFLOWS))
def test_every_builtin_name_is_accepted_and_imports(name):
    assert RolloutConfig(workflow=name).workflow == name
    assert callable(load_object(BUILTIN_WORKFLOWS[name], "rollout.workflow"))


def test_an_unknown_bare_name_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="rlvr, multi_turn, agent or a dotted path"):
        RolloutConfig(workflow="multiturn")
