"""An unknown key gets a suggestion only when one is close: found in the new-user sweep,
``foo.bar=1`` was answered "did you mean 'rollout.backend'?"."""

from __future__ import annotations

import pytest

from areal_m2po.api.config_loader import load_config
from areal_m2po.api.errors import ConfigError


def _message(*args: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(list(args))
    return str(info.value)


def test_an_unrelated_key_gets_no_suggestion():
    assert _message("foo.bar=1") == "foo.bar: unknown key 'foo.bar'"
    assert _message("zzz=1") == "zzz: unknown key 'zzz'"


def test_close_keys_and_a_known_last_part_still_get_one():
    assert _message("actor.m2_treshold=0.1").endswith("(did you mean 'actor.m2_threshold'?)")
    assert _message("seedd=1").endswith("(did you mean 'seed'?)")
    assert _message("lr=0.1").endswith("(did you mean 'actor.optimizer.lr'?)")
