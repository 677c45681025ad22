"""The command line shared by ``python -m areal_m2po.train``, ``train_rm`` and ``train_sft``:
``--help``, ``--print-config``, the config (defaults, ``--config FILE.yaml``, ``KEY=VALUE``) and
the exit status (:func:`exit_status`, for the ``__main__`` blocks).

A bad config exits with status 2 and one line ``error: <key>: <message>`` on stderr before
torch, transformers or any model or data loads: ``run_training`` (which imports the heavy parts)
is called only with a valid config.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

from areal_m2po.api.config_loader import config_to_yaml, format_help, load_config
from areal_m2po.api.errors import ConfigError, RunError
from areal_m2po.utils.console import print_error

EXIT_BAD_CONFIG = 2
EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C (SIGINT), as a shell reports a process ended by it."""
HELP_FLAGS = ("-h", "--help")
PRINT_CONFIG = "--print-config"


def config_main(
    argv: list[str] | None,
    config_cls: type,
    run_training: Callable[[Any], int | None] | str,
    *,
    usage: str | None = None,
    check_before_run: Callable[[Any], None] | None = None,
) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) into a ``config_cls``, then print help or the
    config, or train.

    Args:
        run_training: called with the valid config; its return value is the exit status
            (None counts as 0). A :class:`ConfigError` it raises exits with status 2. A
            ``"module:function"`` string names it: the module (the trainer, heavy) is imported
            only once the config is valid. A :class:`RunError` it raises is printed as one line
            and exits with the error's ``exit_status`` (1; 143 after SIGTERM); Ctrl-C prints
            one line and exits with status 130.
        usage: the head of ``--help`` (None: the PPO trainer's).
        check_before_run: extra checks of a config that is about to train (not for
            ``--print-config``); a ``ValueError`` exits with status 2.

    Returns:
        The exit status: 0 for ``--help``/``--print-config``, 2 for a bad config, else what
        ``run_training`` returns.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in HELP_FLAGS for a in args):
        sys.stdout.write(format_help(config_cls, usage=usage))
        return 0
    print_config = PRINT_CONFIG in args
    args = [a for a in args if a != PRINT_CONFIG]
    try:
        cfg = load_config(args, config_cls)
        if check_before_run is not None and not print_config:
            check_before_run(cfg)
    except ValueError as exc:  # ConfigError and any other bad-config problem
        print_error(exc)
        return EXIT_BAD_CONFIG
    if print_config:
        sys.stdout.write(config_to_yaml(cfg))
        return 0
    train_fn: Callable[[Any], int | None]
    if isinstance(run_training, str):
        module, _, name = run_training.partition(":")
        train_fn = getattr(importlib.import_module(module), name)
    else:
        train_fn = run_training
    try:
        status = train_fn(cfg)
    except ConfigError as exc:
        print_error(exc)
        return EXIT_BAD_CONFIG
    except RunError as exc:  # a run stopped for a stated reason (non-finite steps, ...)
        print_error(exc)
        return exc.exit_status
    except KeyboardInterrupt:
        print_error(f"interrupted (Ctrl-C); {_how_to_continue(cfg)}")
        return EXIT_INTERRUPTED
    return 0 if status is None else int(status)


def _how_to_continue(cfg: Any) -> str:
    """The rest of the Ctrl-C line: what was kept and the command that continues, which
    depends on whether a recover checkpoint was written (``recover.mode`` disabled: none), and
    on whether anything of a run was (interrupted during start-up: nothing to replace)."""
    import os

    from areal_m2po.trainer.preflight import previous_run
    from areal_m2po.utils.recover import latest_checkpoint, recover_root

    output_dir = os.path.expanduser(str(getattr(cfg, "output_dir", "")))
    last = latest_checkpoint(recover_root(output_dir)) if output_dir else None
    if last is not None:
        return (
            "the metrics and checkpoints written so far are kept; recover.mode=auto resumes "
            f"from the last recover checkpoint, {last}"
        )
    if not output_dir or not previous_run(output_dir):
        return (
            f"no metrics or checkpoint were written in {output_dir}: the same command starts again"
        )
    return (
        f"the metrics written so far are kept in {output_dir}, but no recover checkpoint was "
        "written (recover.mode=auto with recover.freq_steps writes them), so the run cannot "
        "be resumed: rerun with overwrite_output_dir=true or another output_dir"
    )


def exit_status(status: int) -> int:
    """``status``, for ``sys.exit`` at the end of a ``__main__`` block; a multi-process CPU run
    whose gloo worker threads outlive its process group ends here instead, without finalising
    the interpreter (:func:`areal_m2po.utils.dist.exit_status_after_run`: finalising can abort
    it with SIGABRT after its work is done). Never call it from library code or a test process:
    it may end the process."""
    if "torch.distributed" not in sys.modules:  # --help, --print-config, a bad config
        return status
    from areal_m2po.utils.dist import exit_status_after_run

    return exit_status_after_run(status)
