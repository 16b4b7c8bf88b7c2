"""Cosmos-RL configs through the real CLI: Cosmos-RL's own examples validate, bad input gets one clear message,
`rlft train` refuses what rlft does not build, `--explain FILE` and `rlft convert` say what each key became."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "data" / "cosmos").glob("*.toml"))
GRPO = """\
redis = "12800"

[train]
output_dir = "{out}"
optm_lr = 1e-6
train_batch_per_replica = 32

[policy]
model_name_or_path = "{model}"
model_max_length = 256

[rollout]
n_generation = 4
max_response_length = 8

[train.train_policy]
type = "grpo"
dataset.name = "{data}"
reward_function = "boxed_math"
kl_beta = 0.0

[policy.parallelism]
tp_size = {tp}
dp_shard_size = 1
"""


@pytest.fixture
def grpo_toml(tmp_path, tiny_model_dir):
    def write(name="grpo.toml", model=None, data=None, tp=1, extra="") -> Path:
        path = tmp_path / name
        data_file = tmp_path / "math.jsonl"
        data_file.write_text('{"prompt": "1+1=", "answer": "2"}\n' * 8)
        path.write_text(GRPO.format(out=tmp_path / "out", model=model or tiny_model_dir, data=data or data_file, tp=tp) + extra)
        return path

    return write


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_cosmos_rl_examples_validate(path, cli, capsys):
    assert cli("validate", path) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    assert captured.out.strip().endswith("OK")
    assert "redis" in captured.err  # a launcher key: accepted, reported as not used


def hardware_keys(data: dict) -> list[str]:
    """The keys of a Cosmos-RL file that ask for hardware or engines rlft does not drive."""
    found = []
    for side in ("policy", "rollout"):
        parallelism = data.get(side, {}).get("parallelism", {})
        sizes = ("tp_size", "pp_size", "cp_size", "ep_size", "n_init_replicas") if side == "policy" else \
            ("pp_size", "cp_size", "ep_size", "n_init_replicas")
        found += [f"{side}.parallelism.{key}" for key in sizes if parallelism.get(key, 1) > 1]
    if data.get("rollout", {}).get("backend", "vllm") != "vllm":
        found.append("rollout.backend")
    if data.get("rollout", {}).get("quantization", "none") != "none":
        found.append("rollout.quantization")
    if data.get("train", {}).get("fp8", {}).get("enable_fp8"):
        found.append("train.fp8.enable_fp8")
    return found


HARDWARE = [path for path in EXAMPLES if hardware_keys(tomllib.loads(path.read_text()))]


@pytest.mark.parametrize("path", HARDWARE, ids=[p.name for p in HARDWARE])
def test_train_refuses_the_hardware_keys_of_cosmos_rl_examples(path, cli, capsys):
    """Before it loads anything (the hub models and datasets these files name are not read)."""
    assert cli("train", path) == 1
    err = capsys.readouterr().err
    assert "rlft does not run these Cosmos-RL settings" in err and "Traceback" not in err
    missing = [key for key in hardware_keys(tomllib.loads(path.read_text())) if f"{key} = " not in err]
    assert not missing, (missing, err)


def test_a_toml_syntax_error_names_the_line_and_column(cli, capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\noptm_lr = 1e-6\nepoch = = 2\n")
    assert cli("validate", bad) == 1
    err = capsys.readouterr().err
    assert "TOML syntax error at line 3, column 9" in err and "Traceback" not in err


def test_a_wrong_type_names_the_expected_type(cli, capsys, grpo_toml):
    path = grpo_toml(extra='\n[logging]\nlogger = "wandb"\n')
    assert cli("validate", path) == 1
    err = capsys.readouterr().err
    assert "logging.logger: expected a list of strings, got 'wandb'" in err


def test_an_unknown_key_names_the_closest_and_train_stops_on_it(cli, capsys, grpo_toml):
    path = grpo_toml(extra="\n[validation]\nenabel = true\n")
    assert cli("validate", path) == 0  # Cosmos-RL accepts and ignores unknown keys; rlft says so
    assert "did you mean 'validation.enable'?" in capsys.readouterr().err
    assert cli("train", path) == 1
    err = capsys.readouterr().err
    assert "validation.enabel" in err and "did you mean 'validation.enable'?" in err and "Traceback" not in err


def test_a_config_mixing_the_two_languages_is_refused(cli, capsys, tmp_path):
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(yaml.safe_dump({"base_model": "m", "learning_rate": 1e-5, "train": {"epoch": 1}, "policy": {}}))
    assert cli("validate", mixed) == 1
    err = capsys.readouterr().err
    assert "policy, train are Cosmos-RL sections" in err and "base_model, learning_rate are rlft (Axolotl) keys" in err


def test_the_same_structure_as_yaml_is_a_cosmos_rl_config(cli, capsys, grpo_toml, tmp_path):
    as_yaml = tmp_path / "grpo.yaml"
    as_yaml.write_text(yaml.safe_dump(tomllib.loads(grpo_toml().read_text())))
    assert cli("validate", as_yaml, "--explain") == 0
    assert "train.train_policy.kl_beta = 0.0\n    -> trl.beta: 0.0" in capsys.readouterr().out


def test_train_refuses_tensor_parallelism_with_the_reason_and_the_nearest_option(cli, capsys, grpo_toml):
    path = grpo_toml(tp=2)
    assert cli("validate", path) == 0
    assert "rlft train refuses policy.parallelism.tp_size = 2" in capsys.readouterr().err
    assert cli("train", path) == 1
    err = capsys.readouterr().err
    assert "policy.parallelism.tp_size = 2: tensor parallelism" in err and "not built" in err
    assert "FSDP2" in err and "dp_shard_size" in err and "--num-processes" in err and "Traceback" not in err


def test_quickstart_reads_a_cosmos_rl_file_as_train_does(cli, capsys, grpo_toml):
    """`rlft quickstart --config FILE` stops on what rlft does not build, with train's message, before any training."""
    assert cli("quickstart", "--config", grpo_toml(tp=2)) == 1
    err = capsys.readouterr().err
    assert "policy.parallelism.tp_size = 2: tensor parallelism" in err and "not built" in err and "Traceback" not in err


