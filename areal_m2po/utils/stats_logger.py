"""Per-step metrics: ``metrics.jsonl``, a compact console line, wandb, TensorBoard and the step
bar on a terminal (:meth:`StatsLogger.progress`).

Only the main process writes. ``metrics.jsonl`` holds one JSON object per step, each line
written whole with one write; on resume the lines of steps at or after the resume step are
dropped first, so the file never holds a duplicate or a gap. A run killed mid-write can leave a
partial last line: every reader (:func:`read_metrics`, the resume) skips it with a warning.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from typing import Any, Literal, cast

from areal_m2po.api.cli_args import StatsLoggerConfig
from areal_m2po.api.errors import ConfigError, RunError
from areal_m2po.utils.progress import HEADLINE_FIELDS, StepProgress

logger = logging.getLogger("areal_m2po.stats")

# the console line: (metric key, short label, format)
_CONSOLE_FIELDS = (
    ("reward/mean", "reward", "{:.3f}"),
    ("eval/accuracy", "eval_acc", "{:.3f}"),
    ("train/loss", "rm_loss", "{:.4f}"),
    ("train/accuracy", "rm_acc", "{:.3f}"),
    ("sft/loss", "sft_loss", "{:.4f}"),
    ("dpo/loss", "dpo_loss", "{:.4f}"),
    ("dpo/margin", "dpo_margin", "{:+.3f}"),
    ("eval/margin", "eval_margin", "{:+.3f}"),
    ("eval/perplexity", "eval_ppl", "{:.3f}"),
    ("reward/model_score", "rm_score", "{:+.3f}"),
    ("actor/loss", "loss", "{:+.4f}"),
    ("actor/grad_norm", "gnorm", "{:.3f}"),
    ("actor/clip_fraction", "clip", "{:.3f}"),
    ("m2po/masked_fraction", "m2po_mask", "{:.3f}"),
    ("actor/entropy", "ent", "{:.3f}"),
    ("timing/step_s", "t", "{:.1f}s"),
)


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``, in order (blank lines skipped).

    A last line that is not a whole JSON object (a run killed while writing it) is skipped with
    a warning naming it.

    Raises:
        ValueError: a malformed line before the last, naming ``file:line``.
    """
    return [record for record, _ in _read_lines(path)]


