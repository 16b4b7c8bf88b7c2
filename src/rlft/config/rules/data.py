"""Rules on the data keys: streamed data (`pretraining_dataset`, `streaming: true`), and the keys of SFT's
`chat_template` conversations."""

from __future__ import annotations

from rlft.config.methods import method_spec


def streaming_problems(cfg):
    for key, entries in (("datasets", cfg.datasets), ("test_datasets", cfg.test_datasets or [])):
        for index, ds in enumerate(entries):
            if ds.type == "pretrain" and (key == "test_datasets" or not cfg.streaming):
                yield (f"{key}[{index}]: type: pretrain cuts streamed text into pieces, and " +
                       ("evaluation rows are read whole: use type: completion" if key == "test_datasets" else
                        "these rows are read whole: set streaming: true, or use type: completion"))
    if not cfg.streamed:
        unused = [key for key in ("streaming_multipack_buffer_size", "pretrain_multipack_attn")
                  if getattr(cfg, key) != type(cfg).model_fields[key].default]
        if unused:
            yield f"{' and '.join(unused)} set, and no data is streamed: set pretraining_dataset or streaming: true, or remove it"
        return
    streamed = "pretraining_dataset" if cfg.pretraining_dataset else "streaming: true"
    if cfg.pretraining_dataset and "streaming" in cfg.model_fields_set and not cfg.streaming:
        yield "pretraining_dataset is always streamed: remove streaming: false"
    if not cfg.pretrain_multipack_attn and not (cfg.pretraining_dataset and cfg.sample_packing):
        yield ("pretrain_multipack_attn: false lets the texts of a packed row attend to each other: it applies to "
               "pretraining_dataset with sample_packing (other streamed rows always attend apart, as in Axolotl): remove it")
    entry = cfg.pretraining_dataset[0] if cfg.pretraining_dataset else None
    if entry is not None and "text_column" in entry.model_fields_set and entry.type != "pretrain":
        yield f"pretraining_dataset[0]: text_column names the text of type: pretrain, not of type {entry.type}: remove it"
    if entry is not None and "field" in entry.model_fields_set and entry.type == "pretrain":
        yield "pretraining_dataset[0]: field names the text of type: completion; type: pretrain reads text_column: rename it"
    raw = [ds.type == "pretrain" for ds in ([entry] if entry is not None else cfg.datasets)]
    if raw and all(raw) and cfg.excess_length_strategy != "drop" and not cfg.test_datasets:
        yield (f"{streamed} of raw text (type: pretrain) with excess_length_strategy: {cfg.excess_length_strategy}: long "
               "texts are cut into pieces of sequence_len tokens, never truncated or refused: remove it")
    if any(raw) and cfg.sequence_len < 2:
        yield f"{streamed} of raw text needs sequence_len >= 2 (a piece of one token predicts nothing)"
    if not method_spec(cfg.method).packs:
        yield f"{streamed} is built for SFT, not {cfg.method}: remove it and list the data under datasets:"
    if not cfg.max_steps:
        yield f"{streamed}: a stream has no length to count epochs in: set max_steps"
    if cfg.pretraining_dataset and len(cfg.pretraining_dataset) > 1:
        yield (f"pretraining_dataset lists {len(cfg.pretraining_dataset)} datasets and rlft streams one (Axolotl reads "
               "the first and ignores the others): keep one, or list them under datasets: with streaming: true, "
               "which reads them in turn")
    if cfg.pretraining_dataset and cfg.datasets:
        yield ("pretraining_dataset and datasets are both set (Axolotl trains on pretraining_dataset and ignores "
               "datasets): remove one, or list both under datasets: with streaming: true")
    if cfg.val_set_size:
        yield f"{streamed} with val_set_size: a stream cannot hold rows out: set test_datasets for evaluation"
    dropped = {"group_by_length": "sorts the whole data by length, which a stream never holds",
               "dataset_prepared_path": "keeps tokenised data, and streamed rows are tokenised as they are read",
               "dataset_exact_deduplication": "compares every row with every other, which a stream never holds"}
    for key, why in dropped.items():
        if getattr(cfg, key):
            yield f"{streamed} with {key}: {why}: remove {key}"
    if cfg.dataset_num_proc and cfg.dataset_num_proc > 1 and not cfg.test_datasets:
        yield (f"{streamed} with dataset_num_proc: streamed rows are tokenised in the training process, a buffer at a "
               "time (the key applies to test_datasets only): remove it")
    raw_lists = [key for key, entries in (("pretraining_dataset", cfg.pretraining_dataset or []), ("datasets", cfg.datasets))
                 for ds in entries if ds.type == "pretrain"]
    if raw_lists and cfg.uses_mistral_common:
        yield (f"{raw_lists[0]} of raw text (type: pretrain) with tokenizer_use_mistral_common is not built: stream chat rows "
               "(type: chat_template) or set tokenizer_use_mistral_common: false")


