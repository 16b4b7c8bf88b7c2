"""The checkpoint-N folders of an output_dir: which there are, which `save_total_limit` removes, the leftovers of a
save that was killed, and an earlier run's checkpoints set aside for a fresh run."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

_NAME = re.compile(r"^checkpoint-(\d+)$")


def list_checkpoints(output_dir: Path) -> list[Path]:
    """checkpoint-N folders, oldest first (by N)."""
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def pruned(checkpoints: list[Path], saved: Path, step: int, keep: int, protect: Path | None = None) -> list[Path]:
    """The checkpoints `save_total_limit` (`keep`) removes after `saved` (at `step`): never `saved` itself, and first
    those of steps after it, which a run resumed from an earlier checkpoint left behind (an abandoned continuation
    that `--resume_from_checkpoint=auto` would otherwise pick up later), then the oldest. Never `protect` either (the
    best checkpoint of load_best_model_at_end), which counts towards `keep`: with a limit of 1 it stays beside
    `saved`, as in transformers. `keep` -1 (`save_total_limit: -1`) keeps every earlier one."""
    later = [p for p in checkpoints if _step_of(p) > step]
    if keep < 0:
        return later
    earlier = [p for p in checkpoints if _step_of(p) < step]
    kept = [p for p in earlier if protect is None or p.name != protect.name]
    room = max(0, keep - 1 - (len(kept) < len(earlier)))
    return later + kept[: max(0, len(kept) - room)]


def _step_of(folder: Path) -> int:
    return int(_NAME.match(folder.name).group(1))


def set_aside_earlier_run(output_dir: Path) -> Path | None:
    """A fresh run in an `output_dir` that holds an earlier run's checkpoints moves them (and its metrics.jsonl and
    completions.jsonl, so that the run can go on from there) into `previous-run-<date>-<time>/`: this run's saves would
    overwrite those of equal steps and `save_total_limit` prune them, and `resume_from_checkpoint: auto` would later
    take the earlier run's newest up as this one's. Returns the folder, None when there was nothing to move."""
    earlier = [path for path in output_dir.glob("checkpoint-*") if _NAME.match(path.name) and path.is_dir()]
    if not earlier:
        return None
    folder = _new_folder(output_dir, "previous-run")
    for path in earlier + [output_dir / "metrics.jsonl", output_dir / "completions.jsonl"]:
        if path.exists():
            path.rename(folder / path.name)
    return folder


def set_aside_later_checkpoints(output_dir: Path, step: int) -> Path | None:
    """A run resumed from an older checkpoint than its newest (rolled back) moves the later ones, with a copy of its
    logs as they were, into `rolled-back-<date>-<time>/`: the log is cut back to `step` at once, and should this run
    stop before its first save, `resume_from_checkpoint: auto` must not take up the abandoned continuation. Returns
    the folder, None when there was nothing to move."""
    later = [path for path in list_checkpoints(output_dir) if _step_of(path) > step]
    if not later:
        return None
    folder = _new_folder(output_dir, "rolled-back")
    for path in later:
        path.rename(folder / path.name)
    for name in ("metrics.jsonl", "completions.jsonl"):
        if (output_dir / name).exists():
            shutil.copy2(output_dir / name, folder / name)
    return folder


def _new_folder(output_dir: Path, prefix: str) -> Path:
    stamp, number = time.strftime("%Y%m%d-%H%M%S"), 1
    folder = output_dir / f"{prefix}-{stamp}"
    while folder.exists():
        number += 1
        folder = output_dir / f"{prefix}-{stamp}-{number}"
    folder.mkdir()
    return folder


def clean_staging(output_dir: Path) -> None:
    """Remove `.tmp-checkpoint-*` folders left by a run killed mid-save (rank 0, before any save), and settle a re-save
    of one step killed between its two renames: the former `checkpoint-N` (moved to `.old-checkpoint-N-<pid>`) goes
    back in place if no new one took it, else it is removed."""
    if output_dir.is_dir():
        for leftover in output_dir.glob(".tmp-checkpoint-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        for old in output_dir.glob(".old-checkpoint-*"):
            final = output_dir / old.name[len(".old-"):].rsplit("-", 1)[0]
            if final.exists():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.rename(final)
