"""save_total_limit and a re-save killed between its renames, on folders alone (rlft.train.checkpoint)."""

from pathlib import Path

from rlft.train.checkpoint_folders import clean_staging, list_checkpoints, pruned


def _folders(root: Path, *steps: int) -> list[Path]:
    for step in steps:
        (root / f"checkpoint-{step}").mkdir()
    return list_checkpoints(root)


def test_the_newest_are_kept_and_never_the_one_just_written(tmp_path):
    checkpoints = _folders(tmp_path, 100, 150, 200)
    assert [p.name for p in pruned(checkpoints, tmp_path / "checkpoint-200", 200, 2)] == ["checkpoint-100"]
    assert [p.name for p in pruned(checkpoints, tmp_path / "checkpoint-200", 200, 1)] == ["checkpoint-100", "checkpoint-150"]


def test_a_limit_below_zero_keeps_every_earlier_checkpoint(tmp_path):
    """save_total_limit: -1 (Cosmos-RL's max_keep: -1): nothing of this run is removed; a rolled-back run's later
    checkpoints still go, which `auto` would otherwise take up after a crash."""
    checkpoints = _folders(tmp_path, 100, 150, 200, 250)
    assert pruned(checkpoints, tmp_path / "checkpoint-250", 250, -1) == []
    assert [p.name for p in pruned(checkpoints, tmp_path / "checkpoint-150", 150, -1)] == ["checkpoint-200", "checkpoint-250"]


def test_a_rolled_back_runs_later_checkpoints_go_first(tmp_path):
    """Resumed from checkpoint-100 while checkpoint-200 of the abandoned continuation exists: the save at 150 keeps
    itself (and with a limit of 2 the checkpoint it resumed from), and removes checkpoint-200, which `auto` would pick
    after a crash. (Ordered by step, the save at 150 deleted itself and kept checkpoint-200.)"""
    checkpoints = _folders(tmp_path, 100, 150, 200)
    saved = tmp_path / "checkpoint-150"
    assert [p.name for p in pruned(checkpoints, saved, 150, 1)] == ["checkpoint-200", "checkpoint-100"]
    assert [p.name for p in pruned(checkpoints, saved, 150, 2)] == ["checkpoint-200"]


def test_a_resave_killed_between_its_renames_is_settled(tmp_path):
    """Re-saving step N moves checkpoint-N aside, renames the new one in, then removes the old: killed after the first
    rename, the old one goes back; killed after the second, the old one is removed."""
    (tmp_path / ".old-checkpoint-40-123").mkdir()
    (tmp_path / ".old-checkpoint-40-123" / "marker").write_text("old")
    (tmp_path / ".old-checkpoint-60-77").mkdir()
    (tmp_path / "checkpoint-60").mkdir()
    (tmp_path / ".tmp-checkpoint-80").mkdir()
    clean_staging(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-40", "checkpoint-60"]
    assert (tmp_path / "checkpoint-40" / "marker").read_text() == "old"
