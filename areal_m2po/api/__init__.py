"""The configuration API in one import::

    from areal_m2po.api import ActorConfig, PPOConfig, load_config

The dataclass tree is gathered in :mod:`areal_m2po.api.cli_args` (its sections are declared in
:mod:`areal_m2po.api.config`; neither imports the loader), loading and saving in
:mod:`areal_m2po.api.config_loader` (which builds that tree); this package re-exports both, so neither module has to import the other's users.
"""

from areal_m2po.api.cli_args import *  # noqa: F403 - the config tree, as cli_args.__all__ lists it
from areal_m2po.api.cli_args import __all__ as _config_names
from areal_m2po.api.config_loader import config_to_yaml, load_config, save_config

__all__ = [*_config_names, "config_to_yaml", "load_config", "save_config"]
