"""Streamed SFT data (`rlft.data.stream`): pretrain pieces, packing, the global micro-batch sequence and each process's
share of it, resuming (also with another process count), epochs, and bad rows."""

import json
import random

import pytest

from rlft.config import build_config
from rlft.data.stream import StreamedBatches, pack, preview
from rlft.errors import ConfigError, DataError

WORDS = "the cat sat on a mat while dogs ran in the park and birds sang over old trees".split()


def _corpus(path, rows=60, seed=0):
    chooser = random.Random(seed)
    path.write_text("".join(json.dumps({"text": " ".join(chooser.choice(WORDS) for _ in range(chooser.randint(3, 40))),
                                        "n": i}) + "\n" for i in range(rows)))
    return path


def _cfg(tmp_path, **overrides):
    config = {"base_model": "m", "pretraining_dataset": [{"path": str(_corpus(tmp_path / "corpus.jsonl")), "type": "pretrain"}],
              "sequence_len": 16, "micro_batch_size": 3, "gradient_accumulation_steps": 2, "max_steps": 10,
              "sample_packing": True, "streaming_multipack_buffer_size": 7, "seed": 4}
    config.update(overrides)
    return build_config(config)


def _collate(items):
    return items  # the items themselves: tests compare what each micro-batch holds


def _key(batches):
    return json.dumps(batches)


def test_pretrain_text_is_cut_into_consecutive_pieces_with_the_end_token(tmp_path, gpt2_tokenizer):
    text = " ".join(WORDS * 3)
    (tmp_path / "one.jsonl").write_text(json.dumps({"body": text}) + "\n")
    cfg = build_config({"base_model": "m", "pretraining_dataset": [{"path": str(tmp_path / "one.jsonl"), "text_column": "body"}],
                        "sequence_len": 16, "max_steps": 1, "micro_batch_size": 1, "shuffle_merged_datasets": False})
    examples, line = preview(cfg, gpt2_tokenizer)
    ids = gpt2_tokenizer(text)["input_ids"] + [gpt2_tokenizer.eos_token_id]
    assert len(ids) > 40  # several pieces
    assert [e["input_ids"] for e in examples] == [ids[i : i + 16] for i in range(0, len(ids), 16) if len(ids[i : i + 16]) > 1]
    assert all(e["labels"] == e["input_ids"] for e in examples)
    assert f"cut into {len(examples)} pieces" in line and "1 kept" in line


def test_pack_fills_rows_first_fit_and_never_overfills():
    examples = [{"input_ids": [0] * n, "labels": [0] * n} for n in (10, 6, 16, 5, 1, 3, 12, 4)]
    packs = pack(examples, 16)
    assert [[len(e["input_ids"]) for e in p] for p in packs] == [[10, 6], [16], [5, 1, 3, 4], [12]]
    assert sorted(id(e) for p in packs for e in p) == sorted(id(e) for e in examples)