CONVERSATION_KEYS = ("field_prompt", "field_response", "system_prompt")  # SFT's chat_template rows; GRPO's columns


def conversation_problems(cfg):
    """Dataset entries' field_prompt, field_response and system_prompt (of datasets, test_datasets, validation.datasets
    and pretraining_dataset): SFT's chat_template rows read them, and the GRPO family's prompt rows read the first two
    as their prompt and answer columns."""
    sft = method_spec(cfg.method).data == "sft"
    for key, entries in (("datasets", cfg.datasets), ("test_datasets", cfg.test_datasets or []),
                         ("validation.datasets", cfg.validation.datasets or []),
                         ("pretraining_dataset", cfg.pretraining_dataset or [])):
        for index, ds in enumerate(entries):
            where, used = f"{key}[{index}]", [name for name in CONVERSATION_KEYS if getattr(ds, name)]
            if not used:
                continue
            names, one = ", ".join(used), len(used) == 1
            if method_spec(cfg.method).data == "prompt":
                yield from _prompt_columns(where, ds, used)
                continue
            if not sft:
                yield (f"{where}: {names} {'belongs' if one else 'belong'} to SFT's chat_template rows, and {cfg.method} "
                       f"reads its rows in its own formats: remove {'it' if one else 'them'} (docs/sft.md#type-chat_template)")
            elif ds.type not in ("chat_template", "chat_template.default"):
                shown = "none" if ds.type is None else ds.type if isinstance(ds.type, str) else "a user-defined mapping"
                inside = " (a mapping takes its own system_prompt inside `type:`)" if shown.startswith("a user") else ""
                yield (f"{where}: {names} {'is' if one else 'are'} read by type: chat_template, and this entry has type: "
                       f"{shown}{inside}: set type: chat_template, or remove {'it' if one else 'them'}")
            if bool(ds.field_prompt) != bool(ds.field_response):
                yield (f"{where}: field_prompt and field_response go together (the user's turn and the assistant's "
                       "answer): set both, or neither")
            if ds.field_prompt and "field_messages" in ds.model_fields_set:
                yield (f"{where}: field_messages and field_prompt / field_response both say where the conversation is: "
                       "keep field_messages (a message list) or the two columns")


def _prompt_columns(where: str, ds, used: list[str]):
    """GRPO-family prompt rows (no type): field_prompt is the prompt column, field_response the reference answer's."""
    if "system_prompt" in used:
        yield (f"{where}: system_prompt belongs to SFT's chat_template rows; a GRPO prompt takes its system turn from the "
               "data (a message-list prompt): remove it")
    if ds.type is not None and (ds.field_prompt or ds.field_response):
        yield (f"{where}: field_prompt / field_response name the prompt and answer columns of rows read as they are (no "
               f"type), and this entry has type: {ds.type if isinstance(ds.type, str) else 'a mapping'}: remove the type "
               "(or the two keys; a transform can return `prompt` and `answer` itself)")
