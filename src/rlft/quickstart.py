"""The offline quickstart: held-out exact-match accuracy on "a+b=" before and after SFT from random weights."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from rich.console import Console
from transformers import AutoConfig, AutoModelForCausalLM

from rlft.config import RlftConfig, build_config, deep_merge, load_config, parse_overrides, read_yaml
from rlft.config.settings.model import model_settings
from rlft.errors import ConfigError
from rlft.models.generation import generate_texts
from rlft.models.loading import load_for_inference, load_tokenizer
from rlft.tasks.addition import exact_match, read_jsonl
from rlft.train.run import train

DEFAULT_CONFIG = Path("examples/quickstart/sft.yaml")


def held_out_accuracy(model, tokenizer, rows: list[dict[str, str]]) -> float:
    predictions = generate_texts(model, tokenizer, [row["prompt"] for row in rows], max_new_tokens=4)
    return exact_match(predictions, [row["completion"] for row in rows])


def quickstart_config(config_path: Path, overrides: list[str] | None,
                      load: Callable[..., RlftConfig] = load_config) -> RlftConfig:
    """The quickstart config, read by `load` (the command's: a Cosmos-RL file's refusals and notes, as `rlft train`);
    the default one is also found from another working directory (an installed clone): its model and data paths
    then point into the clone, and outputs still go to ./outputs."""
    cfg = load(config_path, overrides) if config_path != DEFAULT_CONFIG or config_path.exists() else _cloned_default(overrides)
    if not cfg.test_datasets:
        raise ConfigError(f"{config_path}: rlft quickstart measures exact-match accuracy on test_datasets before and "
                          f"after training, and this config has none: add test_datasets (prompt and completion "
                          f"rows), or train it with `rlft train {config_path}`")
    return cfg


def _cloned_default(overrides: list[str] | None) -> RlftConfig:
    """The default config of the clone rlft is installed from, its paths pointing into the clone."""
    repository = Path(__file__).resolve().parents[2]
    source = repository / DEFAULT_CONFIG
    if not source.exists():
        raise ConfigError(f"{DEFAULT_CONFIG} is not here ({Path.cwd()}) and rlft is not installed from a clone of its "
                          "repository: run the quickstart from a clone (`make demo`), or pass --config")
    data = read_yaml(source)
    data["base_model"] = str(repository / data["base_model"])
    for key in ("datasets", "test_datasets"):
        data[key] = [{**ds, "path": str(repository / ds["path"])} for ds in data.get(key) or []]
    return build_config(deep_merge(data, parse_overrides(overrides or [])), source=str(source))


def run_quickstart(cfg: RlftConfig, console: Console | None = None) -> dict[str, float]:
    console = console or Console()
    rows = read_jsonl(Path(cfg.test_datasets[0].path))
    tokenizer = load_tokenizer(model_settings(cfg))
    torch.manual_seed(cfg.seed)
    untrained = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cfg.base_model)).eval()
    before = held_out_accuracy(untrained, tokenizer, rows)
    console.print(f"held-out exact match before training: [bold]{before:.1%}[/] ({len(rows)} sums)")

    train(cfg, console)

    model, trained_tokenizer = load_for_inference(cfg.output_dir)
    after = held_out_accuracy(model, trained_tokenizer, rows)
    console.print(f"held-out exact match after training:  [bold]{after:.1%}[/] (was {before:.1%})")
    sample = rows[:3]
    answers = generate_texts(model, trained_tokenizer, [r["prompt"] for r in sample], max_new_tokens=4)
    for row, answer in zip(sample, answers):
        console.print(f"  {row['prompt']}{answer.strip():<4} (expected {row['completion']})")
    console.print(f"model: {Path(cfg.output_dir).resolve()}  try: rlft generate {cfg.output_dir} --prompt '12+34='")
    return {"before": before, "after": after}
