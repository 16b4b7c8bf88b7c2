"""Canonical SFT records -> token ids with loss labels (-100 = no loss), and length handling.

Chat records are rendered with the tokenizer's chat template; which tokens are trained is decided
on characters: each message's content is located in the rendered text (by rendering once more
with a sentinel in its place), trained roles mark their content (and the end-of-turn marker, by
`train_on_eos`), and a token is trained when ANY of its characters is marked. This works for any
template, with or without `{% generation %}` tags. "Any", not "the first": SentencePiece and
Llama-2/Mistral-style templates put the separating space and the first word of the answer in one
token (`[/INST] Paris` -> `▁Paris`), whose first character is template text.

With `tokenizer_use_mistral_common`, mistral-common encodes a chat itself (no template, control tokens only as ids):
each message's ids are trained by its role (`rlft.data.mistral_common.chat_ids`).

Prompt + answer records (SFT `prompt`/`completion`, the preference formats, KTO, EBFT) are tokenised
as ONE text, the way the model sees it at inference, and cut where the answer begins (`split_answers`):
tokenising the two parts apart gives other ids with many tokenizers (SentencePiece adds a `▁` to the
start of every text it encodes; BPE merges across the boundary).
"""

from __future__ import annotations

from typing import Any

from rlft.data.formats.rows import Record, RowError, render_chat, text
from rlft.data.mistral_common import chat_ids, is_mistral_common
from rlft.data.tokenizer import end_of_turn_token

IGNORE = -100
SENTINEL = "\u2063RLFT-CONTENT\u2063"


def _content_spans(tokenizer, messages: list[dict[str, str]], text: str, **kwargs: Any) -> list[tuple[int, int] | None]:
    """Character span of each message's content in `text`, or None where the template does not render it.

    The conversation is rendered again with one message's content replaced by a sentinel; the text before the content
    is the same in both renderings, so the sentinel's offset is where the content begins. The content is looked for
    there as written, then stripped (templates that trim it, or keep leading whitespace). Where a template rewrites
    it (a reasoning block re-rendered or dropped: Qwen3, DeepSeek-R1), the rendered turn is looked for between the
    previous content and the next: its visible answer, and the rendered `<think>` block before it.
    """
    probes = [render_chat(tokenizer, [dict(m, content=SENTINEL) if i == index else m for i, m in enumerate(messages)], **kwargs)
              .find(SENTINEL) for index in range(len(messages))]
    spans: list[tuple[int, int] | None] = []
    cursor = 0
    for index, message in enumerate(messages):
        start = probes[index]
        bound = next((p for p in probes[index + 1:] if p >= 0), len(text))
        span = _locate(text, message["content"], start, cursor, max(bound, start)) if start >= 0 else None
        spans.append(span)
        cursor = span[1] if span else cursor
    return spans


def _locate(text: str, raw: str, start: int, cursor: int, bound: int) -> tuple[int, int] | None:
    stripped = raw.strip()
    if not stripped:
        return (start, start)
    if text.startswith(raw, start):
        return (start, start + len(raw))
    found = text.find(stripped, start, bound + len(stripped))
    if found >= 0:
        return (found, found + len(stripped))
    if "</think>" in stripped:  # the reasoning block re-rendered (another spacing) or dropped from an earlier turn
        answer = stripped.rsplit("</think>", 1)[1].strip()
        found = text.find(answer, cursor, bound + len(answer)) if answer else -1
        if found >= 0:
            think = text.rfind("<think>", cursor, found)
            return (think if think >= 0 else found, found + len(answer))
    return None


