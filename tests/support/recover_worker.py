"""Train from a config file and SIGKILL this process right after the recover checkpoint of a
given step is written (a crash with no clean-up at all), for ``tests/integration/test_recover.py``.

    python tests/support/recover_worker.py CONFIG.yaml KILL_AFTER_STEP
"""

from __future__ import annotations

import os
import signal
import sys


def main(config_path: str, kill_after: int) -> int:
    from areal_m2po.api.config_loader import load_config
    from areal_m2po.trainer.rl_trainer import RLTrainer, run

    real_save = RLTrainer.save_checkpoint

    def save_then_die(trainer):
        path = real_save(trainer)
        if trainer.step >= kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return path

    RLTrainer.save_checkpoint = save_then_die  # type: ignore[method-assign]
    return run(load_config(["--config", config_path]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
