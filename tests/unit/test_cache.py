"""dataset_prepared_path with several processes on a node: the first writes the entry, the others wait and read it."""

import threading
import time

import pytest

import rlft.data.cache as cache


def test_the_other_processes_of_a_node_wait_for_the_first_and_read_its_entry(config, tok, write_jsonl, tmp_path, monkeypatch):
    from rlft.data.prepare import prepare_sft_data

    data = write_jsonl([{"prompt": f"{i}+1=", "completion": str(i + 1)} for i in range(6)], "train.jsonl")
    cfg = config(datasets=[{"path": str(data)}], dataset_prepared_path=str(tmp_path / "prepared"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert cache._local_rank() == 1
    got, entered = {}, threading.Event()
    wait_for = cache._wait_for
    monkeypatch.setattr(cache, "_wait_for", lambda path: (entered.set(), wait_for(path)))
    waiting = threading.Thread(target=lambda: got.update(data=prepare_sft_data(cfg, tok)), daemon=True)
    waiting.start()
    assert entered.wait(timeout=30)  # it decided to wait (as LOCAL_RANK 1) before this thread plays the first process
    time.sleep(0.5)
    assert waiting.is_alive() and not (tmp_path / "prepared").exists()  # waits, and tokenises nothing itself
    monkeypatch.setenv("LOCAL_RANK", "0")  # the node's first process
    first = prepare_sft_data(cfg, tok)
    waiting.join(timeout=30)
    assert not waiting.is_alive() and got["data"].train == first.train
    assert len(list((tmp_path / "prepared").iterdir())) == 1
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert cache._local_rank() == 0  # one process: LOCAL_RANK alone means nothing


@pytest.mark.parametrize("training_only", [
    {"profiler": {"enable_profiler": True, "sub_profiler_config": {"active_steps": 3}}},
    {"profiler_steps": 3, "profiler_steps_start": 2},
    {"validation": {"enable": True, "datasets": [{"path": "held_out.jsonl"}], "n_generation": 4, "temperature": 0.7}},
])
def test_keys_that_only_steer_training_keep_the_cache_key(config, tok, training_only):
    """The profiler records steps and `validation:` tokenises its own prompts apart from the cached data: neither
    changes the prepared rows, so neither may make a run tokenise them again."""
    grpo = {"rl": "grpo", "micro_batch_size": 8, "datasets": [{"path": "p.jsonl"}]}
    assert cache.cache_key(config(**grpo), tok) == cache.cache_key(config(**grpo, **training_only), tok)
