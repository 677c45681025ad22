"""Keys that did nothing and were removed from the PPO config, and what a file or command line
that still sets one gets.

A removed key set to the value it always had (the value every ``config.yaml`` written before
its removal holds, with which it did nothing) is dropped, so those files still load; any other
value is refused in one line naming what to use instead, since it would change nothing.
"""

from __future__ import annotations

from typing import Any

from areal_m2po.api.errors import ConfigError

__all__ = ["REMOVED_KEYS", "accept_removed"]

_CRITIC_PADDED = (
    "the critic's value forward is always padded and scores every prompt in full (packing "
    "and shared prompts are actor.mb_spec keys); delete it"
)
_ONE_KIND = "a prompt dataset has one kind (rl); delete it"

REMOVED_KEYS: dict[str, tuple[Any, str]] = {
    "critic.mb_spec.packing": (True, _CRITIC_PADDED),
    "critic.mb_spec.shared_prefix": (True, _CRITIC_PADDED),
    "critic.mb_spec.shared_prefix_train": (True, _CRITIC_PADDED),
    "critic.mb_spec.shared_prefix_max_tokens_per_mb": (1024, _CRITIC_PADDED),
    "ref.mb_spec.shared_prefix_train": (
        True,
        "the reference never trains; its log-prob passes share prompts with "
        "ref.mb_spec.shared_prefix; delete it",
    ),
    "train_dataset.type": ("rl", _ONE_KIND),
    "valid_dataset.type": ("rl", _ONE_KIND),
}
"""Removed PPO key: (the value it always had, what to do instead)."""


def accept_removed(key: str, value: Any, is_ppo: bool) -> bool:
    """Whether ``key`` (a dotted key of a PPO config, ``is_ppo``) is a removed key set to the
    value it always had: the caller drops it. False for any key that was never a key; raises
    :class:`ConfigError` for a removed key set to anything else."""
    if not is_ppo or key not in REMOVED_KEYS:
        return False
    kept, instead = REMOVED_KEYS[key]
    if value == kept and type(value) is type(kept):
        return True
    raise ConfigError(key, f"removed: {instead}")
