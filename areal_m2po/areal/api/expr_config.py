"""AReaL's experiment configs and reader (``areal.api.cli_args`` at areal-project/AReaL
cbff54d6): ``PPOConfig``/``GRPOConfig`` and ``load_expr_config(argv, config_cls)``.

They are this package's :class:`~areal_m2po.api.cli_args.PPOConfig` (every key, check and
default its own, M2PO included) with ``tokenizer_path`` set (null: ``actor.path``, which AReaL's scripts read
directly) and ``gconfig`` typed as AReaL's
:class:`~areal_m2po.areal.api.generation.GenerationHyperparameters`; the reader is
:func:`~areal_m2po.api.config_loader.load_config`, which reads AReaL's YAML files with AReaL's
meaning. A user's dataclass subclassing ``GRPOConfig`` with fields of its own loads too: its
fields are set from the file and the command line like any other key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from areal_m2po.api.cli_args import PPOConfig as _PackagePPOConfig
from areal_m2po.api.config.checks import section_field
from areal_m2po.api.config_loader import load_config, parse_argv
from areal_m2po.areal.api.generation import GenerationHyperparameters

__all__ = ["GRPOConfig", "PPOConfig", "load_expr_config"]

ConfigT = TypeVar("ConfigT")


@dataclass
class PPOConfig(_PackagePPOConfig):
    """This package's PPO config with AReaL's ``gconfig`` type."""

    gconfig: GenerationHyperparameters = section_field(
        GenerationHyperparameters, "Generation (sampling) settings."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tokenizer_path is None:  # AReaL's scripts read it: null means actor.path
            self.tokenizer_path = self.actor.path


@dataclass
class GRPOConfig(PPOConfig):
    """AReaL's name for the same config (GRPO is PPO with group-normalised rewards)."""


def load_expr_config(argv: list[str], config_cls: type[ConfigT]) -> tuple[ConfigT, str]:
    """``(config, config_file)`` from ``argv`` as AReaL's scripts pass it
    (``--config FILE.yaml key=value ...``): defaults < the file < the overrides.

    Raises:
        ConfigError: one line naming the key of any problem.
    """
    files, _ = parse_argv(list(argv))
    config: Any = load_config(list(argv), config_cls)
    return config, files[-1] if files else ""
