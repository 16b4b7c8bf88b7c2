"""`rlft preprocess` reports rows kept, dropped and truncated per dataset, with token-length statistics."""

import re


def test_preprocess_reports_counts(cli, capsys, make_config, tmp_path):
    data = tmp_path / "mixed.jsonl"
    rows = ['{"prompt": "1+1=", "completion": "2"}'] * 5 + ['{"prompt": "' + "9" * 40 + '", "completion": "x"}'] * 2
    data.write_text("\n".join(rows) + "\n")
    assert cli("preprocess", make_config(datasets=[{"path": str(data)}], sequence_len=16)) == 0
    out = capsys.readouterr().out
    assert "mixed.jsonl" in out.replace("\n", "").replace("│", "").replace(" ", "")
    # 7 rows, 5 kept, 2 too long, none without target or truncated; each kept row is 4 + 1 + eos = 6 tokens
    assert re.search(r"│ 7 +│ 5 +│ 2 too long +│ 0 +│ 6/6.0/6/6", out), out
    assert "train rows: 5, eval rows: 0" in out


def test_preprocess_debug_shows_each_token_and_whether_it_is_trained(cli, capsys, make_config, tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]}\n' * 4)
    config = make_config(datasets=[{"path": str(data), "type": "chat_template"}], sequence_len=64)
    assert cli("--debug", "preprocess", config, "--debug-num-examples", "1") == 0
    out = capsys.readouterr().out
    # ChatML with the byte tokenizer: the answer "2" and its <|im_end|> are the 2 trained tokens of 26
    assert "row 0: 26 tokens, 2 trained" in out and "row 1" not in out, out
    assert "'2'(50) '<|im_end|>'(259)" in " ".join(out.split())


def test_a_sequence_len_beyond_the_models_context_is_refused_before_any_work(cli, capsys, make_config):
    # the tiny test model has 128 positions
    assert cli("preprocess", make_config(sequence_len=4096)) == 1
    assert "sequence_len 4096 is longer than the model's context of 128 tokens (max_position_embeddings" in capsys.readouterr().err
    assert cli("train", make_config(sequence_len=4096)) == 1
    out = capsys.readouterr()
    assert "longer than the model's context" in out.err and "rlft train" not in out.out  # before the plan


def test_preprocess_with_nemo_gym_on_says_where_its_prompts_come_from(cli, capsys, make_config):
    """With NeMo Gym the prompts are nemo_gym_datasets' tasks, routed by the running Gym servers; preprocess used to
    prepare datasets: instead and fail on an empty list with advice about sequence_len."""
    config = make_config(rl="grpo", micro_batch_size=8, max_steps=1, sequence_len=None, plugins=["axolotl.integrations.nemo_gym.NemoGymPlugin"],
                         nemo_gym_auto_start=False, nemo_gym_datasets=[{"path": "tasks.jsonl", "server_name": "math"}],
                         trl={"num_generations": 4, "reward_funcs": ["axolotl.integrations.nemo_gym.rewards.reward_env"]})
    assert cli("preprocess", config) == 1
    assert "rlft preprocess prepares datasets:, and with NeMo Gym on the prompts are nemo_gym_datasets' tasks" in \
        " ".join(capsys.readouterr().err.split())
