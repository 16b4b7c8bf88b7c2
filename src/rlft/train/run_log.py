"""The run's metrics.jsonl as training starts: a fresh run sets an earlier run's files aside, a resumed one cuts the
log back to the step it resumes from (what was logged after it is trained, and logged, again)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from rlft.train.best import check_logged_metric
from rlft.train.checkpoint import checkpoint_problem
from rlft.train.checkpoint_folders import set_aside_earlier_run, set_aside_later_checkpoints
from rlft.train.metrics import MetricsLog


def open_metrics_log(cfg, output_dir: Path, resume_from: Path | None, step: int, moved: bool, main: bool,
                     console: Console) -> MetricsLog:
    """`step`: the resumed checkpoint's; `moved`: that checkpoint is another folder's; `main`: the main process (the
    only one that writes)."""
    log = MetricsLog(cfg, output_dir, enabled=main)
    if resume_from is not None:  # every process, before the log is cut back: a refused resume changes nothing
        check_logged_metric(cfg, log.path)
    if main and resume_from is None and (aside := set_aside_earlier_run(output_dir)):  # with its metrics.jsonl
        resumable = any(checkpoint_problem(path) is None for path in aside.glob("checkpoint-*"))
        console.print(f"note: {output_dir} held an earlier run's checkpoints: moved to {aside} ("
                      + ("to go on with that run, resume from there)" if resumable else
                         "they cannot resume: a new run can start from their weights)"), markup=False, soft_wrap=True)
    elif main and resume_from is not None:  # what was logged after the checkpoint is trained again: log it once
        if not moved and (aside := set_aside_later_checkpoints(output_dir, step)):
            console.print(f"note: {output_dir} held checkpoints after step {step}, the continuation this run "
                          f"replaces: moved to {aside}, with the logs as they were", markup=False, soft_wrap=True)
        log.truncate_after(step)
    if main and resume_from is None and log.path.exists():  # a run that saved nothing: keep its log aside, do not mix
        log.path.rename(log.path.with_name("metrics.previous.jsonl"))
    return log
