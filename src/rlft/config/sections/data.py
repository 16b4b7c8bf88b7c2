"""Top-level keys of the training data: datasets, evaluation split, tokenised-data cache, streaming and batch
layout."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import field_validator

from rlft.config.base import Section, field
from rlft.config.sections.datasets import DatasetConfig, PretrainingDatasetConfig


class DataFields(Section):
    """The data keys of the config file."""

    # --- data ---
    datasets: list[DatasetConfig] = field([], "Training datasets, merged in order.")
    test_datasets: Optional[list[DatasetConfig]] = field(None, "Evaluation datasets (instead of val_set_size).")
    val_set_size: float = field(0.0, "Hold out this fraction (<1) or number of rows (>=1) of the training data: its last rows, after the "
                                   "merged datasets' seeded shuffle (as Axolotl).", ge=0.0)
    dataset_prepared_path: Optional[str] = field(None, "Folder that keeps tokenised data; reused while config, data files, "
                                                       "tokenizer and rlft are unchanged (docs/sft.md).")
    dataset_num_proc: Optional[int] = field(
        None, "Processes that tokenise rows: above 1, datasets.map with num_proc; default 1, a loop in the training process.",
        ge=1)
    shuffle_merged_datasets: bool = field(True, "Shuffle the merged training rows once (seeded).")
    dataset_exact_deduplication: bool = field(
        False, "Drop prepared examples identical to an earlier one (training and eval data each), and eval examples "
        "identical to a training one, as Axolotl does.")
    sequence_len: int = field(512, "Maximum tokens per training sequence.")
    pretraining_dataset: Optional[list[PretrainingDatasetConfig]] = field(
        None, "SFT on one dataset read as training goes, raw text by default (type: pretrain); a hub id or path alone "
        "is accepted. Needs max_steps (docs/sft.md#streamed-data-pretraining_dataset-and-streaming).")
    streaming: bool = field(False, "SFT: read `datasets` as training goes instead of tokenising them first (needs "
                                   "max_steps; docs/sft.md#streamed-data-pretraining_dataset-and-streaming).")
    streaming_multipack_buffer_size: int = field(
        10000, "Streamed data: rows read, tokenised, packed and shuffled together.", ge=1)
    pretrain_multipack_attn: bool = field(
        True, "pretraining_dataset with sample_packing: each text attends only to itself (false: a packed row is one "
        "sequence, its texts attending across).")
    excess_length_strategy: Literal["drop", "truncate", "raise"] = field(
        "drop", "What to do with rows longer than sequence_len."
    )
    train_on_inputs: bool = field(False, "SFT: also compute the loss on prompt (non-assistant) tokens.")
    sample_packing: bool = field(False, "SFT: pack several documents per row, with per-document attention.")
    eval_sample_packing: Optional[bool] = field(None, "SFT: pack the eval rows too (default: as sample_packing).")
    group_by_length: Optional[bool] = field(
        None, "SFT without sample_packing: rows of similar length share a micro-batch (less padding), the batches in "
        "random order, as transformers' group_by_length; None -> false. Preference and reward-model batches are "
        "always grouped so.")
    pad_to_sequence_len: bool = field(False, "SFT, preference and reward-model batches: pad every batch to sequence_len "
                                          "tokens (one shape for every step).")
    pad_to_multiple_of: Optional[int] = field(
        None, "Round each batch's width up to a multiple of this (SFT, preference, reward-model and online-RL micro-batches; "
              "not strided EBFT's documents). Unset: 64 on a "
              "CUDA GPU (as Axolotl; a few batch shapes, so per-shape kernel and allocator costs are paid a few times), "
              "1 on a CPU (every padding token costs compute there).", ge=1)
    remove_unused_columns: bool = field(
        False, "Axolotl key: rlft never drops dataset columns (reward functions read them), so only false is valid."
    )
    skip_prepare_dataset: bool = field(False, "grpo/gdpo: keep prompts of any length (no excess_length_strategy on prompts).")

    @field_validator("remove_unused_columns")
    @classmethod
    def _keeps_columns(cls, value: bool) -> bool:
        if value:
            raise ValueError("rlft keeps every dataset column (reward functions read them): remove the key or set it to false")
        return value

    @field_validator("pretraining_dataset", mode="before")
    @classmethod
    def _pretraining_path(cls, value: Any) -> Any:
        """Axolotl's short form: a hub id or path alone."""
        return [{"path": value}] if isinstance(value, str) else value

    @field_validator("val_set_size")
    @classmethod
    def _val_size(cls, value: float) -> float:
        if value < 0 or (value >= 1 and value != int(value)):
            raise ValueError("must be a fraction in [0, 1) or a whole number of rows")
        return value

    @property
    def streamed(self) -> bool:
        """Whether the training rows are read as training goes (`pretraining_dataset`, `streaming: true`)."""
        return bool(self.pretraining_dataset) or self.streaming
