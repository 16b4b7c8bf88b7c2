"""Streamed SFT data (`rlft.data.stream`): pretrain pieces, packing, the global micro-batch sequence and each process's
share of it, resuming (also with another process count), epochs, and bad rows."""

import json
import random

import pytest

from rlft.config import build_config
from rlft.data.collate import pack_examples
from rlft.data.stream import StreamedBatches, preview
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


def test_pretrain_text_is_cut_into_pieces_that_share_one_token_and_train_each_once(tmp_path, gpt2_tokenizer):
    text = " ".join(WORDS * 3)
    (tmp_path / "one.jsonl").write_text(json.dumps({"body": text}) + "\n")
    cfg = build_config({"base_model": "m", "pretraining_dataset": [{"path": str(tmp_path / "one.jsonl"), "text_column": "body"}],
                        "sequence_len": 16, "max_steps": 1, "micro_batch_size": 1, "shuffle_merged_datasets": False})
    examples, line = preview(cfg, gpt2_tokenizer)
    ids = gpt2_tokenizer(text)["input_ids"] + [gpt2_tokenizer.eos_token_id]
    assert len(ids) > 40  # several pieces
    assert [e["input_ids"] for e in examples] == [ids[i : i + 16] for i in range(0, len(ids) - 1, 15)]
    assert all(e["labels"] == [-100] + e["input_ids"][1:] for e in examples)  # a piece's first token is context only
    assert [t for e in examples for t in e["labels"] if t != -100] == ids[1:]  # the text's tokens after its first, once
    assert f"cut into {len(examples)} pieces" in line and "1 kept" in line


def test_a_buffer_of_texts_is_tokenised_in_one_call_with_the_same_pieces(tmp_path, gpt2_tokenizer, monkeypatch):
    """Raw text is tokenised a buffer at a time (one batched call of the tokenizer), into the pieces a call per text
    gives."""
    cfg = _cfg(tmp_path, shuffle_merged_datasets=False, sample_packing=False)
    rows = [json.loads(line)["text"] for line in (tmp_path / "corpus.jsonl").read_text().splitlines()][:7]
    expected = []
    for text in rows:  # a call per text, as the pieces rule says
        ids = gpt2_tokenizer(text)["input_ids"] + [gpt2_tokenizer.eos_token_id]
        expected += [ids[i : i + 16] for i in range(0, len(ids) - 1, 15)]
    calls = []
    real = type(gpt2_tokenizer).__call__
    monkeypatch.setattr(type(gpt2_tokenizer), "__call__", lambda self, text, **kw: calls.append(text) or real(self, text, **kw))
    examples, _ = preview(cfg, gpt2_tokenizer)  # the first buffer: 7 rows
    assert [e["input_ids"] for e in examples] == expected
    assert len(calls) == 1 and calls[0] == rows


