"""Multi-turn rollouts with Python tools, played through the run's rollout engine (`trl.multi_turn_config`).

Each of the G episodes of a prompt: the engine samples an assistant turn from the prompt; when the turn writes Hermes
tool calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, read by the rollout server's parser,
`rlft.rollout.server.tool_calls`), the tools run (`python_tools.ToolRunner`), the chat template renders their results
and the next turn's opening, and the engine samples the next turn from everything so far, until a turn calls no tool,
ends without a stop token, reaches `max_assistant_turns`, or the episode fills `max_completion_length`.

Token in, token out: each turn's tokens stay exactly as the engine sampled them (never decoded and tokenised again),
and the next turn's prompt is the previous one plus those tokens plus the rendered tokens between them (the
*bridge*): the end of the turn the template writes after the sampled end token (e.g. the newline after `<|im_end|>`),
the tool results and the next opening. The episode is one training row as NeMo Gym's are (`nemo_gym_episodes`): the
first prompt, then the sampled tokens (`env_mask` 1, with their sampling log-probs) and the bridges (`env_mask` 0,
log-prob 0, never trained on).

The bridge is the chat template's own text: the template renders a fixed probe conversation ending in an assistant
turn, with and without the tool results after it, and the bridge is the difference after the assistant's text. The
template is checked when the run starts (`TurnTemplate`): it must show the tools, write tool calls as `<tool_call>`
blocks and render tool results after an assistant turn without changing what came before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError

from rlft.errors import ConfigError
from rlft.rollout.envs.python_tools import OUTCOMES, PythonTool, ToolResult, ToolRunner
from rlft.rollout.server.tool_calls import decoded_arguments, read_tool_calls
from rlft.rollout.types import Rollout, SamplingParams

MARK = "rlft-probe-assistant-text"  # the probe's assistant text: the bridge is what the template writes after it
PROBE_USER = {"role": "user", "content": "rlft-probe-question"}
PROBE_RESULT = "rlft-probe-tool-result"
COMPLETION_MESSAGES = "completion_messages"  # extra column: each episode as chat messages, the reward functions' completions
TEMPLATE_FIX = ("use a template that shows tools, writes tool calls as Hermes <tool_call> blocks and renders tool results: "
                "chat_template: chatml (rlft's), the model's own when it is Qwen's (chat_template: tokenizer_default), or "
                "a file of your own (chat_template: path/to/template.jinja, Cosmos-RL's custom_chat_template_path)")


class TurnTemplate:
    """What the chat template writes between one sampled assistant turn and the next."""

    def __init__(self, tokenizer, template_kwargs: dict[str, Any], tools: list[PythonTool], opening: bool):
        self.tokenizer, self.opening = tokenizer, opening
        kwargs = {k: v for k, v in template_kwargs.items() if k not in ("add_generation_prompt", "continue_final_message")}
        self.kwargs = {**kwargs, "tools": [tool.schema for tool in tools] or None}
        self.trailer = ""  # what the template writes after an assistant turn's text: set by `_check`
        self._check(tools)

    def _render(self, messages: list[dict[str, Any]], opening: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=opening, **self.kwargs)

    def _tail(self, messages: list[dict[str, Any]], opening: bool) -> str:
        """The text the template writes after the probe's assistant text."""
        text = self._render(messages, opening)
        if MARK not in text:
            raise ValueError("the template leaves out the text of an assistant turn")
        return text[text.index(MARK) + len(MARK):]

    def bridge_text(self, turn_text: str, results: list[ToolResult]) -> str:
        """The text between a turn that ends with `turn_text` (special tokens kept) and the next turn: the rest of the
        turn's end as the template writes it, the tool results, and the next turn's opening."""
        messages = [{"role": "tool", "content": r.text, **({"name": r.name} if r.name else {})} for r in results]
        tail = self._tail([PROBE_USER, {"role": "assistant", "content": MARK}, *messages], self.opening)
        if not tail.startswith(self.trailer):
            raise ValueError("the template renders an assistant turn differently when tool results follow it")
        sampled = next(k for k in range(len(self.trailer), -1, -1) if turn_text.endswith(self.trailer[:k]))
        return self.trailer[sampled:] + tail[len(self.trailer):]

    def bridge(self, turn_text: str, results: list[ToolResult]) -> list[int]:
        """The bridge's tokens after a turn whose text (special tokens kept) is `turn_text`."""
        text = self.bridge_text(turn_text, results)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _check(self, tools: list[PythonTool]) -> None:
        """A ConfigError, before anything loads, when the template cannot play these episodes."""
        try:
            self.trailer = self._tail([PROBE_USER, {"role": "assistant", "content": MARK}], False)
            shown = self._render([PROBE_USER], True)
            if any(tool.name not in shown for tool in tools):
                raise ValueError("it does not show the tools (it ignores the `tools` it is given)")
            call = {"type": "function", "function": {"name": tools[0].name if tools else "probe", "arguments": {}}}
            written = self._render([PROBE_USER, {"role": "assistant", "content": "", "tool_calls": [call]}], False)
            if "<tool_call>" not in written:
                raise ValueError("it writes tool calls in another form than <tool_call> blocks, the only form rlft reads")
            if PROBE_RESULT not in self.bridge_text("", [ToolResult("probe", PROBE_RESULT, "ok")]):
                raise ValueError("it leaves out tool results (messages of role `tool`)")
        except (TemplateError, ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"trl.multi_turn_config: the chat template cannot play multi-turn episodes with tools: "
                              f"{exc}. {TEMPLATE_FIX}") from None


