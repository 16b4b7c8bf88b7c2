"""loss_watchdog_* and early_stopping_patience (Axolotl's run guards), by hand."""

from __future__ import annotations

from types import SimpleNamespace

from rlft.train.watch import RunGuards


def guards(threshold=None, patience=None, early=None, state=None, metric=None, higher=None):
    cfg = SimpleNamespace(loss_watchdog_threshold=threshold, loss_watchdog_patience=patience, early_stopping_patience=early,
                          metric_for_best_model=metric, greater_is_better=higher)
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


def test_early_stopping_watches_metric_for_best_model():
    g = guards(early=1, metric="accuracy")  # higher is better for a name that does not end in "loss"
    assert [g.stop_early({"eval/loss": 1.0, "eval/accuracy": v}) for v in (0.5, 0.6, 0.6)] == [False, False, True]
    g = guards(early=1, metric="eval_perplexity", higher=False)
    assert [g.stop_early({"eval/perplexity": v}) for v in (9.0, 8.0, 8.5)] == [False, False, True]


def test_early_stopping_on_a_metric_the_evaluation_lacks_says_what_it_has():
    """GRPO evaluates eval/reward, no eval/loss: refused at the baseline evaluation, before the first step."""
    import pytest

    from rlft.errors import ConfigError

    with pytest.raises(ConfigError, match=r"early_stopping_patience watches eval/loss, .* \(it reports eval/reward\)"):
        guards(early=2).stop_early({"eval/reward": 0.5})


def test_the_metric_is_checked_at_every_evaluation_and_counters_of_another_metric_are_dropped():
    import pytest

    from rlft.errors import ConfigError

    with pytest.raises(ConfigError, match="early_stopping_patience watches eval/loss"):
        guards(early=2).check({"eval/reward": 0.1})  # the baseline evaluation, before the first step
    guards().check({"eval/reward": 0.1})  # no early stopping: nothing watched
    g = guards(early=3)
    g.stop_early({"eval/loss": 1.0})
    g.stop_early({"eval/loss": 2.0})
    assert guards(early=3, state=g.state_dict()).stale == 1
    other = guards(early=3, state=g.state_dict(), metric="accuracy")  # resumed watching another metric
    assert (other.best, other.stale) == (None, 0)
    older = guards(early=3, state={"high": 0, "best": 1.0, "stale": 1})  # a checkpoint from before the metric was stored
    assert (older.best, older.stale) == (1.0, 1)
