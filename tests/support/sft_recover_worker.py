"""Fine-tune from a config file and SIGKILL this process right after the recover checkpoint of
a given step is written (a crash with no clean-up at all), for ``tests/test_sft.py``.

    python tests/sft_recover_worker.py CONFIG.yaml KILL_AFTER_STEP
"""

from __future__ import annotations

import os
import signal
import sys


def main(config_path: str, kill_after: int) -> int:
    from areal_m2po.api.cli_args import SFTConfig
    from areal_m2po.api.config_loader import load_config
    from areal_m2po.trainer.sft_trainer import SFTTrainer, run

    real_save = SFTTrainer.save_checkpoint

    def save_then_die(trainer):
        path = real_save(trainer)
        if trainer.step >= kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return path

    SFTTrainer.save_checkpoint = save_then_die  # type: ignore[method-assign]
    return run(load_config(["--config", config_path], SFTConfig))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