def test_texts_packed_into_one_sequence_still_train_each_token_once(tmp_path, gpt2_tokenizer):
    """pretrain_multipack_attn: false: a packed row is one document, so only its own first token loses its target in
    collate; the token a piece shares with the piece before stays context only."""
    from collections import Counter

    cfg = _cfg(tmp_path, pretrain_multipack_attn=False, streaming_multipack_buffer_size=1000, gradient_accumulation_steps=1)
    stream = StreamedBatches(cfg, gpt2_tokenizer, _collate)
    items = [item for batch in stream.step(1) for item in batch]
    while stream.position.taken < len(stream._buffer):  # the whole file is one buffer: one epoch
        items += [item for batch in stream.step(1) for item in batch]
    assert all(len(item) == 1 for item in items) and any(len(item[0]["input_ids"]) > 16 // 2 for item in items)
    targets = Counter(t for item in items for t in item[0]["labels"][1:] if t != -100)
    texts = [json.loads(line)["text"] for line in (tmp_path / "corpus.jsonl").read_text().splitlines()]
    expected = Counter(t for text in texts for t in (gpt2_tokenizer(text)["input_ids"] + [gpt2_tokenizer.eos_token_id])[1:])
    assert targets == expected


def test_pack_fills_rows_first_fit_and_never_overfills():
    """A buffer is packed as rows read whole are (rlft.data.collate.pack_examples: full packs leave the search)."""
    examples = [{"input_ids": [0] * n, "labels": [0] * n} for n in (10, 6, 16, 5, 1, 3, 12, 4)]
    packs = [[examples[i] for i in pack] for pack in pack_examples(examples, 16)]
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


def test_a_resumed_stream_continues_with_the_same_micro_batches(tmp_path, gpt2_tokenizer):
    """Written after each of the first 14 steps of one process (inside a buffer, at a buffer's end, past the epoch's
    end: each happens), continued by 1, 2 and 3 processes: together they train what the one process would have, and
    they stand where it stands."""
    cfg = _cfg(tmp_path)
    _corpus(tmp_path / "corpus.jsonl", rows=10)  # an epoch of a few steps
    straight = StreamedBatches(cfg, gpt2_tokenizer, _collate)
    seen = set()
    for steps in range(1, 15):
        straight.step(2)
        seen.add("epoch" if straight.position.epoch else "buffer's end" if straight.position.taken == len(straight._buffer)
                 else "inside")
        state = json.loads(json.dumps(straight.state_dict()))  # as the checkpoint's JSON holds it
        expected = StreamedBatches(cfg, gpt2_tokenizer, _collate)
        expected.load_state_dict(state)
        for world in (1, 2, 3):
            resumed = [StreamedBatches(cfg, gpt2_tokenizer, _collate, (rank, world)) for rank in range(world)]
            for stream in resumed:
                stream.load_state_dict(state)
            reference = StreamedBatches(cfg, gpt2_tokenizer, _collate)
            reference.load_state_dict(state)
            for _ in range(2):
                shares = [stream.step(2) for stream in resumed]
                one = [batch for _ in range(world) for batch in reference.step(2)]
                assert one == [shares[k % world][k // world] for k in range(2 * world)], (steps, world)
            assert all(stream.state_dict() == reference.state_dict() for stream in resumed)
    assert seen == {"inside", "buffer's end", "epoch"}
    assert not expected.messages()


def test_a_resume_with_other_data_settings_says_so_and_restarts_the_buffer(tmp_path, gpt2_tokenizer):
    stream = StreamedBatches(_cfg(tmp_path), gpt2_tokenizer, _collate)
    stream.step(1)
    assert 0 < stream.position.taken < len(stream._buffer)
    changed = StreamedBatches(_cfg(tmp_path, micro_batch_size=2), gpt2_tokenizer, _collate)
    changed.load_state_dict(stream.state_dict())
    message = " ".join(changed.messages())
    assert "settings changed since the checkpoint (micro_batch_size)" in message and "start of the buffer" in message
    assert changed.position.taken == 0 and changed.position.rows == stream.position.rows
    assert changed.counts == stream.counts  # the buffer read again is not counted twice


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
    no_text = r"pretraining_dataset\[0\] .*line 2: no text in column 'text' \(the row's columns: body, text\)"  # text: null, as read whole
    with pytest.raises(DataError, match=no_text):
        StreamedBatches(cfg, gpt2_tokenizer, _collate).step(1)
    bad.write_text(json.dumps({"text": "fine"}) + "\n{oops\n")
    with pytest.raises(DataError, match="line 2 is not valid JSON"):
        StreamedBatches(cfg, gpt2_tokenizer, _collate).step(1)
    bad.write_text("")
    with pytest.raises(DataError, match="file is empty"):
        StreamedBatches(cfg, gpt2_tokenizer, _collate).step(1)
    bad.write_text("\n\n")
    with pytest.raises(DataError, match="gave no training rows: 0 rows read, 0 dropped$"):
        StreamedBatches(cfg, gpt2_tokenizer, _collate).step(1)
    short = _cfg(tmp_path, pretraining_dataset=[{"path": str(bad), "split": "train[:10%]"}])
    with pytest.raises(DataError, match=r"cannot be read from a stream"):
        StreamedBatches(short, gpt2_tokenizer, _collate)
    for path, words in ((str(tmp_path / "gone.jsonl"), "gone.jsonl does not exist"), ("./data/typo", "typo does not exist"),
                        ("someone/corpus", "not a local file or folder, and the hub is off")):
        with pytest.raises(DataError, match=words):
            StreamedBatches(_cfg(tmp_path, pretraining_dataset=[{"path": path}]), gpt2_tokenizer, _collate).step(1)


def test_parquet_csv_json_and_saved_datasets_stream_and_their_faults_are_data_errors(tmp_path, gpt2_tokenizer):
    from datasets import Dataset, DatasetDict

    rows = Dataset.from_dict({"text": [f"row {i}" for i in range(5)]})
    rows.to_parquet(str(tmp_path / "rows.parquet"))
    rows.to_csv(str(tmp_path / "rows.csv"), index=False)
    (tmp_path / "one.json").write_text(json.dumps({"text": "row 0"}, indent=2))  # one object, pretty-printed
    DatasetDict({"train": rows}).save_to_disk(str(tmp_path / "saved"))

    def texts(entry, count):
        cfg = _cfg(tmp_path, pretraining_dataset=[entry], shuffle_merged_datasets=False, micro_batch_size=1,
                   sample_packing=False)
        stream = StreamedBatches(cfg, gpt2_tokenizer, _collate)
        return [gpt2_tokenizer.decode(stream.step(1)[0][0]["input_ids"][:-1]) for _ in range(count)]

    for entry in ({"path": str(tmp_path / "rows.parquet")}, {"path": str(tmp_path / "rows.csv")},
                  {"path": str(tmp_path / "saved")}, {"path": str(tmp_path), "data_files": ["rows.parquet"]}):
        assert texts(entry, 6) == [f"row {i}" for i in range(5)] + ["row 0"], entry
    assert texts({"path": str(tmp_path / "one.json")}, 2) == ["row 0", "row 0"]
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "header.csv").write_text("\n")
    for entry, words in (({"path": str(tmp_path / "broken.parquet")}, "cannot read its rows"),
                         ({"path": str(tmp_path / "header.csv")}, "cannot read its rows"),
                         ({"path": str(tmp_path / "saved"), "split": "test"}, r"splits \['train'\], not 'test'")):
        with pytest.raises(DataError, match=words):
            texts(entry, 1)


def test_a_stream_whose_rows_are_all_dropped_stops_with_the_counts(tmp_path, gpt2_tokenizer):
    rows = tmp_path / "long.jsonl"
    rows.write_text("".join(json.dumps({"prompt": "q " * 40, "completion": "a"}) + "\n" for _ in range(5)))
    cfg = build_config({"base_model": "m", "streaming": True, "max_steps": 1, "sequence_len": 16,
                        "datasets": [{"path": str(rows)}], "streaming_multipack_buffer_size": 2})
    too_long = r"10 rows read, 10 dropped \(10 longer than sequence_len=16 \(excess_length_strategy: drop"
    with pytest.raises(DataError, match=too_long):
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
    ({"dataset_exact_deduplication": True}, "remove dataset_exact_deduplication"),
    ({"dataset_num_proc": 4}, "remove it"),
    ({"streaming": False}, "pretraining_dataset is always streamed"),
    ({"pretrain_multipack_attn": False}, "applies to pretraining_dataset with sample_packing"),
    ({"pretraining_dataset": [{"path": "a", "type": "alpaca", "text_column": "body"}]},
     "text_column names the text of type: pretrain"),
    ({"excess_length_strategy": "truncate"}, "never truncated or refused"),
    ({"pretraining_dataset": [{"path": "a", "field": "body"}]}, "type: pretrain reads text_column: rename it"),
    ({"pretraining_dataset": [{"path": "a", "type": "alpaca"}], "tokenizer_use_mistral_common": True},
     "dataset type alpaca with"),
    ({"pretraining_dataset": None, "datasets": [{"path": "a", "type": "pretrain"}]},
     "set streaming: true, or use type: completion"),
    ({"test_datasets": [{"path": "a", "type": "pretrain"}]}, "evaluation rows are read whole"),
    ({"pretraining_dataset": None, "datasets": [{"path": "a"}], "streaming_multipack_buffer_size": 5},
     "no data is streamed"),
    ({"pretraining_dataset": [{"path": "a", "txt_column": "x"}]}, "unknown key 'txt_column': did you mean 'text_column'"),
    ({"tokenizer_use_mistral_common": True}, r"pretraining_dataset of raw text \(type: pretrain\) with tokenizer_use_mistral"),
    ({"pretraining_dataset": None, "streaming": True, "datasets": [{"path": "a", "type": "pretrain"}],
      "tokenizer_use_mistral_common": True}, r"datasets of raw text \(type: pretrain\) with tokenizer_use_mistral_common"),
])
def test_impossible_streamed_configs_are_refused(overrides, words, tmp_path):
    config = {"base_model": "m", "pretraining_dataset": [{"path": "corpus.jsonl"}], "max_steps": 5}
    config.update(overrides)
    with pytest.raises(ConfigError, match=words):
        build_config(config)


