"""reasoning-gym example: its scorer as the reward, offline task generation, and a short GRPO run through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlft.train.metrics import read_metrics

pytestmark = pytest.mark.slow
reasoning_gym = pytest.importorskip("reasoning_gym")

EXAMPLE = "examples/reasoning_gym/basic-arithmetic.yaml"


@pytest.fixture
def tasks(monkeypatch, repo_root):
    """`examples.reasoning_gym.tasks`, importable from any working directory."""
    monkeypatch.syspath_prepend(str(repo_root))
    from examples.reasoning_gym import tasks

    return tasks


def _shipped_rows(repo_root: Path, count: int = 4) -> list[dict]:
    lines = (repo_root / "examples/reasoning_gym/data/basic_arithmetic.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines[:count]]


def _entries(tasks, repo_root: Path, count: int = 4) -> list[dict]:
    """Rows as the transform hands them to the reward function."""
    fn, map_kwargs = tasks.transform(None)
    assert map_kwargs == {"remove_columns": ["question", "answer", "metadata"]}
    return [fn(row)["entry"] for row in _shipped_rows(repo_root, count)]


def test_scorer_rewards_right_answers_only(tasks, repo_root):
    entries = _entries(tasks, repo_root)
    right = [e["answer"] for e in entries]
    assert tasks.score(right, entries) == [1.0] * len(entries)
    tagged = [f"<think>{a} it is</think> <answer> {a} </answer>" for a in right]
    assert tasks.score(tagged, entries) == [1.0] * len(entries)
    wrong = [str(int(a) + 1) for a in right]
    assert all(s < 1.0 for s in tasks.score(wrong, entries))
    assert tasks.score(["<answer>x</answer>", "?!", "", "<answer></answer>"], entries) == [0.0] * 4
    partial = tasks.score([f"{right[0]} apples"], entries[:1])[0]
    assert 0.0 < partial < 1.0  # reasoning-gym's partial credit reaches the reward unchanged
    chats = [[{"role": "assistant", "content": f"<answer>{a}</answer>"}] for a in right]
    assert tasks.score(chats, entries) == [1.0] * len(entries)
    assert tasks.score([[{"role": "assistant", "content": "nope"}]], entries[:1]) == [0.0]


def test_scorer_failure_zeroes_one_completion(tasks, repo_root, monkeypatch):
    entries = _entries(tasks, repo_root, 2)
    real = tasks._scorer(entries[0]["metadata"]["source_dataset"])

    def flaky(answer, entry):
        if answer == "boom":
            raise RuntimeError("scorer bug")
        return real(answer=answer, entry=entry)

    monkeypatch.setattr(tasks, "_scorer", lambda name: flaky)
    assert tasks.score(["boom", entries[1]["answer"]], entries) == [0.0, 1.0]


def test_transform_prompts(tasks, repo_root):
    row = _shipped_rows(repo_root, 1)[0]
    plain, _ = tasks.transform(None)
    expression = row["metadata"]["expression"].replace(" ", "")
    assert plain(row)["prompt"] == expression + "="
    chat, _ = tasks.chat_transform(None)
    messages = chat(row)["prompt"]
    assert [m["role"] for m in messages] == ["system", "user"] and messages[1]["content"] == row["question"]
    assert "<answer>" in messages[0]["content"]


def test_generator_rows_score_with_their_own_answers(tasks, tmp_path):
    out = tmp_path / "data" / "tasks.jsonl"
    config = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+", "-"],
              "allow_parentheses": False}
    tasks.main(["--task", "basic_arithmetic", "--size", "40", "--seed", "7", "--non-negative", "--output", str(out),
                "--config", json.dumps(config)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 40 and all(set(r) == {"question", "answer", "metadata"} for r in rows)
    assert all(r["metadata"]["source_dataset"] == "basic_arithmetic" and int(r["answer"]) >= 0 for r in rows)
    assert any(" - " in r["question"] for r in rows) and any(" + " in r["question"] for r in rows)
    scorer = reasoning_gym.get_score_answer_fn("basic_arithmetic")
    assert all(scorer(answer=r["answer"], entry=r) == 1.0 for r in rows)
    assert all(scorer(answer=str(int(r["answer"]) + 1), entry=r) < 1.0 for r in rows)
    again = tmp_path / "again.jsonl"
    tasks.main(["--task", "basic_arithmetic", "--size", "40", "--seed", "7", "--non-negative", "--output", str(again),
                "--config", json.dumps(config)])
    assert again.read_text() == out.read_text()  # seeded: the same file every time
    held = tmp_path / "held.jsonl"
    tasks.main(["--task", "basic_arithmetic", "--size", "20", "--seed", "8", "--output", str(held), "--exclude", str(out),
                "--config", json.dumps(config)])
    assert not {json.loads(line)["question"] for line in held.read_text().splitlines()} & {r["question"] for r in rows}


def test_shipped_files_are_what_the_header_says(repo_root):
    for name, size in (("basic_arithmetic", 500), ("basic_arithmetic_heldout", 64)):
        rows = [json.loads(line) for line in (repo_root / f"examples/reasoning_gym/data/{name}.jsonl").read_text().splitlines()]
        assert len(rows) == size
        assert all(r["metadata"]["num_terms"] == 2 and 0 <= int(r["answer"]) <= 200 for r in rows)


def test_example_trains(warm_model, cli, tmp_path, monkeypatch, repo_root):
    monkeypatch.chdir(repo_root)
    out = tmp_path / "rg"
    assert cli("train", EXAMPLE, f"--base_model={warm_model}", f"--output_dir={out}", "--max_steps=8", "--eval_steps=8",
               "--logging_steps=1") == 0
    metrics = read_metrics(out / "metrics.jsonl")
    steps = [m for m in metrics if "rewards/score/mean" in m]
    assert [m["step"] for m in steps] == list(range(1, 9))
    assert all(0.0 <= m["rewards/score/mean"] <= 1.0 for m in steps)
    assert all(m["rewards/score/failures"] == 0 for m in steps)
    assert any(m["rewards/score/mean"] > 0 for m in steps)  # the warm model gets some sums right
    evals = [m for m in metrics if "eval/reward" in m]
    assert [e["step"] for e in evals] == [0, 8] and all(0.0 <= e["eval/reward"] <= 1.0 for e in evals)
