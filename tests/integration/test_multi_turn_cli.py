"""Multi-turn rollouts with a Python tool through the real CLI: `rlft train` with trl.multi_turn_config on a tiny model.

A tiny random model seldom writes a tool call, so this checks the run end to end (the tool loaded, its schema in the
prompts, episodes played by the in-process engine, scored, trained on and validated) and that the multi-turn metrics
are logged; the loop's own logic is tested with a scripted engine in tests/unit/test_multi_turn.py."""

import json
import textwrap

import pytest
import yaml

from rlft.data.tokenizer import byte_tokenizer
from rlft.models.tiny import write_tiny_model
from rlft.rollout.envs.python_tools import load_tools
from rlft.train.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_grpo_with_a_python_tool_runs_and_logs_turns_and_tool_use(cli, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mt_calculator.py").write_text(textwrap.dedent('''
        def add(a: int, b: int) -> int:
            """Add two numbers.

            Args:
                a: A number.
                b: Another number.
            """
            return a + b
    '''))
    (tmp_path / "mt_scores.py").write_text(textwrap.dedent('''
        import json

        def final_answer(completions, answer, **kwargs):
            with open("seen.jsonl", "a") as seen:  # what the reward function was given, for the test to read
                seen.write(json.dumps([[message["role"] for message in c] for c in completions]) + "\\n")
            return [1.0 if a in c[-1]["content"] else 0.0 for c, a in zip(completions, answer)]
    '''))
    rows = [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)} for a in range(5) for b in range(4)]
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    model = write_tiny_model(tmp_path / "tiny", "XS", max_positions=1024)
    config = {"base_model": str(model), "random_init": True, "rl": "grpo", "datasets": [{"path": "sums.jsonl"}],
              "val_set_size": 2, "eval_steps": 2, "validation": {"enable": True, "n_generation": 2, "temperature": 1.0},
              "sequence_len": 560, "micro_batch_size": 4, "max_steps": 2,
              "learning_rate": 1e-4, "logging_steps": 1, "output_dir": str(tmp_path / "out"),
              "trl": {"num_generations": 4, "max_completion_length": 24, "reward_funcs": ["mt_scores.final_answer"],
                      "multi_turn_config": {"enable": True, "tools": ["mt_calculator.add"], "max_assistant_turns": 3}}}
    (tmp_path / "multi_turn.yaml").write_text(yaml.safe_dump(config))
    assert cli("preprocess", tmp_path / "multi_turn.yaml", "--debug") == 0
    tokenizer, [tool] = byte_tokenizer(), load_tools(["mt_calculator.add"])
    plain, shown = (len(tokenizer.apply_chat_template([{"role": "user", "content": "0+0="}], add_generation_prompt=True,
                                                      tools=tools)["input_ids"]) for tools in (None, [tool.schema]))
    assert shown > plain + 100
    assert f"row 0 prompt: {shown} tokens" in capsys.readouterr().out  # every prompt shows the tool
    assert cli("train", tmp_path / "multi_turn.yaml") == 0
    metrics = read_metrics(tmp_path / "out" / "metrics.jsonl")
    steps = [m for m in metrics if "reward" in m]
    assert len(steps) == 2
    names = {"rollout/num_turns/mean", "rollout/num_turns/min", "rollout/num_turns/max", "rollout/env_failures",
             "tools/call_frequency", "tools/failure_frequency", "tools/errors", "tools/timeouts", "tools/unknown_tools",
             "tools/malformed_calls", "rewards/final_answer/mean"}
    assert names <= set(steps[-1]), names - set(steps[-1])
    assert all(1 <= m["rollout/num_turns/min"] <= m["rollout/num_turns/max"] <= 3 for m in steps)
    assert any("eval/pass@2" in m for m in metrics)  # the validation played episodes, 2 per prompt
    seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    # every completion the reward function read was an episode's messages, ending with the model's last turn
    assert seen and all(roles and roles[-1] == "assistant" for call in seen for roles in call)