def test_explain_shows_each_key_and_what_it_became(cli, capsys, grpo_toml):
    path = grpo_toml(tp=2)
    for args in (("--explain", path), (path, "--explain")):
        assert cli("validate", *args) == 0
        out = capsys.readouterr().out
        assert "a Cosmos-RL config (GRPO)" in out
        assert "train.train_policy.kl_beta = 0.0\n    -> trl.beta: 0.0" in out
        assert "rollout.n_generation = 4\n    -> trl.num_generations: 4" in out
        assert 'redis = "12800"\n    not used by rlft: a setting of Cosmos-RL\'s launcher' in out
        assert "policy.parallelism.tp_size = 2\n    refused by rlft train: tensor parallelism" in out
    assert cli("validate", "--explain", "train.train_policy.mu_iterations") == 0
    assert "in rlft: trl.num_iterations" in capsys.readouterr().out


def test_convert_writes_the_rlft_yaml(cli, capsys, grpo_toml, tmp_path):
    path = grpo_toml(tp=2)
    out = tmp_path / "converted.yaml"
    assert cli("convert", path, "-o", out) == 0
    text = out.read_text()
    assert text.startswith("# rlft config converted by `rlft convert` from the Cosmos-RL config grpo.toml.")
    assert "#   policy.parallelism.tp_size = 2: tensor parallelism" in text  # not converted: said at the top
    assert not re.search(r"20\d\d-\d\d-\d\d", text)
    converted = yaml.safe_load(text)
    assert converted["rl"] == "grpo" and converted["trl"]["num_generations"] == 4 and converted["learning_rate"] == 1e-6
    assert cli("validate", out) == 0
    assert cli("convert", path, "-o", out) == 1
    assert "exists" in capsys.readouterr().err


def test_convert_names_a_missing_folder_or_a_folder_given_as_the_output(cli, capsys, grpo_toml, tmp_path):
    path = grpo_toml()
    assert cli("convert", path, "-o", tmp_path / "nodir" / "out.yaml") == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nodir'} does not exist: create it (mkdir -p {tmp_path / 'nodir'})" in err and "Traceback" not in err
    assert cli("convert", path, "-o", tmp_path, "--force") == 1
    err = capsys.readouterr().err
    assert f"-o {tmp_path} is a folder: give the file to write, e.g. -o {tmp_path / 'grpo.yaml'}" in err
    assert "Traceback" not in err and not (tmp_path / "nodir").exists()


@pytest.mark.parametrize("command", ["preprocess", "evaluate", "serve"])
def test_every_command_that_runs_a_cosmos_rl_file_stops_on_a_misspelt_key(cli, capsys, grpo_toml, command):
    """As `rlft train` does: Cosmos-RL ignores unknown keys, and a run with a misspelt one would lose that setting."""
    path = grpo_toml()
    path.write_text(path.read_text().replace("optm_lr = 1e-6", "optm_lr = 1e-6\nepochz = 3"))
    assert cli(command, path) == 1
    err = capsys.readouterr().err
    assert "rlft does not run these Cosmos-RL settings" in err and "train.epochz" in err and "Traceback" not in err


def test_overrides_take_either_language(cli, capsys, grpo_toml):
    path = grpo_toml()
    assert cli("validate", path, "--explain", "--rollout.n_generation=8", "--trl.beta=0.1") == 0
    assert "rollout.n_generation = 8\n    -> trl.num_generations: 8" in capsys.readouterr().out


def test_a_hub_model_offline_gets_the_message_of_an_rlft_config(cli, capsys, grpo_toml, tmp_path):
    toml = grpo_toml(model="someorg/no-such-model")
    assert cli("train", toml) == 1
    from_toml = capsys.readouterr().err
    rlft = tmp_path / "rlft.yaml"
    rlft.write_text(yaml.safe_dump({"base_model": "someorg/no-such-model", "rl": "grpo", "micro_batch_size": 8,
                                    "datasets": [{"path": str(tmp_path / "math.jsonl")}],
                                    "trl": {"reward_funcs": ["boxed_math"]}}))
    assert cli("train", rlft) == 1
    from_yaml = capsys.readouterr().err
    line = next(text for text in from_yaml.splitlines() if text.startswith("error:"))
    assert line in from_toml and "HF_HUB_OFFLINE" in line


def test_the_worked_example_of_the_docs_is_what_convert_writes(cli, capsys, repo_root, tmp_path):
    page = (repo_root / "docs" / "cosmos-rl.md").read_text()
    toml = re.search(r"^```toml\n(.*?)^```", page, re.MULTILINE | re.DOTALL).group(1)
    converted = re.search(r"^```yaml\n(.*?)^```", page, re.MULTILINE | re.DOTALL).group(1)
    path = tmp_path / "grpo.toml"
    path.write_text(toml)
    assert cli("validate", path) == 0
    capsys.readouterr()
    assert cli("convert", path) == 0
    assert capsys.readouterr().out == converted
    assert cli("validate", "--explain", path) == 0
    explained = capsys.readouterr().out
    shown = re.search(r"^```text\n(.*?)^```", page, re.MULTILINE | re.DOTALL).group(1)
    for pair in re.findall(r"^\S.*\n    -> .*$", shown, re.MULTILINE):
        assert pair in explained, pair