def test_axolotls_short_form_and_keys_validate():
    from rlft.config.axolotl_keys import unsupported_settings

    cfg = build_config({"base_model": "m", "pretraining_dataset": "allenai/c4", "max_steps": 5, "pretrain_multipack_attn": False,
                        "streaming_multipack_buffer_size": 50, "sample_packing": True})
    assert cfg.streamed and cfg.pretraining_dataset[0].path == "allenai/c4" and cfg.pretraining_dataset[0].type == "pretrain"
    assert cfg.pretraining_dataset[0].text_column == "text" and cfg.pretraining_dataset[0].split == "train"
    assert unsupported_settings(cfg)[0] == []
    old = build_config({"base_model": "m", "pretraining_dataset": "c4", "max_steps": 5, "pretrain_multipack_buffer_size": 100})
    assert "rename the key" in dict(unsupported_settings(old)[0])["pretrain_multipack_buffer_size"]
    sharded = build_config({"base_model": "m", "pretraining_dataset": [{"path": "c4", "shards": 4}], "max_steps": 5})
    assert "pretraining_dataset[0].shards" in dict(unsupported_settings(sharded)[0])  # an Axolotl dataset key rlft refuses


def test_streamed_json_lines_get_the_keys_of_the_rows_before_them_as_null(tmp_path, data_config):
    """A file read whole gives every row every key of the file (null where a row lacks it); a stream gives each row the
    keys seen so far, so a transform reading row["input"] works the same streamed (the rows before carried it)."""
    from rlft.data.stream import StreamSource

    path = tmp_path / "rows.jsonl"
    path.write_text('{"instruction": "a", "input": "x", "output": "1"}\n{"instruction": "b", "output": "2"}\n')
    source = StreamSource(data_config({"path": str(path)}).datasets[0], "datasets[0]", lambda rows: rows)
    assert [row for _, row in source.rows()] == [{"instruction": "a", "input": "x", "output": "1"},
                                                {"instruction": "b", "input": None, "output": "2"}]
