"""Train from a config file and SIGKILL this process right after the recover checkpoint of a
given step is written (a crash with no clean-up at all), for the exact-resume tests of the RL
trainer (``rl``, the default), the SFT trainer (``sft``) and the DPO trainer (``dpo``).

    python tests/support/recover_worker.py CONFIG.yaml KILL_AFTER_STEP [rl|sft|dpo]
"""

from __future__ import annotations

import os
import signal
import sys


def main(config_path: str, kill_after: int, trainer: str = "rl") -> int:
    from areal_m2po.api.cli_args import DPOConfig, PPOConfig, SFTConfig
    from areal_m2po.api.config_loader import load_config
    from areal_m2po.trainer import dpo_trainer, rl_trainer, sft_trainer
    from areal_m2po.trainer.step_loop import RecoverableStepLoop

    module, config_cls = {
        "rl": (rl_trainer, PPOConfig),
        "sft": (sft_trainer, SFTConfig),
        "dpo": (dpo_trainer, DPOConfig),
    }[trainer]
    real_save = RecoverableStepLoop.save_checkpoint

    def save_then_die(self: RecoverableStepLoop) -> str:
        path = real_save(self)
        if self.step >= kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return path

    RecoverableStepLoop.save_checkpoint = save_then_die  # type: ignore[method-assign]
    return module.run(load_config(["--config", config_path], config_cls))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:4]))