def _chat_char_mask(tokenizer, text: str, messages: list[dict[str, str]], roles_to_train: set[str], train_on_eos: str,
                    eot_tokens: list[str] | None = None, **kwargs: Any) -> list[bool]:
    """True for every character that carries the loss (`kwargs`: the chat template's, e.g. the row's tools)."""
    markers = [m for m in (eot_tokens or [end_of_turn_token(tokenizer)]) if m]
    marked = [False] * len(text)
    last: tuple[int, int] | None = None  # `last`: the marker of the last trained turn that has one, as in Axolotl
    for index, (message, span) in enumerate(zip(messages, _content_spans(tokenizer, messages, text, **kwargs))):
        trained = message["role"] in roles_to_train
        if span is None:
            if trained:  # a template that drops or rewrites an untrained turn (a system message) costs nothing
                raise RowError(f"message {index} ({message['role']}) cannot be located in the rendered chat template "
                               "text: the template rewrites its content (leave the role out of roles_to_train, or use "
                               "another chat_template)")
            continue
        start, end = span
        if trained:
            marked[start:end] = [True] * (end - start)
        gap = len(text[end:]) - len(text[end:].lstrip())  # the marker follows the content (and any whitespace)
        eot = next((m for m in markers if text.startswith(m, end + gap)), None)
        if eot and {"turn": trained, "all": True, "last": False, "none": False}[train_on_eos]:
            marked[end + gap : end + gap + len(eot)] = [True] * len(eot)
        if eot and trained:
            last = (end + gap, end + gap + len(eot))
    if train_on_eos == "last" and last:
        marked[last[0] : last[1]] = [True] * (last[1] - last[0])
    return marked


def encode_text(tokenizer, text: str, **kwargs):
    """Encode `text`, adding the tokenizer's special tokens (BOS) unless the text already starts with BOS."""
    has_bos = tokenizer.bos_token is not None and text.startswith(tokenizer.bos_token)
    return tokenizer(text, add_special_tokens=not has_bos, **kwargs)


def split_answers(tokenizer, prompt: str, answers: list[str]) -> tuple[list[int], list[list[int]]]:
    """Ids of `prompt + answer` for each answer, cut into (shared prompt ids, answer ids per answer).

    Each whole text is tokenised once; the answer starts at the first token holding any answer
    character, and the prompt part is what all the answers share before that, so
    `prompt_ids + answer_ids[i]` is exactly the tokenisation of `prompt + answers[i]`.
    """
    wholes, cuts = [], []
    for answer in answers:
        encoded = encode_text(tokenizer, prompt + answer, return_offsets_mapping=True)
        ids = list(encoded["input_ids"])
        ends = [end for _, end in encoded["offset_mapping"]]
        cuts.append(next((i for i, end in enumerate(ends) if end > len(prompt)), len(ids)))
        wholes.append(ids)
    cut = min(cuts)
    while cut and any(whole[:cut] != wholes[0][:cut] for whole in wholes):
        cut -= 1
    return wholes[0][:cut], [whole[cut:] for whole in wholes]


def tokenize_record(record: Record, tokenizer, train_on_inputs: bool, roles_to_train: list[str], train_on_eos: str,
                    eot_tokens: list[str] | None = None) -> dict[str, list[int]]:
    """Token ids and labels for one canonical record (no truncation here)."""
    if is_mistral_common(tokenizer):
        return _mistral_record(record, tokenizer, train_on_inputs, roles_to_train, train_on_eos)
    if "messages" in record:
        if not record["messages"]:  # only system messages, dropped (drop_system_message): nothing to train
            return {"input_ids": [], "labels": []}
        tools = {"tools": record["tools"]} if record.get("tools") else {}
        rendered = render_chat(tokenizer, record["messages"], **tools)
        encoded = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(encoded["input_ids"])
        if train_on_inputs:
            return {"input_ids": ids, "labels": list(ids)}
        marked = _chat_char_mask(tokenizer, rendered, record["messages"], set(roles_to_train), train_on_eos, eot_tokens,
                                 **tools)
        labels = [tok if any(marked[start:end]) else IGNORE for tok, (start, end) in zip(ids, encoded["offset_mapping"])]
        return {"input_ids": ids, "labels": labels}
    if "segments" in record:  # input_output: the texts as written, no special tokens added
        ids, labels = [], []
        for part, trained in record["segments"]:
            part_ids = list(tokenizer(part, add_special_tokens=False)["input_ids"])
            ids += part_ids
            labels += part_ids if trained or train_on_inputs else [IGNORE] * len(part_ids)
        return {"input_ids": ids, "labels": labels}
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ended = lambda ids: ids if ids[-1:] == eos else ids + eos  # noqa: E731  (the text's own EOS, or the tokenizer's)
    if "text" in record:
        ids = ended(list(encode_text(tokenizer, text(record["text"], "text"))["input_ids"]))
        return {"input_ids": ids, "labels": list(ids)}
    prompt, (completion,) = split_answers(tokenizer, text(record["prompt"], "prompt"), [text(record["completion"], "completion")])
    completion = ended(list(completion))
    prompt_labels = list(prompt) if train_on_inputs else [IGNORE] * len(prompt)
    return {"input_ids": prompt + completion, "labels": prompt_labels + completion}


