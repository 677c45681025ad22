"""AReaL's workflows (``areal.workflow`` at areal-project/AReaL cbff54d6): ``rlvr.RLVRWorkflow``
and ``openai.math_agent.MathAgent``, run by this package's trainer
(:mod:`areal_m2po.areal.trainer`)."""
