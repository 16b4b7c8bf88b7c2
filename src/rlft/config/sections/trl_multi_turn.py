"""Cosmos-RL's multi-turn rollout keys (its `rollout.multi_turn_config`: same names, meanings and defaults) in the
`trl:` section, plus the Python tools rlft runs: `trl.multi_turn_config`. How an episode is played and trained on:
docs/environments.md#multi-turn-with-python-tools. Cosmos-RL's `custom_chat_template_path` is rlft's (and Axolotl's)
`chat_template: path/to/template.jinja`, which renders every prompt and turn of the run."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, field_validator

from rlft.config.base import Section, field


class MultiTurnConfig(Section):
    """`trl.multi_turn_config`: episodes of several assistant turns, the model calling Python tools between them."""

    enable: bool = field(
        False,
        "Play each rollout as an episode: after an assistant turn that calls tools (Hermes <tool_call> blocks), the tools "
        "run, their results are appended with the chat template, and the model answers again, up to max_assistant_turns. "
        "Tool results and template markers stay out of the loss. Default false.",
    )
    enable_tools: Optional[bool] = field(
        None,
        "Show the tools to the model (their schemas go to the chat template's `tools`) and run the calls it writes. "
        "None -> true when tools lists any.",
    )
    tools: Optional[list[str]] = field(
        None,
        "The Python tools, as 'module.function' from the working directory (as reward functions are named); each "
        "function's signature and docstring (Google style: a summary and an Args: line per parameter) become its "
        "schema (transformers' get_json_schema). Default none.",
    )
    enable_thinking: Optional[bool] = field(
        None,
        "Passed to the chat template as enable_thinking (Qwen3's switch for <think> reasoning) for the prompts and every "
        "later turn. None -> not passed (the template's own default, or trl.chat_template_kwargs').",
    )
    max_assistant_turns: int = field(
        5,
        "Assistant turns per episode at most (the first answer counts as one); a tool call in the last turn is not run. "
        "Default 5.", ge=1,
    )
    add_generation_prompt: bool = field(
        True,
        "Open each assistant turn with the chat template's generation prompt (e.g. <|im_start|>assistant), in the prompt "
        "and after every tool result; false: the model writes the turn's opening itself. Default true.",
    )
    continue_final_message: bool = field(
        False,
        "The first turn continues the prompt's last message (an assistant message the dataset started) instead of "
        "opening a new one. Default false.",
    )
    tool_timeout: float = field(
        30.0,
        "Seconds one tool call may run; a call still running then is answered with a timeout error (its thread cannot be "
        "stopped and finishes in the background). Default 30.", gt=0,
    )

    @field_validator("tools")
    @classmethod
    def _names(cls, names: Optional[list[str]]) -> Optional[list[str]]:
        for name in names or []:
            module, _, function = name.rpartition(".")
            if not module or not function:
                raise ValueError(f"{name!r} is not 'module.function': name a function in a .py file of the working "
                                 "directory, e.g. tools.get_weather for get_weather in tools.py")
        if names and len(set(names)) != len(names):
            raise ValueError(f"{names} lists a tool twice: list each once")
        return names


class MultiTurnKeys(BaseModel):
    """A base of `TRLConfig`: the section only (the rules are in rlft.config.rules.multi_turn)."""

    multi_turn_config: MultiTurnConfig = field(
        default_factory=MultiTurnConfig,
        description="Multi-turn rollouts with Python tools (Cosmos-RL's rollout.multi_turn_config): "
                    "docs/environments.md#multi-turn-with-python-tools.",
    )
