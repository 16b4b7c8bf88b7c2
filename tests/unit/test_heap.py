"""rlft/heap.py: the collector held off during start-up, what it made frozen after, and all of it given back."""

import gc

from rlft.heap import collector_paused, release_heap


def test_a_pause_restores_the_collector_and_freezes_what_was_made_then_release_gives_it_back():
    assert gc.isenabled()
    try:
        with collector_paused():
            assert not gc.isenabled()
            made = [[index] for index in range(1000)]  # tracked objects, as imports and a model make them
        assert gc.isenabled()
        assert gc.get_freeze_count() >= len(made)
    finally:
        release_heap()
    assert gc.get_freeze_count() == 0


def test_a_pause_inside_a_disabled_collector_leaves_it_disabled():
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        release_heap()