def test_each_process_trains_its_share_of_the_one_process_sequence(tmp_path, gpt2_tokenizer):
    cfg = _cfg(tmp_path)
    one = StreamedBatches(cfg, gpt2_tokenizer, _collate)
    ranks = [StreamedBatches(cfg, gpt2_tokenizer, _collate, (rank, 2)) for rank in range(2)]
    for _ in range(5):
        single = one.step(2) + one.step(2)  # one process, two steps: the micro-batches two processes train in one
        shares = [r.step(2) for r in ranks]
        assert single == [shares[k % 2][k // 2] for k in range(4)]
    assert len({_key(b) for b in single}) == 4


@pytest.mark.parametrize("steps", [1, 2, 3, 7])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_resumed_stream_continues_with_the_same_micro_batches(steps, world, tmp_path, gpt2_tokenizer):
    """Written after `steps` steps of one process (mid-buffer, at a buffer's end, across the epoch's end), continued
    by `world` processes: together they train what the one process would have."""
    cfg = _cfg(tmp_path)
    straight = StreamedBatches(cfg, gpt2_tokenizer, _collate)
    for _ in range(steps):
        straight.step(2)
    state = json.loads(json.dumps(straight.state_dict()))  # as the checkpoint's JSON holds it
    expected = [straight.step(2) for _ in range(world * 3)]
    resumed = [StreamedBatches(cfg, gpt2_tokenizer, _collate, (rank, world)) for rank in range(world)]
    for stream in resumed:
        stream.load_state_dict(state)
    for step in range(3):
        shares = [stream.step(2) for stream in resumed]
        flat = [batch for s in expected[step * world : (step + 1) * world] for batch in s]
        assert flat == [shares[k % world][k // world] for k in range(2 * world)]
    assert resumed[0].state_dict() == straight.state_dict() or world > 1  # one process: the same position and counts


def test_the_stream_starts_over_at_its_end_in_a_new_order(tmp_path, gpt2_tokenizer):
    cfg = _cfg(tmp_path, streaming_multipack_buffer_size=1000, micro_batch_size=1, gradient_accumulation_steps=1)
    stream = StreamedBatches(cfg, gpt2_tokenizer, _collate)
    first = [_key(stream.step(1))]
    count = len(stream._buffer)  # the whole file is one buffer
    first += [_key(stream.step(1)) for _ in range(count - 1)]
    assert stream.position.epoch == 0 and stream.counts.rows == 60
    second = [_key(stream.step(1)) for _ in range(count)]
    assert stream.position.epoch == 1 and stream.epochs_done == 1.0 and stream.counts.rows == 120
    assert sorted(first) == sorted(second) and first != second  # the same packs in another order


def test_shuffle_off_keeps_the_files_order_and_skip_and_slice_choose_rows(tmp_path, gpt2_tokenizer):
    corpus = tmp_path / "rows.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(20)))
    cfg = build_config({"base_model": "m", "max_steps": 1, "micro_batch_size": 1, "sequence_len": 16,
                        "shuffle_merged_datasets": False,
                        "pretraining_dataset": [{"path": str(corpus), "split": "train[:12]", "skip": 3}]})
    stream = StreamedBatches(cfg, gpt2_tokenizer, _collate)
    texts = [gpt2_tokenizer.decode(stream.step(1)[0][0]["input_ids"][:-1]) for _ in range(10)]
    assert texts == [f"row {i}" for i in range(3, 12)] + ["row 3"]  # rows 3-11, then the next epoch


def test_several_datasets_are_read_in_turn(tmp_path, gpt2_tokenizer):
    for name in "ab":
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": f"{name}{i}?", "completion": f" {i}"}) + "\n"
                                                        for i in range(3 if name == "a" else 1)))
    cfg = build_config({"base_model": "m", "streaming": True, "max_steps": 1, "micro_batch_size": 1, "sequence_len": 16,
                        "shuffle_merged_datasets": False,
                        "datasets": [{"path": str(tmp_path / "a.jsonl")}, {"path": str(tmp_path / "b.jsonl")}]})
    stream = StreamedBatches(cfg, gpt2_tokenizer, _collate)
    prompts = [gpt2_tokenizer.decode(stream.step(1)[0][0]["input_ids"]).split("?")[0] for _ in range(4)]
    assert prompts == ["a0", "b0", "a1", "a2"]


def test_packs_attend_across_with_pretrain_multipack_attn_false(tmp_path, gpt2_tokenizer):
    cfg = _cfg(tmp_path, pretrain_multipack_attn=False)
    batches = StreamedBatches(cfg, gpt2_tokenizer, _collate).step(1)
    assert all(len(item) == 1 and len(item[0]["input_ids"]) <= 16 for batch in batches for item in batch)
    packed = StreamedBatches(_cfg(tmp_path), gpt2_tokenizer, _collate).step(1)
    assert [[sum(len(e["input_ids"]) for e in item) for item in b] for b in packed] == \
        [[len(item[0]["input_ids"]) for item in b] for b in batches]


def test_bad_rows_and_empty_streams_name_the_place(tmp_path, gpt2_tokenizer):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "no text"}) + "\n")
    cfg = _cfg(tmp_path, pretraining_dataset=[{"path": str(bad)}])
    with pytest.raises(DataError, match=r"pretraining_dataset\[0\] .*line 2: no text in column 'text' \(the row's columns: body\)"):
        StreamedBatches(cfg, gpt2_tokenizer, _collate).step(1)
    bad.write_text(json.dumps({"text": "fine"}) + "\n{oops\n")
    with pytest.raises(DataError, match="line 2 is not valid JSON"):
        StreamedBatches(cfg, gpt2_tokenizer, _collate).step(1)
    bad.write_text("")
    with pytest.raises(DataError, match="gave no training rows: 0 rows read, 0 dropped$"):
        StreamedBatches(cfg, gpt2_tokenizer, _collate).step(1)
    short = _cfg(tmp_path, pretraining_dataset=[{"path": str(bad), "split": "train[:10%]"}])
    with pytest.raises(DataError, match=r"cannot be read from a stream"):
        StreamedBatches(short, gpt2_tokenizer, _collate)
    missing = _cfg(tmp_path, pretraining_dataset=[{"path": str(tmp_path / "gone.jsonl")}])
    with pytest.raises(DataError, match="does not exist|not found|not a local file"):
        StreamedBatches(missing, gpt2_tokenizer, _collate).step(1)


