"""The agent workflow (``rollout.workflow=agent``): a user's async agent function run against
the OpenAI-compatible endpoint (:mod:`areal_m2po.rollout.openai`)."""