def _mistral_record(record: Record, tokenizer, train_on_inputs: bool, roles_to_train: list[str],
                    train_on_eos: str) -> dict[str, list[int]]:
    """A record through mistral-common: a chat's ids as mistral-common encodes them, each message's ids trained by its
    role (an assistant turn's closing EOS by `train_on_eos`); a text with BOS and EOS."""
    if "text" in record:
        ids = list(tokenizer(text(record["text"], "text"))["input_ids"])  # finetuning mode adds BOS and EOS
        return {"input_ids": ids, "labels": list(ids)}
    if "messages" not in record:
        raise RowError("with tokenizer_use_mistral_common, rows are chat messages (type: chat_template) or text (type: "
                       "completion): mistral-common encodes conversations itself and has no prompt/completion or "
                       "template-free (input_output) form")
    if record.get("tools"):
        raise RowError("a tools column with tokenizer_use_mistral_common: rlft does not pass tools to mistral-common yet; "
                       "leave the column out (remove_columns in a transform, or field_tools naming no column)")
    if not record["messages"]:  # only a system message, dropped (drop_system_message): nothing to train
        return {"input_ids": [], "labels": []}
    try:
        ids, spans = chat_ids(tokenizer, record["messages"])
    except ValueError as exc:
        raise RowError(str(exc)) from None
    encoded = {role for role, _, _ in spans}
    lost = sorted({m["role"] for m in record["messages"]} & set(roles_to_train) - encoded)
    if lost and not train_on_inputs:  # e.g. v1-v3 put the system text into the last user turn
        raise RowError(f"roles_to_train has {', '.join(lost)}, and this mistral-common tokenizer encodes no such message of "
                       f"its own (it joins it to another turn: {', '.join(sorted(encoded))}): leave it out of roles_to_train")
    if train_on_inputs:
        return {"input_ids": ids, "labels": list(ids)}
    labels = [IGNORE] * len(ids)
    closes = [end > start and ids[end - 1] == tokenizer.eos_token_id for _, start, end in spans]  # an assistant turn's EOS
    # `last`: the EOS of the last trained turn that has one, as in Axolotl
    last = max((i for i, (role, _, _) in enumerate(spans) if role in roles_to_train and closes[i]), default=-1)
    for index, (role, start, end) in enumerate(spans):
        trained = role in roles_to_train
        content_end = end - 1 if closes[index] else end
        if trained:
            labels[start:content_end] = ids[start:content_end]
        if closes[index] and {"turn": trained, "all": True, "last": index == last, "none": False}[train_on_eos]:
            labels[end - 1] = ids[end - 1]
    return {"input_ids": ids, "labels": labels}


def fit_length(example: dict[str, list[int]], sequence_len: int, strategy: str) -> tuple[dict[str, list[int]] | None, str]:
    """Apply excess_length_strategy. Returns (example or None, what happened: ok|truncated|too_long|no_target)."""
    outcome = "ok"
    if len(example["input_ids"]) > sequence_len:
        if strategy == "drop":
            return None, "too_long"
        if strategy == "raise":
            raise RowError(
                f"row has {len(example['input_ids'])} tokens, more than sequence_len={sequence_len} "
                "(raise sequence_len, or set excess_length_strategy: drop or truncate)"
            )
        example = {key: value[:sequence_len] for key, value in example.items()}
        outcome = "truncated"
    # the first token is never predicted (nothing precedes it), so it cannot be a target
    if all(label == IGNORE for label in example["labels"][1:]):
        return None, "no_target"
    return example, outcome
