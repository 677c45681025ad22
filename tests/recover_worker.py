"""Train from a config file and SIGKILL this process right after the recover checkpoint of a
given step is written (a crash with no clean-up at all), for ``tests/test_recover.py``.

    python tests/recover_worker.py CONFIG.yaml KILL_AFTER_STEP
"""

from __future__ import annotations

import os
import signal
import sys


def main(config_path: str, kill_after: int) -> int:
    from areal_m2po.api.config_loader import load_config
    from areal_m2po.trainer.rl_trainer import run
    from areal_m2po.utils import recover

    real_save = recover.save_checkpoint

    def save_then_die(trainer):
        path = real_save(trainer)
        if trainer.step >= kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return path

    recover.save_checkpoint = save_then_die
    return run(load_config(["--config", config_path]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
