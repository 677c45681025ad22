"""AReaL's record of a client's completions (``areal.experimental.openai.cache`` at
areal-project/AReaL cbff54d6): completion id -> interaction, in creation order, with the
rewards set on them, AReaL's backward reward discount (this package's,
:func:`~areal_m2po.rollout.workflows.agent.areal_agent.discounted_rewards`) and the export of
what is trained on."""

from __future__ import annotations

import logging

from areal_m2po.areal.experimental.openai.types import InteractionWithTokenLogpReward
from areal_m2po.rollout.workflows.agent.areal_agent import discounted_rewards

__all__ = ["InteractionCache"]

logger = logging.getLogger("areal_m2po.areal")


class InteractionCache(dict[str, InteractionWithTokenLogpReward]):
    """Interactions keyed by completion id, in the order they were created."""

    def __init__(self) -> None:
        super().__init__()
        self._discounted = False

    @property
    def last_interaction_id(self) -> str:
        return next(reversed(self))

    @property
    def total_reward(self) -> float:
        return sum(i.reward or 0.0 for i in self.values())

    def set_reward(self, interaction_id: str, reward: float) -> None:
        """Set the reward of completion ``interaction_id``."""
        self[interaction_id].reward = reward

    def set_last_reward(self, reward: float) -> None:
        """Set the reward of the most recent completion."""
        self.set_reward(self.last_interaction_id, reward)

    def apply_reward_discount(
        self, turn_discount: float = 1.0
    ) -> dict[str, InteractionWithTokenLogpReward]:
        """Each completion's reward becomes its own (0 when unset) plus ``turn_discount``
        times the next completion's discounted reward (creation order); once only.

        Raises:
            RuntimeError: called a second time.
        """
        if self._discounted:
            raise RuntimeError("apply_reward_discount should only be called once.")
        self._discounted = True
        interactions = list(self.values())
        if interactions and interactions[-1].reward is None:
            logger.warning("The most recent interaction has no reward set: it gets 0.")
        rewards = discounted_rewards([i.reward for i in interactions], turn_discount)
        for interaction, reward in zip(interactions, rewards):
            interaction.reward = reward
        return dict(self)

    def export_interactions(
        self, style: str, reward_discount: float | None = None
    ) -> dict[str, InteractionWithTokenLogpReward]:
        """The completions to train on: ``individual`` every finished one; ``concat`` the
        leaves of the conversation tree (those no later completion extends), each trained as
        its chain (``chat_template_type="concat"`` only). ``reward_discount`` applies the
        discount first, unless it was applied.

        Raises:
            ValueError: an unknown ``style``, or ``concat`` on ``hf``-templated completions.
        """
        if reward_discount is not None and not self._discounted:
            self.apply_reward_discount(reward_discount)
        done = {k: v for k, v in self.items() if v.output_message_list is not None}
        if style == "individual":
            return done
        if style != "concat":
            raise ValueError(f"Invalid export interactions style {style}")
        if any(v.chat_template_type != "concat" for v in done.values()):
            raise ValueError(
                "export_interactions(style='concat') needs ArealOpenAI(chat_template_type="
                "'concat') (an 'hf' template may re-tokenise earlier turns); use 'individual'"
            )
        parents = {v.parent.interaction_id for v in done.values() if v.parent is not None}
        return {k: v for k, v in done.items() if k not in parents}