@dataclass
class Episode:
    """One episode as it is played: the training row it becomes, and what the reward functions read of it."""

    prompt_ids: list[int]
    chat: bool  # its prompt is a message list: the reward functions get its messages
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    truncated: bool = False
    playing: bool = True  # another assistant turn follows
    error: str | None = None
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("calls",) + OUTCOMES[1:], 0))

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.completion_ids


class ToolEpisodes:
    """The multi-turn environment (`rlft.rollout.producer.Environment`): G episodes per prompt through the engine."""

    def __init__(self, tokenizer, tools: list[PythonTool], template_kwargs: dict[str, Any], max_turns: int,
                 tool_timeout: float, add_generation_prompt: bool = True):
        self.tokenizer, self.max_turns = tokenizer, max_turns
        self.template = TurnTemplate(tokenizer, template_kwargs, tools, add_generation_prompt)
        self.runner = ToolRunner(tools, tool_timeout)

    def rollout(self, prompts: list[dict[str, Any]], group: int, sampling: SamplingParams, engine,
                seed: int | None = None) -> tuple[Rollout, dict[str, list]]:
        """G episodes per prompt, each at most `sampling.max_new_tokens` tokens long (every turn and tool result:
        max_completion_length in training)."""
        limit = sampling.max_new_tokens
        episodes = [Episode(list(p["prompt_ids"]), isinstance(p.get("prompt"), list)) for p in prompts for _ in range(group)]
        sampled = engine.generate([p["prompt_ids"] for p in prompts], sampling, group, seed=seed)
        versions = list(sampled.weight_versions)
        self._after_turn(episodes, sampled, limit)
        for turn in range(1, self.max_turns):
            rows = [row for row, e in enumerate(episodes) if e.playing]
            if not rows:
                break
            playing = [episodes[row] for row in rows]
            budget = max(limit - len(e.completion_ids) for e in playing)
            params = dataclasses.replace(sampling, max_new_tokens=budget)
            turn_seed = None if seed is None else (seed * 6364136223846793005 + turn) % (2**63 - 1)
            sampled = engine.generate([e.context for e in playing], params, 1, seed=turn_seed)
            for row, version in zip(rows, sampled.weight_versions):  # a row is as old as the oldest weights in it
                versions[row] = min(versions[row], version)
            self._after_turn(playing, sampled, limit)
        for episode in episodes:
            if episode.error is not None:  # nothing of a broken episode trains
                episode.env_mask = [0] * len(episode.env_mask)
        rollout = Rollout([e.prompt_ids for e in episodes], [e.completion_ids for e in episodes],
                          [e.logprobs for e in episodes], [e.truncated for e in episodes],
                          env_mask=[e.env_mask for e in episodes], weight_versions=versions)
        extra = {"num_turns": [e.turns for e in episodes], "env_error": [e.error for e in episodes],
                 "tool_counts": [dict(e.counts) for e in episodes],
                 COMPLETION_MESSAGES: [e.messages if e.chat else None for e in episodes]}
        return rollout, extra

    def _after_turn(self, episodes: list[Episode], sampled: Rollout, limit: int) -> None:
        """Append each episode's sampled turn; run the tool calls of those that go on, and append their bridges."""
        calls_of: list[tuple[Episode, str, list[dict[str, Any]], list[str]]] = []
        for episode, ids, logps, cut in zip(episodes, sampled.completion_ids, sampled.logprobs, sampled.truncated):
            room = limit - len(episode.completion_ids)
            if len(ids) > room:
                ids, logps, cut = ids[:room], logps[:room], True
            episode.completion_ids += ids
            episode.logprobs += logps
            episode.env_mask += [1] * len(ids)
            episode.turns += 1
            # the calls from the text as sampled (a tokenizer may mark <tool_call> special), the message without markers
            text = self.tokenizer.decode(ids)
            _, calls, malformed = read_tool_calls(text)
            content = read_tool_calls(self.tokenizer.decode(ids, skip_special_tokens=True))[0]
            message = decoded_arguments({"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})})
            episode.messages.append(message)
            episode.truncated = cut
            episode.playing = bool(calls or malformed) and not cut and episode.turns < self.max_turns
            if episode.playing:
                calls_of.append((episode, text, calls, malformed))
        results = iter(self.runner.run([call for _, _, calls, _ in calls_of for call in calls]))
        for episode, text, calls, malformed in calls_of:
            answered = [next(results) for _ in calls] + [self.runner.malformed(detail) for detail in malformed]
            episode.counts["calls"] += len(answered)
            for result in answered:
                if result.outcome != "ok":
                    episode.counts[result.outcome] += 1
            self._bridge(episode, text, answered, limit)

    def _bridge(self, episode: Episode, turn_text: str, results: list[ToolResult], limit: int) -> None:
        try:
            bridge = self.template.bridge(turn_text, results)
        except (TemplateError, ValueError, TypeError, KeyError) as exc:
            episode.playing, episode.error = False, f"the chat template failed to render the tool results: {exc}"
            return
        if len(episode.completion_ids) + len(bridge) >= limit:  # no room for the results and another turn
            episode.playing, episode.truncated = False, True
            return
        episode.completion_ids += bridge
        episode.logprobs += [0.0] * len(bridge)
        episode.env_mask += [0] * len(bridge)
        episode.messages += [{"role": "tool", "content": r.text, **({"name": r.name} if r.name else {})} for r in results]


def tool_metrics(extra: dict[str, list]) -> dict[str, float]:
    """A batch's tool use from its `tool_counts` column: TRL's tools/call_frequency (calls per episode) and
    tools/failure_frequency (the share of calls that failed), and the failures by kind (counts)."""
    counts = [c for c in extra.get("tool_counts") or [] if c]
    if not counts:
        return {}
    calls = sum(c["calls"] for c in counts)
    failed = {kind: sum(c[kind] for c in counts) for kind in OUTCOMES[1:]}
    names = {"error": "tools/errors", "timeout": "tools/timeouts", "unknown": "tools/unknown_tools",
             "malformed": "tools/malformed_calls"}
    metrics = {"tools/call_frequency": calls / len(counts),
               "tools/failure_frequency": sum(failed.values()) / calls if calls else 0.0}
    metrics.update({names[kind]: float(value) for kind, value in failed.items()})
    return metrics
