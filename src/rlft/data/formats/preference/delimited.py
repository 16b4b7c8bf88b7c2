"""Preference and KTO formats with fixed prompt templates, as Axolotl writes them: `chatml.*`, `llama3.*` and
`zephyr.nectar`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlft.data.formats.preference.fields import (FormatFactory, Record, RowFormat, checked_text, first_present, message_content,
                                                 parse_label, required_text, system_text)
from rlft.data.formats.rows import RowError, get_field


@dataclass(frozen=True)
class Delimiters:
    """The literal strings of one fixed prompt template."""

    system: str  # with {system}
    turn: str  # the user turn and the assistant header, with {prompt}
    end: str  # appended to every answer

    def prompt(self, prompt: str, system: str | None = None) -> str:
        head = self.system.format(system=system) if system else ""
        return head + self.turn.format(prompt=prompt)


CHATML = Delimiters(
    system="<|im_start|>system\n{system}<|im_end|>\n",
    turn="<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n",
    end="<|im_end|>",
)
LLAMA3 = Delimiters(
    system="<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>",
    turn="<|start_header_id|>user<|end_header_id|>\n\n{prompt}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    end="<|eot_id|>",
)


def _field_pair(delims: Delimiters, prompt_keys: tuple[str, ...], chosen_keys: tuple[str, ...],
                rejected_keys: tuple[str, ...]) -> FormatFactory:
    """Prompt, chosen and rejected are plain string columns (the first present of each key list)."""

    def factory(ds, tokenizer, method) -> RowFormat:
        def convert(row: dict[str, Any]) -> Record:
            prompt = required_text(row, first_present(row, prompt_keys), allow_empty=True)
            return {
                "prompt": delims.prompt(prompt, system_text(row)),
                "chosen": required_text(row, first_present(row, chosen_keys)) + delims.end,
                "rejected": required_text(row, first_present(row, rejected_keys)) + delims.end,
            }

        return convert

    return factory


def _ultra_pair(delims: Delimiters) -> FormatFactory:
    """`prompt` string; answers are message lists whose second message is the answer."""

    def factory(ds, tokenizer, method) -> RowFormat:
        def convert(row: dict[str, Any]) -> Record:
            return {
                "prompt": delims.prompt(required_text(row, "prompt", allow_empty=True), system_text(row)),
                "chosen": message_content(row, "chosen", 1) + delims.end,
                "rejected": message_content(row, "rejected", 1) + delims.end,
            }

        return convert

    return factory


def _argilla_chat_pair(delims: Delimiters) -> FormatFactory:
    """Answers are [user, assistant] lists; the prompt is chosen[0]; a system column is ignored."""

    def factory(ds, tokenizer, method) -> RowFormat:
        def convert(row: dict[str, Any]) -> Record:
            return {
                "prompt": delims.prompt(message_content(row, "chosen", 0)),
                "chosen": message_content(row, "chosen", 1) + delims.end,
                "rejected": message_content(row, "rejected", 1) + delims.end,
            }

        return convert

    return factory


def delimited_pair_formats(prefix: str, delims: Delimiters) -> dict[str, FormatFactory]:
    default = _field_pair(delims, ("prompt", "input", "question", "instruction"),
                          ("chosen", "chosen_response"), ("rejected", "rejected_response"))
    return {
        f"{prefix}.default": default,
        f"{prefix}.argilla": default,  # documented name, renamed to default upstream
        f"{prefix}.argilla_chat": _argilla_chat_pair(delims),
        f"{prefix}.icr": _field_pair(delims, ("input",), ("chosen",), ("rejected",)),
        f"{prefix}.intel": _field_pair(delims, ("question",), ("chosen",), ("rejected",)),
        f"{prefix}.prompt_pairs": _field_pair(delims, ("prompt",), ("chosen",), ("rejected",)),
        f"{prefix}.ultra": _ultra_pair(delims),
    }


def _field_kto(delims: Delimiters, prompt_key: str) -> FormatFactory:
    def factory(ds, tokenizer, method) -> RowFormat:
        def convert(row: dict[str, Any]) -> Record:
            return {
                "prompt": delims.prompt(required_text(row, prompt_key, allow_empty=True), system_text(row)),
                "completion": required_text(row, "completion") + delims.end,
                "label": parse_label(get_field(row, "label")),
            }

        return convert

    return factory


def _argilla_chat_kto(delims: Delimiters) -> FormatFactory:
    """`completion` is a [user, assistant] list: the prompt is its first message, the answer its second."""

    def factory(ds, tokenizer, method) -> RowFormat:
        def convert(row: dict[str, Any]) -> Record:
            return {
                "prompt": delims.prompt(message_content(row, "completion", 0)),
                "completion": message_content(row, "completion", 1) + delims.end,
                "label": parse_label(get_field(row, "label")),
            }

        return convert

    return factory


def delimited_kto_formats(prefix: str, delims: Delimiters) -> dict[str, FormatFactory]:
    return {
        f"{prefix}.argilla": _field_kto(delims, "instruction"),
        f"{prefix}.argilla_chat": _argilla_chat_kto(delims),
        f"{prefix}.intel": _field_kto(delims, "question"),
        f"{prefix}.prompt_pairs": _field_kto(delims, "prompt"),
        f"{prefix}.ultra": _field_kto(delims, "prompt"),
    }


ZEPHYR_PROMPT = "<|system|>\n</s>\n<|user|>\n{prompt}</s>\n<|assistant|>\n"


def zephyr_nectar(ds, tokenizer, method) -> RowFormat:
    """`prompt` + `answers: [{answer, rank}]`; chosen = best rank (lowest number), rejected = second best.

    Deviation: Axolotl picks the two LARGEST rank numbers, i.e. the worst answers as chosen; in
    Nectar rank 1 is the best answer, so the reference looks inverted and we do not copy it.
    No suffix is added to the answers (as in Axolotl).
    """

    def convert(row: dict[str, Any]) -> Record:
        answers = get_field(row, "answers")
        if not isinstance(answers, list) or len(answers) < 2:
            raise RowError("field 'answers' must be a list of at least 2 {answer, rank} items")
        ranked = []
        for position, item in enumerate(answers):
            if not isinstance(item, dict):
                raise RowError(f"field 'answers[{position}]' must be a mapping with answer and rank")
            rank = item.get("rank")
            if isinstance(rank, bool) or not isinstance(rank, (int, float)):
                raise RowError(f"field 'answers[{position}].rank' must be a number, got {rank!r}")
            ranked.append((rank, position, item))
        ranked.sort(key=lambda entry: entry[:2])  # stable on ties: the earlier answer wins
        (_, best, chosen), (_, second, rejected) = ranked[0], ranked[1]
        return {
            "prompt": ZEPHYR_PROMPT.format(prompt=required_text(row, "prompt", allow_empty=True)),
            "chosen": checked_text(chosen.get("answer"), f"answers[{best}].answer"),
            "rejected": checked_text(rejected.get("answer"), f"answers[{second}].answer"),
        }

    return convert
