"""The trainers and their loops: RL (:mod:`~areal_m2po.trainer.rl_trainer`), SFT and the
reward model, the step-loop bookkeeping they share (:mod:`~areal_m2po.trainer.step_loop`),
run set-up, launch checks and recover checkpoints; the PPO actor and critic in
:mod:`areal_m2po.trainer.ppo`."""
