"""The loop's data for recipes that draw from a plan (`rlft.data.batches.StepBatches`): each step's micro-batches,
the next step's collated on a background thread. The same batches and checkpoint positions as drawing one by one."""

import signal
import threading

import pytest

from rlft.data.batches import BatchPlan, PlanCursor, StepBatches


def _plan(rows: int = 7, shard=(0, 1), collate=None) -> BatchPlan:
    examples = [{"input_ids": [3] * (i + 1), "labels": [3] * (i + 1)} for i in range(rows)]
    return BatchPlan(examples, 2, seed=5, pad_id=0, shard=shard, seed_batches=True, collate=collate)


@pytest.mark.parametrize("ahead", [True, False])
@pytest.mark.parametrize("shard", [(0, 1), (1, 2)])
def test_steps_equal_drawing_one_by_one_across_epochs(shard, ahead):
    """5 rows in micro-batches of 2, 3 per step, over several epochs (on rank 1 of 2, whose second batch each epoch
    only repeats its first: padding): every batch, its sample seed and padding flag, and the position after each
    step, as the cursor drawn one at a time; collated ahead (GPU) or in the step (CPU)."""
    one_by_one = PlanCursor(_plan(5, shard=shard), epoch=1, batch_in_epoch=1)
    steps = StepBatches(PlanCursor(_plan(5, shard=shard), epoch=1, batch_in_epoch=1), 3, ahead=ahead)
    padding = []
    try:
        for _ in range(6):
            expected = [one_by_one.next() for _ in range(3)]
            batches, position = steps.next()
            assert position == (one_by_one.epoch, one_by_one.batch_in_epoch)
            assert len(batches) == 3
            for got, want in zip(batches, expected):
                assert set(got.inputs) | {"num_tokens", "padding"} == set(want) | {"num_tokens", "padding"}
                assert got.inputs["sample_seed"] == want["sample_seed"] and got.num_tokens == want["num_tokens"]
                assert got.padding == bool(want.get("padding"))
                padding.append(got.padding)
                assert got.inputs["input_ids"].tolist() == want["input_ids"].tolist()
        assert any(padding) == (shard == (1, 2))
    finally:
        steps.close()


def test_the_next_step_is_collated_on_another_thread_while_this_one_runs():
    """After a step is handed out, the following one is already on its way, built off the loop's thread."""
    threads, started = [], threading.Event()

    def collate(rows):
        threads.append(threading.current_thread().name)
        started.set()
        return {"rows": len(rows), "num_tokens": 0}

    steps = StepBatches(PlanCursor(_plan(collate=collate)), 2)
    try:
        steps.next()
        assert started.wait(5)
        deadline = threading.Event()
        for _ in range(50):  # the second step's two batches, collated without being asked for
            if len(threads) == 4:
                break
            deadline.wait(0.1)
        assert len(threads) == 4
        assert all(name.startswith("rlft-batches") for name in threads)
    finally:
        steps.close()


def test_on_a_cpu_each_step_is_collated_when_asked_for_in_the_callers_thread():
    """ahead=False: nothing is collated before `next` asks, and nothing off the caller's thread (a collating thread
    would take the cores the step computes on)."""
    threads = []
    collate = lambda rows: threads.append(threading.current_thread().name) or {"num_tokens": 0}  # noqa: E731
    steps = StepBatches(PlanCursor(_plan(collate=collate)), 2, ahead=False)
    for count in (2, 4):
        steps.next()
        threading.Event().wait(0.2)  # time for any collation running ahead to show
        assert threads == [threading.current_thread().name] * count
    steps.close()


def test_a_collate_error_reaches_the_step_that_holds_the_row():
    """A malformed row fails the step it belongs to, raised in the loop's thread (as drawing in the loop did)."""
    def collate(rows):
        if any(len(r["input_ids"]) == 3 for r in rows):
            raise ValueError("row of 3")
        return {"rows": len(rows), "num_tokens": 0}

    cursor = PlanCursor(_plan(collate=collate))
    order = [len(r["input_ids"]) for batch in cursor.plan.epoch_order(0) for r in (cursor.plan.items[i] for i in batch)]
    bad_step = order.index(3) // 2  # micro-batches of 2, one per step
    steps = StepBatches(cursor, 1)
    try:
        for _ in range(bad_step):
            steps.next()
        with pytest.raises(ValueError, match="row of 3"):
            steps.next()
    finally:
        steps.close()


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")
def test_ctrl_c_and_sigterm_go_to_the_main_thread():
    """The collating thread blocks SIGINT and SIGTERM: the kernel hands them to the main thread, where the loop's
    handlers are and whose waits they must interrupt."""
    masks = []
    steps = StepBatches(PlanCursor(_plan(collate=lambda rows: masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))
                                         or {"rows": len(rows), "num_tokens": 0})), 1)
    try:
        steps.next()
    finally:
        steps.close()
    assert masks and {signal.SIGINT, signal.SIGTERM} <= masks[0]
