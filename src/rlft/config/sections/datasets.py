"""Entries of `datasets:`, `test_datasets:` and `pretraining_dataset:`, and the user-defined row format."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import model_validator

from rlft.config.axolotl_tables import DATASET, known_only
from rlft.config.base import Section, field


class UserDefinedType(Section):
    """`type:` given as a mapping: a user-defined format built from field names and format strings.

    SFT reads the instruction fields, DPO/SimPO the prompt/chosen/rejected fields, KTO the
    prompt/completion/label fields; a format string names the fields it inserts as `{field}`.
    """

    system_prompt: Optional[str] = field(None, "System prompt used when a row has none.")
    system_format: str = field("{system}", "How the system prompt is rendered before the prompt.")
    field_system: str = field("system", "Column holding the system prompt.")
    field_instruction: str = field("instruction", "SFT: column holding the instruction.")
    field_input: str = field("input", "SFT: column holding the optional input.")
    field_output: str = field("output", "SFT: column holding the target output.")
    format: str = field("{instruction} {input} ", "SFT: prompt format when the row has an input.")
    no_input_format: str = field("{instruction} ", "SFT: prompt format when the row has no input.")
    field_prompt: str = field("prompt", "Preference/KTO: column holding the prompt.")
    field_chosen: str = field("chosen", "DPO: column holding the chosen answer.")
    field_rejected: str = field("rejected", "DPO: column holding the rejected answer.")
    field_completion: str = field("completion", "KTO: column holding the completion.")
    field_label: str = field("label", "KTO: column holding the desirable (true) / undesirable label.")
    prompt_format: str = field("{prompt}", "Preference/KTO: how the prompt is rendered.")
    chosen_format: str = field("{chosen}", "DPO: how the chosen answer is rendered.")
    rejected_format: str = field("{rejected}", "DPO: how the rejected answer is rendered.")
    completion_format: str = field("{completion}", "KTO: how the completion is rendered.")


class DatasetConfig(known_only("AxolotlDatasetKeys", DATASET)):
    """One entry of `datasets:` / `test_datasets:`."""

    path: Optional[str] = field(
        None, "Local file, folder of files, `save_to_disk` folder, or a hub dataset id (hub only when online)."
    )
    ds_type: Optional[Literal["json", "jsonl", "csv", "parquet", "arrow", "text"]] = field(
        None, "File format; inferred from the file extension when unset."
    )
    data_files: Optional[Union[str, list[str]]] = field(
        None, "Files to read, relative to `path` when `path` is a folder, else to the working directory (beside a file `path`, "
        "only that file itself)."
    )
    name: Optional[str] = field(None, "Dataset configuration name (hub datasets with several configs).")
    split: str = field("train", "Split with an optional slice: `train`, `train[:1%]`, `train[10:100]`.")
    revision: Optional[str] = field(None, "Hub revision (branch, tag or commit).")
    type: Optional[Union[str, UserDefinedType]] = field(
        None,
        "Row format: a built-in dotted name (`chat_template`, `alpaca`, `completion`, `chatml.intel`, ...), "
        "a user transform `module.fn` importable from the working directory, or a mapping (user-defined).",
    )
    field_messages: str = field("messages", "chat_template: column holding the message list (dotted path allowed); a "
                                "`system` column leads the chat unless it starts with a system turn, as in Axolotl.")
    field_tools: str = field("tools", "chat_template: column holding the tools the chat template shows (a list of tool "
                             "schemas, or its JSON text).")
    message_property_mappings: Optional[dict[str, str]] = field(
        None, "chat_template: message key for each canonical property, e.g. {role: from, content: value}."
    )
    message_field_role: Optional[str] = field(None, "chat_template (legacy): message key holding the role.")
    message_field_content: Optional[str] = field(None, "chat_template (legacy): message key holding the content.")
    roles: Optional[dict[str, list[str]]] = field(
        None, "chat_template: canonical role -> the role names that mean it in the data."
    )
    roles_to_train: list[str] = field(["assistant"], "chat_template: roles whose turns carry the loss.")
    train_on_eos: Literal["turn", "all", "last", "none"] = field(
        "turn", "chat_template: train on the end-of-turn token of trained turns (turn), all turns, the last, or none."
    )
    drop_system_message: bool = field(False, "chat_template: drop system messages from every row.")
    field_prompt: Optional[str] = field(
        None, "chat_template (SFT): column holding the user's turn (a text or a message list), trained as a conversation "
        "with field_response's answer, in place of field_messages. GRPO family (no type): column holding the prompt, "
        "read as `prompt`. Cosmos-RL's prompt_column_name. Default: unset.")
    field_response: Optional[str] = field(
        None, "chat_template (SFT): column holding the assistant's answer to field_prompt (a text or a message list). GRPO "
        "family (no type): column holding the reference answer, which reward functions get as `answer` (the built-ins "
        "read it). Cosmos-RL's response_column_name. Default: unset.")
    system_prompt: Optional[str] = field(
        None, "chat_template (SFT): a system turn of this text leads every conversation that starts without one (a row's "
        "own system turn or `system` column wins; with drop_system_message, this replaces them). Cosmos-RL's "
        "system_prompt. Default: unset (no system turn added).")
    field_chosen: str = field("chosen", "Preference chat_template: key of the chosen message.")
    field_rejected: str = field("rejected", "Preference chat_template: key of the rejected message.")
    # Last on purpose: the attribute `field` shadows the `field()` helper for the lines after it.
    field: str = field("text", "completion: column holding the raw text.")

    @model_validator(mode="after")
    def _needs_a_source(self) -> "DatasetConfig":
        if not self.path and not self.data_files:
            raise ValueError("a dataset needs `path` (a file, folder or hub id) or `data_files`")
        return self


class PretrainingDatasetConfig(DatasetConfig):
    """The entry of `pretraining_dataset:`: streamed text (`type: pretrain`) or an SFT format
    (docs/sft.md#streamed-data-pretraining_dataset-and-streaming)."""

    type: Optional[Union[str, UserDefinedType]] = field(
        "pretrain", "pretrain: raw text in `text_column`, cut into pieces of sequence_len tokens; or an SFT row format.")
    text_column: str = field("text", "pretrain: column holding the text.")
    skip: int = field(0, "Rows of the stream to pass over before training starts.", ge=0)
