"""``python -m areal_m2po.train_sft``: supervised fine-tuning of a causal LM (the first stage of
the RLHF pipeline: SFT, then a reward model with ``train_rm``, then PPO with ``train``).

    python -m areal_m2po.train_sft [--config FILE.yaml] [KEY=VALUE | --KEY=VALUE | --KEY VALUE ...]
    python -m areal_m2po.train_sft --help
    python -m areal_m2po.train_sft --config configs/sft_tiny.yaml --print-config

Same config system as ``python -m areal_m2po.train`` with :class:`SFTConfig` as the root: a bad
config or a bad record exits with status 2 and one line ``error: ...`` on stderr, before any
model loads. Without arguments it runs the built-in demo (SmolLM2-135M-Instruct on the correct
answers of the built-in arithmetic task).
"""

from __future__ import annotations

import sys

from areal_m2po.api.cli_args import SFTConfig
from areal_m2po.entry import EXIT_BAD_CONFIG, config_main

__all__ = ["EXIT_BAD_CONFIG", "main"]

USAGE = """\
usage: python -m areal_m2po.train_sft [--config FILE.yaml] [--print-config] [-h]
                                      [KEY=VALUE | --KEY=VALUE | --KEY VALUE ...]

Supervised fine-tuning: learn the completions of {prompt, completion} records or the assistant
turns of {messages: [...]} conversations (token-mean negative log-likelihood), evaluate the
held-out loss and perplexity, and save the model in Hugging Face format for actor.path of
python -m areal_m2po.train (or model.path of train_rm). Settings come from the defaults below,
then --config FILE.yaml, then the KEY=VALUE overrides (the three forms are equivalent).
"""


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), then print help/config or train.

    Returns 0 for ``--help``/``--print-config`` and a finished run, 2 for bad input.
    """
    return config_main(argv, SFTConfig, "areal_m2po.trainer.sft_trainer:run", usage=USAGE)


if __name__ == "__main__":
    sys.exit(main())
