"""`rlft preprocess`: load and tokenise the datasets, and report what was kept, dropped and truncated."""

from __future__ import annotations

import argparse

from rich.table import Table

from rlft.cli.config_file import load_run_config
from rlft.cli.consoles import console
from rlft.cli.exit import CommandState
from rlft.config.settings import resolve
from rlft.config.settings.model import model_settings
from rlft.config.plugins import nemo_gym_enabled
from rlft.data.inspect import describe_examples
from rlft.data.prepare import method_steps, prepare_data, prompt_steps
from rlft.data.stream import preview
from rlft.errors import ConfigError
from rlft.models.loading import check_context_length, load_tokenizer
from rlft.train.methods import tool_episodes


def preprocess(args: argparse.Namespace, state: CommandState) -> int:
    cfg = load_run_config(args.config, args.overrides)
    if nemo_gym_enabled(cfg):
        raise ConfigError("rlft preprocess prepares datasets:, and with NeMo Gym on the prompts are nemo_gym_datasets' "
                          "tasks, which the running Gym servers route: `rlft train` prepares them (and starts the servers "
                          "with nemo_gym_auto_start); `rlft validate` checks the config")
    model = model_settings(cfg)
    check_context_length(model)
    steps = method_steps(cfg)
    tokenizer = load_tokenizer(model)
    if cfg.trl.multi_turn_config.enable:  # the prompts show the tools, as `rlft train` renders them
        _, template_kwargs = tool_episodes(resolve(cfg), tokenizer)
        steps = prompt_steps(cfg, template_kwargs, chat=True)
    if cfg.streamed:  # nothing to prepare: the first buffer, to check the format and lengths
        examples, line = preview(cfg, tokenizer)
        if args.debug or cfg.debug:
            console.print("[bold]trained tokens in bold green, the rest dim[/]")
            for text in describe_examples(examples, tokenizer, args.debug_num_examples):
                console.print(text)
        console.print(line, markup=False, highlight=False)
        return 0
    data = prepare_data(cfg, tokenizer, steps)
    if args.debug or cfg.debug:
        console.print("[bold]trained tokens in bold green, the rest dim[/]")
        for line in describe_examples(data.train, tokenizer, args.debug_num_examples):
            console.print(line)
    table = Table(title=f"rlft preprocess ({cfg.method})")
    table.add_column("dataset", overflow="fold", min_width=24)
    for column in ("rows", "kept", "dropped", "truncated", "tokens"):
        table.add_column(column)
    table.caption = "tokens per row: min/mean/p95/max"
    for report in data.reports:
        info = report.summary()
        tokens = info["tokens"]
        lengths = f"{tokens['min']}/{tokens['mean']}/{tokens['p95']}/{tokens['max']}" if tokens else "-"
        table.add_row(info["dataset"], str(info["rows"]), str(info["kept"]), report.dropped_text(), str(info["truncated"]), lengths)
    console.print(table)
    console.print(f"train rows: {len(data.train)}, eval rows: {len(data.eval)}")
    return 0