def test_a_stream_whose_rows_are_all_dropped_stops_with_the_counts(tmp_path, gpt2_tokenizer):
    rows = tmp_path / "long.jsonl"
    rows.write_text("".join(json.dumps({"prompt": "q " * 40, "completion": "a"}) + "\n" for _ in range(5)))
    cfg = build_config({"base_model": "m", "streaming": True, "max_steps": 1, "sequence_len": 16,
                        "datasets": [{"path": str(rows)}], "streaming_multipack_buffer_size": 2})
    with pytest.raises(DataError, match=r"10 rows read, 10 dropped \(10 longer than sequence_len=16 \(excess_length_strategy: drop"):
        StreamedBatches(cfg, gpt2_tokenizer, _collate).step(1)


@pytest.mark.parametrize("overrides, words", [
    ({"max_steps": None}, "set max_steps"),
    ({"rl": "dpo"}, "built for SFT, not dpo"),
    ({"val_set_size": 0.1}, "set test_datasets"),
    ({"group_by_length": True}, "remove group_by_length"),
    ({"dataset_prepared_path": "prepared"}, "remove dataset_prepared_path"),
    ({"datasets": [{"path": "x.jsonl"}]}, "pretraining_dataset and datasets are both set"),
    ({"pretraining_dataset": [{"path": "a"}, {"path": "b"}]}, "lists 2 datasets and rlft streams one"),
    ({"pretraining_dataset": [{"path": "a", "skip": -1}]}, r"skip: must be >= 0, got -1"),
    ({"streaming_multipack_buffer_size": 0}, r"streaming_multipack_buffer_size: must be >= 1"),
])
def test_impossible_streamed_configs_are_refused(overrides, words, tmp_path):
    config = {"base_model": "m", "pretraining_dataset": [{"path": "corpus.jsonl"}], "max_steps": 5}
    config.update(overrides)
    with pytest.raises(ConfigError, match=words):
        build_config(config)


def test_axolotls_short_form_and_keys_validate():
    from rlft.config.axolotl_keys import unsupported_settings

    cfg = build_config({"base_model": "m", "pretraining_dataset": "allenai/c4", "max_steps": 5, "pretrain_multipack_attn": False,
                        "streaming_multipack_buffer_size": 50})
    assert cfg.streamed and cfg.pretraining_dataset[0].path == "allenai/c4" and cfg.pretraining_dataset[0].type == "pretrain"
    assert cfg.pretraining_dataset[0].text_column == "text" and cfg.pretraining_dataset[0].split == "train"
    assert unsupported_settings(cfg)[0] == []
    old = build_config({"base_model": "m", "pretraining_dataset": "c4", "max_steps": 5, "pretrain_multipack_buffer_size": 100})
    assert "rename the key" in dict(unsupported_settings(old)[0])["pretrain_multipack_buffer_size"]
