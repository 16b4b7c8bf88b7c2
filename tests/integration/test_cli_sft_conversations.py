"""SFT from a Cosmos-RL style dataset through the real CLI: the conversation in a column of its own name, a system prompt
set on the dataset entry. The run trains, and the rows it tokenised (the prepared data it saved, and `rlft preprocess
--debug` on the same config) lead with the system prompt, which carries no loss."""

import json
import re

from transformers import AutoTokenizer

from rlft.data.tokenize import IGNORE
from rlft.train.metrics import read_metrics

SYSTEM = "You add numbers."


def test_a_conversation_column_and_a_system_prompt_train_and_lead_every_row(make_config, cli, tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"conversation": [{"role": "user", "content": f"{a}+{a + 1}="},
                                                         {"role": "assistant", "content": str(2 * a + 1)}], "id": a}) + "\n"
                            for a in range(1, 9)))
    prepared = tmp_path / "prepared"
    config = make_config(datasets=[{"path": str(data), "type": "chat_template", "field_messages": "conversation",
                                    "system_prompt": SYSTEM}],
                         sequence_len=64, micro_batch_size=4, max_steps=2, shuffle_merged_datasets=False,
                         dataset_prepared_path=str(prepared))
    assert cli("train", config) == 0
    logged = [m for m in read_metrics(tmp_path / "out" / "metrics.jsonl") if "loss" in m]
    assert [m["step"] for m in logged] == [1, 2] and all(m["loss"] > 0 for m in logged)

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    (entry,) = prepared.glob("*/train.jsonl")  # what the run tokenised and trained on
    first = json.loads(entry.read_text().splitlines()[0])
    text = tokenizer.decode(first["input_ids"])
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n1+2=<|im_end|>\n"), text
    trained = [token for token, label in zip(first["input_ids"], first["labels"]) if label != IGNORE]
    assert tokenizer.decode(trained) == "3<|im_end|>"

    capsys.readouterr()
    assert cli("--debug", "preprocess", config, "--debug-num-examples", "1") == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert f"row 0: {len(first['input_ids'])} tokens, {len(trained)} trained" in shown, shown
    row = shown.partition("row 0:")[2].partition("┏")[0]  # the tokens, up to the report's table
    assert [int(token) for token in re.findall(r"\((\d+)\)(?= |$)", row)] == first["input_ids"]
