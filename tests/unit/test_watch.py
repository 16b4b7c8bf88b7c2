"""loss_watchdog_* and early_stopping_patience (Axolotl's run guards), by hand."""

from __future__ import annotations

from types import SimpleNamespace

from rlft.train.watch import RunGuards


def guards(threshold=None, patience=None, early=None, state=None):
    cfg = SimpleNamespace(loss_watchdog_threshold=threshold, loss_watchdog_patience=patience, early_stopping_patience=early)
    return RunGuards(cfg, state)


def test_watchdog_needs_patience_steps_in_a_row():
    g = guards(threshold=2.0, patience=3)
    assert [g.loss_breakdown(x) is not None for x in (3.0, 3.0, 1.0, 3.0, 3.0)] == [False] * 5  # a low step resets
    assert "above loss_watchdog_threshold=2.0 for 3 steps in a row" in g.loss_breakdown(2.5)


def test_watchdog_default_patience_is_three_and_off_without_a_threshold():
    g = guards(threshold=1.0)
    assert [g.loss_breakdown(5.0) is not None for _ in range(3)] == [False, False, True]
    assert guards().loss_breakdown(1e9) is None


def test_early_stopping_counts_evaluations_without_improvement():
    g = guards(early=2)
    assert [g.stop_early({"eval/loss": v}) for v in (1.0, 0.9, 0.95, 0.9, 0.8, 0.85, 0.85)] == \
        [False, False, False, True, False, False, True]
    assert guards().stop_early({"eval/loss": 1.0}) is False and g.stop_early({}) is False


def test_counters_survive_a_resume():
    g = guards(threshold=1.0, patience=2, early=2)
    g.loss_breakdown(5.0)
    g.stop_early({"eval/loss": 1.0})
    g.stop_early({"eval/loss": 1.5})
    resumed = guards(threshold=1.0, patience=2, early=2, state=g.state_dict())
    assert resumed.loss_breakdown(5.0) is not None and resumed.stop_early({"eval/loss": 1.2}) is True