def _read_lines(path: str) -> list[tuple[dict[str, Any], str]]:
    """``(record, line text)`` of :func:`read_metrics`."""
    with open(path, encoding="utf-8") as fh:
        lines = [(n, line.strip()) for n, line in enumerate(fh, 1) if line.strip()]
    out = []
    for i, (lineno, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            record, problem = None, exc.msg
        else:
            problem = "not a JSON object"
        if not isinstance(record, dict):
            if i == len(lines) - 1:
                logger.warning(
                    "%s:%d: skipped a partial last line (a run killed mid-write)", path, lineno
                )
                break
            raise ValueError(f"{path}:{lineno}: invalid JSON ({problem})")
        out.append((record, line))
    return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


def check_wandb_login(wandb_config: Any) -> None:
    """``stats_logger.wandb.mode=online`` (``wandb_config``: the ``WandBConfig``) needs an API
    key: ``WANDB_API_KEY``, or the netrc entry ``wandb login`` writes for ``WANDB_BASE_URL``'s
    host; else wandb stops the run after the models load, in a long traceback.

    Raises:
        ConfigError: one line naming ``stats_logger.wandb.mode``.
    """
    if wandb_config.mode != "online" or os.environ.get("WANDB_API_KEY"):
        return
    import netrc
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        found = netrc.netrc(os.environ.get("NETRC")).authenticators(host or "")
    except (OSError, netrc.NetrcParseError):
        found = None
    if found is None:
        raise ConfigError(
            "stats_logger.wandb.mode",
            f"online needs a W&B API key and none is set (WANDB_API_KEY, or `wandb login` for "
            f"{host}); use offline (upload later with `wandb sync`) or disabled",
        )


class StatsLogger:
    """Writes the metrics of every step to the configured sinks.

    Args:
        config: the stats_logger section.
        output_dir: run directory (``metrics.jsonl`` goes there).
        run_name: display name (wandb).
        config_dict: the resolved run config (wandb).
        is_main: only the main process writes anything.
    """

    def __init__(
        self,
        config: StatsLoggerConfig,
        output_dir: str,
        run_name: str,
        config_dict: dict[str, Any] | None = None,
        is_main: bool = True,
    ) -> None:
        self.config = config
        self.output_dir = output_dir
        self.is_main = is_main
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self._wandb_run: Any = None
        self._tb: Any = None
        self._run_name = run_name
        self._config_dict = config_dict or {}
        self._figures: dict[str, float] = {}  # the last value of each headline figure
        self._progress: StepProgress | None = None

    def progress(self, total: int, initial: int) -> StepProgress:
        """The step bar around a trainer's loop of ``total`` steps from ``initial``: on the
        main process, on a terminal, unless ``progress_bar`` is off; every :meth:`log` moves it
        (:class:`~areal_m2po.utils.progress.StepProgress`)."""
        enabled = self.is_main and self.config.progress_bar
        self._progress = StepProgress(total, initial, sys.stderr, enabled, self._figures)
        return self._progress

    def start(self, resume_step: int = 0) -> None:
        """Open the sinks; with ``resume_step > 0`` drop metrics of steps >= resume_step and
        continue the wandb run of ``wandb_run_id.txt``; ``0``: a fresh run (an empty
        ``metrics.jsonl``, a new wandb run)."""
        if not self.is_main:
            return
        os.makedirs(self.output_dir, exist_ok=True)
        if self.config.jsonl:
            self._truncate_jsonl(resume_step)
        wb = self.config.wandb
        if wb.mode != "disabled":
            import wandb

            id_file = os.path.join(self.output_dir, "wandb_run_id.txt")
            run_id = None
            if resume_step > 0 and os.path.exists(id_file):
                with open(id_file) as fh:
                    run_id = fh.read().strip() or None
            # WandBConfig.mode's choices are these three (checked when the config is built)
            mode = cast(Literal["online", "offline", "disabled"], wb.mode)
            self._wandb_run = wandb.init(
                mode=mode,
                project=wb.project,
                entity=wb.entity,
                name=wb.name or self._run_name,
                group=wb.group,
                tags=wb.tags,
                config=self._config_dict,
                dir=self.output_dir,
                id=run_id,
                resume="allow",
            )
            with open(id_file, "w") as fh:
                fh.write(self._wandb_run.id)
        if self.config.tensorboard.path:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(self.config.tensorboard.path)

    def _truncate_jsonl(self, resume_step: int) -> None:
        """Keep the records of steps before ``resume_step`` (a partial last line dropped)."""
        if not os.path.exists(self.path):
            return
        if resume_step <= 0:  # a fresh run: nothing of the old file is read or kept
            open(self.path, "w").close()
            return
        try:
            lines = _read_lines(self.path)
        except ValueError as exc:
            raise RunError(f"{exc}; remove or repair that line to continue the run") from None
        kept = [line for record, line in lines if int(record.get("step", -1)) < resume_step]
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.writelines(k + "\n" for k in kept)
        os.replace(tmp, self.path)

    def log(self, step: int, stats: dict[str, float]) -> None:
        """Record the metrics of ``step`` (1-based count of finished training steps)."""
        if not self.is_main:
            return
        record = {"step": step, **{k: _jsonable(float(v)) for k, v in sorted(stats.items())}}
        if self.config.jsonl:  # one whole line per write
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
                fh.flush()
        if self._wandb_run is not None:
            self._wandb_run.log(stats, step=step)
        if self._tb is not None:
            for k, v in stats.items():
                self._tb.add_scalar(k, v, step)
        if self.config.console:
            logger.info(self.console_line(step, stats))
        self._figures.update({k: float(stats[k]) for k, _, _ in HEADLINE_FIELDS if k in stats})
        if self._progress is not None:
            self._progress.update(step, stats)

    @staticmethod
    def console_line(step: int, stats: dict[str, float]) -> str:
        parts = [f"step {step}"]
        for key, label, fmt in _CONSOLE_FIELDS:
            if key in stats:
                parts.append(f"{label}={fmt.format(stats[key])}")
        return " | ".join(parts)

    def close(self) -> None:
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
