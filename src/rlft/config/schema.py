"""The whole config language: Axolotl-style top-level keys plus the `trl:`, `ebft:`, `vllm:` sections.

Defaults equal the documented Axolotl/TRL ones. Cross-field rules live in `combination_problems`
(run by `rlft.config.build_config`), so `rlft validate` reports them without loading a model or a dataset.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import AliasChoices, TypeAdapter, ValidationError, field_validator, model_validator

from rlft.config.activation_checkpointing import checkpoints
from rlft.config.axolotl_tables import DATASET, TOP_LEVEL, known_only
from rlft.config.base import Section, field, planned
from rlft.config.best_model import best_model_problems
from rlft.config.lora_inits import LORA_INITS, REFUSED_LORA_INITS, rewriting
from rlft.config.optimizers import check_optimizer
from rlft.config.parallel import deepspeed_settings, fsdp_settings, launched
from rlft.config.plugins import CCE_PLUGIN, NEMO_GYM_PLUGIN, cut_cross_entropy, nemo_gym_enabled
from rlft.config.rl import DEFAULTS as RL_DEFAULTS
from rlft.config.sections import (EBFTConfig, NemoGymFields, PreferenceFields, QATConfig, TRLConfig, VLLMConfig,
                                  combination_problem)
from rlft.config.template_names import NAMES as CHAT_TEMPLATE_NAMES
from rlft.config.trackers import TrackerFields
from rlft.config.unfrozen import parse_pattern

RlMethod = Literal["dpo", "ipo", "kto", "orpo", "simpo", "grpo", "gdpo", "ebft"]
ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
# Axolotl's other attention names (its CANONICAL_ATTN_IMPLS; `org/name` hub kernels also validate): train refuses them
AXOLOTL_ATTENTION = ("xformers", "sage", "fp8")
# transformers' schedules (`get_scheduler`), less the two that need a metric at every step
Scheduler = Literal["cosine", "linear", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial", "inverse_sqrt",
                    "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay"]


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


def _as_bool(value: Any) -> bool | None:
    """`value` as a bool field reads it, or None where it is not one."""
    try:
        return TypeAdapter(bool).validate_python(value)
    except ValidationError:
        return None


class RlftConfig(PreferenceFields, NemoGymFields, TrackerFields, known_only("AxolotlKeys", TOP_LEVEL)):
    """The whole config file."""

    # --- model ---
    base_model: Optional[str] = field(
        None, "Hugging Face model folder (config.json, weights, tokenizer) or a hub id when online."
    )
    base_model_config: Optional[str] = field(None, "Folder whose config.json is used instead of base_model's.")
    revision_of_model: Optional[str] = field(
        None, "Branch, tag or commit of base_model on the hub, for its weights, config, tokenizer and generation config "
              "(offline: the cached snapshot of that revision), and for ref_model, tokenizer_config and base_model_config "
              "where they name the same repository; a saved adapter records it for its base. Refused when base_model is "
              "a local folder (Axolotl's key; model_revision too).",
        validation_alias=AliasChoices("revision_of_model", "model_revision"))
    tokenizer_config: Optional[str] = field(None, "Folder or hub id of the tokenizer (default: base_model).")
    model_type: Optional[str] = field(None, "transformers class that loads the model: AutoModelForCausalLM (the default) or a "
                                            "*ForCausalLM class; reward models: AutoModelForSequenceClassification. Other "
                                            "classes validate and train refuses them (Axolotl's key; type_of_model too).",
                                      validation_alias=AliasChoices("model_type", "type_of_model"))
    tokenizer_type: Optional[str] = field(None, "transformers class that loads the tokenizer: AutoTokenizer (the default) or a "
                                                "*Tokenizer / *TokenizerFast class.")
    tokenizer_use_mistral_common: Optional[bool] = field(
        None, "Load Mistral's own tokenizer (tekken.json or tokenizer.model.v*) through the mistral-common package, which "
              "encodes conversations itself (no chat template): SFT with chat_template or completion datasets. Unset: on "
              "when base_model, base_model_config or tokenizer_config names a Magistral model, as in Axolotl "
              "(docs/sft.md#mistrals-own-tokenizer-tokenizer_use_mistral_common).")
    overrides_of_model_config: Optional[dict[str, Any]] = field(
        None, "Settings set on the model's config before it is built (Axolotl's `model_config`), e.g. {rope_scaling: "
              "{rope_type: linear, factor: 2.0}}. With output_router_logits: true an MoE model's load-balancing loss "
              "(router_aux_loss_coef x aux_loss) joins the loss of SFT, as transformers adds it, and of the preference "
              "methods and the GRPO family, as TRL's trainers add it.",
        validation_alias=AliasChoices("model_config", "overrides_of_model_config"))
    tokens: Optional[list[str]] = field(None, "Tokens to add to the tokenizer (the embeddings are resized).")
    resize_token_embeddings_to_32x: Optional[bool] = field(
        None, "Grow the embedding rows to the tokenizer's length rounded up to a multiple of 32 (faster matrix products "
              "on some GPUs), not to the length itself.")
    shrink_embeddings: Optional[bool] = field(
        None, "Cut embedding rows beyond the tokenizer's length (or its multiple of 32); by default spare rows are kept.")
    mean_resizing_embeddings: Optional[bool] = field(
        False, "New embedding rows drawn around the old rows' mean and covariance (transformers' mean resizing); false "
               "(Axolotl's default): initialised as the model's own weights are, seeded by `seed`.")
    eot_tokens: Optional[list[str]] = field(None, "The strings that end a turn in the chat template (train_on_eos trains them); "
                                                  "added as special tokens when the tokenizer lacks them. Default: found in "
                                                  "the template.")
    random_init: bool = field(
        False, "Start from freshly initialised weights built from the model config (seeded by `seed`); Axolotl's "
               "reinit_weights too.", validation_alias=AliasChoices("random_init", "reinit_weights"))
    trust_remote_code: bool = field(False, "Allow model code shipped with the checkpoint to run.")
    special_tokens: Optional[dict[str, str]] = field(
        None, "Tokens to set on the tokenizer, e.g. {pad_token: '<|pad|>'}; new tokens resize the embeddings."
    )
    chat_template: str = field(
        "tokenizer_default",
        "tokenizer_default | a named template (chatml, llama3, qwen_25, gemma, phi_3, mistral_v1, alpaca, ...: docs/sft.md) | "
        "jinja (with chat_template_jinja) | a path to a .jinja file | tokenizer_default_fallback_NAME.",
    )
    chat_template_jinja: Optional[str] = field(None, "With chat_template: jinja, the template text or a file path.")

    # --- precision and attention ---
    bf16: Union[bool, Literal["auto"]] = field("auto", "bfloat16 mixed precision; `auto` (the default, as Axolotl's) uses it on "
                                                       "a CUDA GPU that supports it, unless fp16: true.")
    bfloat16: Optional[bool] = field(None, "Axolotl's other name for bf16: true (its examples set both); refused beside "
                                           "bf16: false.")
    fp16: bool = field(False, "float16 mixed precision (CUDA only).")
    tf32: Union[bool, Literal["auto"]] = field("auto", "Allow TF32 matmuls on CUDA; `auto` (the default, as Axolotl's) "
                                                       "where the GPU has them (Ampere and newer).")
    attn_implementation: Optional[str] = field(
        None, "transformers attention implementation: sdpa (default), eager, flash_attention_2, flash_attention_3, flex_attention; "
              "the *_attention flags below set it too. Axolotl's others (xformers, hub kernels `org/name`) validate; train refuses them."
    )
    flash_attention: bool = field(False, "Use flash_attention_2 (needs the flash-attn package and a CUDA GPU).")
    flex_attention: bool = field(False, "Use PyTorch flex_attention (GPU only for training).")
    torch_compile: Union[bool, Literal["auto"]] = field(
        False, "torch.compile the trained model's forward (every method), and for online RL the rollout engine's decode "
               "step with a static KV cache (in-process, or the server's transformers backend): faster steps after a "
               "compile of seconds to a minute. `auto`: on CUDA GPUs only.")
    torch_compile_backend: Optional[str] = field(None, "torch.compile backend for torch_compile (default inductor).")
    torch_compile_mode: Optional[Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]] = field(
        None, "torch.compile mode for torch_compile (default: reduce-overhead, CUDA graphs, on a GPU; default on a CPU).")
    liger_rope: bool = field(False, "Liger Kernel's RoPE kernel (CUDA GPU and the liger-kernel package: pip install "
                                    "'rlft[liger]'; docs/training.md#liger-kernel).")
    liger_rms_norm: bool = field(False, "Liger Kernel's RMSNorm (CUDA GPU, liger-kernel).")
    liger_layer_norm: bool = field(False, "Liger Kernel's LayerNorm, for models that have LayerNorm layers (CUDA GPU, liger-kernel).")
    liger_glu_activation: bool = field(False, "Liger Kernel's gated MLP, SwiGLU (GeGLU for Gemma) (CUDA GPU, liger-kernel).")
    liger_swiglu: bool = field(False, "Axolotl's older name of liger_glu_activation.")
    liger_fused_linear_cross_entropy: bool = field(
        False, "SFT's loss through Liger Kernel's fused linear cross-entropy kernel instead of rlft's chunked torch one "
               "(neither builds the full logits; CUDA GPU, liger-kernel).")
    liger_cross_entropy: bool = field(False, "As liger_fused_linear_cross_entropy: rlft never builds the logits that a plain "
                                             "cross-entropy kernel would read.")
    cut_cross_entropy: Optional[bool] = field(
        None, "Axolotl's Cut Cross-Entropy plugin (plugins: [axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin], "
              "which turns it on): the loss without the (B, T, V) logits block. rlft's own chunked output-layer loss does "
              "this on every device without the package, fp32 included; the plan's `loss` row says where it applies "
              "(docs/training.md#losses-without-a-logits-block).")
    sdp_attention: bool = field(False, "Use PyTorch scaled_dot_product_attention (the default).")
    eager_attention: bool = field(False, "Use the plain eager attention implementation.")
    gradient_checkpointing: Union[bool, Literal["offload", "offload_disk"]] = field(
        False, "Recompute activations in the backward pass to save memory (offload: as Axolotl, also activation_offloading; "
               "offload_disk: train refuses it).")
    gradient_checkpointing_kwargs: Optional[dict[str, Any]] = field(
        None, "Passed to transformers' activation_checkpointing_enable, e.g. {use_reentrant: false}."
    )
    activation_offloading: Union[bool, Literal["legacy", "disk", "hidden_states"]] = field(
        False, "On a GPU, keep each checkpointed layer's input in pinned host memory from the forward to the backward "
               "(transformers' activation offloading): less GPU memory for a copy each way. true, legacy and "
               "hidden_states do the same in rlft (Axolotl's hidden_states); disk is not built. Needs "
               "gradient_checkpointing (docs/training.md#activation-offloading).")

    unfrozen_parameters: Optional[list[str]] = field(
        None, "Train only the parameters whose names match one of these patterns (Axolotl's rules: a regex matched from "
              "the start of the name, dots literal; a trailing [start:end] trains only those rows), e.g. "
              "['^model.layers.1[0-5].', '^model.norm.weight$']. Full fine-tuning only.")

    neftune_noise_alpha: Optional[float] = field(
        None, "NEFTune (https://arxiv.org/abs/2310.05914): uniform noise of scale alpha / sqrt(L * d) on the input "
              "embeddings while training (L: the micro-batch's row length, d: the hidden size), as transformers adds it; "
              "SFT and reward models, as in Axolotl. Papers use 5 to 15.", gt=0.0)

    # --- adapters ---
    adapter: Optional[Literal["lora", "qlora"]] = field(None, "Train a PEFT adapter instead of all weights.")
    lora_model_dir: Optional[str] = field(None, "Start from an existing LoRA adapter folder.")
    lora_r: int = field(8, "LoRA rank.", ge=1)
    lora_alpha: int = field(16, "LoRA scaling numerator (scale = alpha / r, or alpha / sqrt(r) with rsLoRA).", ge=1)
    lora_dropout: float = field(0.0, "Dropout on the LoRA input.", ge=0.0, lt=1.0)
    lora_target_modules: Optional[Union[str, list[str]]] = field(None, "Module names (or a regex) to adapt.")
    lora_target_linear: bool = field(False, "Adapt every linear layer except the output head.")
    lora_target_parameters: Optional[Union[str, list[str]]] = field(
        None, "Parameters (not modules) to adapt, by name suffix, e.g. [experts.gate_up_proj, experts.down_proj]: the "
              "experts of an MoE model, one 3D tensor per layer in transformers 5 (PEFT's target_parameters; needs "
              "lora_dropout: 0).")
    lora_fan_in_fan_out: Optional[bool] = field(
        None, "PEFT's fan_in_fan_out: whether the adapted layer stores its weight as (in, out). PEFT sets it from each "
              "layer's type (true for GPT-2's Conv1D, false for nn.Linear) and warns when the value given differs.")
    lora_modules_to_save: Optional[list[str]] = field(None, "Modules trained in full and saved with the adapter.")
    peft_use_rslora: bool = field(False, "Rank-stabilised LoRA scaling alpha/sqrt(r) (https://arxiv.org/abs/2312.03732).")
    peft_use_dora: bool = field(False, "Weight-decomposed LoRA (https://arxiv.org/abs/2402.09353).")
    peft_init_lora_weights: Optional[Union[bool, str]] = field(
        None, "PEFT init_lora_weights: true, false, gaussian, orthogonal, mica, pissa, pissa_niter_N, olora (loftq, eva "
              "and corda are refused: docs/training.md#adapters-lora-through-peft).")
    load_in_4bit: bool = field(False, "Load the base model in 4 bit (QLoRA; needs bitsandbytes and a CUDA GPU).")
    load_in_8bit: bool = field(False, "Load the base model in 8 bit (needs bitsandbytes and a CUDA GPU).")

    # --- data ---
    datasets: list[DatasetConfig] = field([], "Training datasets, merged in order.")
    test_datasets: Optional[list[DatasetConfig]] = field(None, "Evaluation datasets (instead of val_set_size).")
    val_set_size: float = field(0.0, "Hold out this fraction (<1) or number of rows (>=1) of the training data: its last rows, after the "
                                   "merged datasets' seeded shuffle (as Axolotl).", ge=0.0)
    dataset_prepared_path: Optional[str] = field(None, "Folder that keeps tokenised data; reused while config, data files, "
                                                       "tokenizer and rlft are unchanged (docs/sft.md).")
    dataset_num_proc: Optional[int] = field(None, "Processes that tokenise rows (datasets.map num_proc; default 1).", ge=1)
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

    # --- loop ---
    micro_batch_size: int = field(1, "Rows per forward pass per device.")
    eval_batch_size: Optional[int] = field(None, "Rows per evaluation forward pass (default: micro_batch_size).", ge=1)
    gradient_accumulation_steps: int = field(1, "Micro-batches per optimizer step.")
    num_epochs: float = field(1.0, "Passes over the training data (max_steps wins when set).", gt=0.0)
    max_steps: Optional[int] = field(None, "Stop after this many optimizer steps.", ge=1)
    optimizer: str = field("adamw_torch_fused", "transformers' optimizer name (adamw_torch_fused, adamw_torch, adafactor, adamw_bnb_8bit, "
                           "paged_adamw_8bit, lion_32bit, schedule_free_adamw, ...), or adamw / adam.")
    learning_rate: float = field(2e-5, "Peak learning rate.", gt=0.0, le=10.0)
    adam_beta1: float = field(0.9, "Adam beta1.", ge=0.0, lt=1.0)
    adam_beta2: float = field(0.999, "Adam beta2.", ge=0.0, lt=1.0)
    adam_epsilon: float = field(1e-8, "Adam epsilon.", gt=0.0)
    weight_decay: float = field(0.0, "Decoupled weight decay (not applied to biases and norms).", ge=0.0)
    max_grad_norm: Optional[float] = field(1.0, "Clip the global gradient norm to this (null or 0: no clipping).", ge=0.0)
    lr_scheduler: Scheduler = field("cosine", "Learning-rate schedule after warm-up.")
    lr_scheduler_kwargs: Optional[dict[str, Any]] = field(None, "Extra arguments of the schedule (transformers' "
                                                                "scheduler_specific_kwargs), e.g. {num_cycles: 2}.")
    cosine_min_lr_ratio: float = field(0.0, "cosine: final learning rate as a fraction of the peak (runs cosine_with_min_lr).",
                                       ge=0.0, le=1.0)
    warmup_steps: Optional[int] = field(None, "Linear warm-up steps (1 runs as 2, as in Axolotl). Neither this nor warmup_ratio: "
                                                 "3 % of the steps, at most 100 (Axolotl's default).", ge=0)
    warmup_ratio: Optional[float] = field(None, "Linear warm-up as a fraction of all steps, rounded down.", ge=0.0, le=1.0)
    seed: int = field(42, "Seed for weights (random_init), data order, dropout and sampling (numpy takes 0 to 2**32 - 1).",
                      ge=0, le=2**32 - 1)
    logging_steps: int = field(1, "Log every N optimizer steps.")
    eval_steps: Optional[int] = field(None, "Evaluate every N steps (default: at the end only).", ge=1)
    evals_per_epoch: Optional[int] = field(None, "Evaluate this many times per epoch, evenly spaced (instead of eval_steps); "
                                           "0 = at the end only.", ge=0)
    save_steps: Optional[int] = field(None, "Save a checkpoint every N steps (default: at the end only).", ge=1)
    saves_per_epoch: Optional[int] = field(None, "Save this many checkpoints per epoch, evenly spaced (instead of save_steps); "
                                           "0 = at the end only.", ge=0)
    eval_strategy: Optional[Literal["no", "steps", "epoch"]] = field(
        None, "Axolotl's evaluation schedule: steps (eval_steps or evals_per_epoch; the default), epoch (at each epoch's "
              "end), no (no evaluation at all, also not before the first step and at the end).")
    save_strategy: Optional[Literal["no", "steps", "epoch", "best"]] = field(
        None, "Axolotl's checkpoint schedule: steps (save_steps or saves_per_epoch; the default), epoch (at each epoch's "
              "end), best (after each evaluation whose metric_for_best_model is the best so far), no (no checkpoints, "
              "only the final model). A checkpoint of the last step is saved at the end unless no.")
    save_total_limit: int = field(4, "Keep only the newest N checkpoints (Axolotl's default 4; 0 also keeps 4, as in "
                                     "Axolotl).", ge=0)
    save_only_model: bool = field(
        False, "Checkpoints hold the model's weights only, not the optimizer, schedule and RNG state (HF's and Axolotl's "
               "key): smaller and faster to write, but no run can resume from them (docs/training.md#checkpoints).")
    output_dir: str = field("./model-out", "Where checkpoints, metrics.jsonl and the final model go (Axolotl's default).")
    resume_from_checkpoint: Optional[str] = field(None, "A checkpoint folder, or `auto` for the newest in output_dir.")
    loss_watchdog_threshold: Optional[float] = field(None, "Stop when the training loss stays above this for "
                                                     "loss_watchdog_patience steps in a row (about twice the first loss).", gt=0.0)
    loss_watchdog_patience: Optional[int] = field(None, "Steps in a row above loss_watchdog_threshold before stopping "
                                                  "(default 3).", ge=1)
    early_stopping_patience: Optional[int] = field(None, "Stop when eval/loss (metric_for_best_model) has not improved for "
                                                   "this many evaluations (the final model and a checkpoint are saved).", ge=1)
    load_best_model_at_end: Optional[bool] = field(
        None, "The final model is the checkpoint with the best eval metric, not the last step's weights; every "
              "checkpoint is evaluated while it is on. Unset: on with early_stopping_patience for SFT and reward models "
              "with an eval set, save_steps and eval_steps (save_steps a multiple of eval_steps), as in Axolotl.")
    metric_for_best_model: Optional[str] = field(
        None, "The eval metric load_best_model_at_end, early_stopping_patience and save_strategy: best watch (default "
              "loss: eval/loss), e.g. accuracy for eval/accuracy.")
    greater_is_better: Optional[bool] = field(
        None, "Whether a higher metric_for_best_model is better (default: false for metrics ending in loss, else true).")
    debug: bool = field(False, "`rlft preprocess` shows the first rows token by token with the trained tokens marked "
                               "(as `--debug`).")
    mfu_peak_flops: Optional[float] = field(
        None, "Peak FLOP/s of one device for the MFU metric (default: a table of known devices).", gt=0.0
    )

    # --- logging ---
    # the experiment trackers' keys: config/trackers.py

    # --- methods ---
    rl: Optional[RlMethod] = field(None, "The method: unset for SFT, else dpo, ipo, kto, orpo, simpo, grpo, gdpo, ebft.")
    trl: TRLConfig = field(default_factory=TRLConfig, description="Online-RL (GRPO family) options.")
    ebft: EBFTConfig = field(default_factory=EBFTConfig, description="Energy-based fine-tuning options.")
    qat: Optional[QATConfig] = field(None, "Quantization-aware training through torchao's fake quantizers (Axolotl's "
                                           "section; SFT): docs/training.md#quantization-aware-training-qat.")
    vllm: VLLMConfig = field(default_factory=VLLMConfig, description="Rollout server (vLLM) options.")
    batch_flattening: Union[bool, Literal["auto"]] = field(
        False, "Each micro-batch as one sequence without padding, rows kept apart (SFT without sample_packing, and the GRPO "
        "family's rollouts; https://arxiv.org/abs/2407.09105). auto: on with flash_attention and micro_batch_size > 1, as in "
        "Axolotl; true also works with SDPA (attention per row, no mask: rlft.models.varlen) and eager attention (a "
        "block-diagonal mask)."
    )
    share_prompts: Optional[bool] = field(
        None, "Answers to one prompt in one sequence, the prompt once and every answer after it, a mask keeping each "
        "answer from the others (prefix sharing, https://arxiv.org/abs/2410.20305): each pair's prompt (dpo, ipo, orpo, "
        "simpo, reward models) or each group's prompt (grpo, gdpo) runs through the model once, for the same results. "
        "SDPA or eager attention. None -> on where rlft has checked the model type and it saves forward FLOPs (the plan "
        "says; GRPO decides per micro-batch); docs/preference.md, docs/grpo.md."
    )

    # --- several processes (docs/distributed.md) ---
    fsdp: Optional[list[str]] = field(None, "Shard the model over the processes (FSDP2): [full_shard, auto_wrap]; shard_grad_op "
                                      "keeps parameters gathered until backward; offload moves them to the CPU.")
    fsdp_config: Optional[dict[str, Any]] = field(
        None, "FSDP settings: fsdp_transformer_layer_cls_to_wrap, fsdp_reshard_after_forward, fsdp_offload_params, "
              "fsdp_activation_checkpointing, fsdp_version (rlft always runs FSDP2).")
    ddp_timeout: int = field(1800, "Seconds a collective may wait for a rank before the run stops (a rank that hangs).", gt=0)
    ddp_find_unused_parameters: Optional[bool] = field(
        None, "DDP (plain data parallelism) looks for parameters that got no gradient in a step and reduces them anyway: "
              "needed when some do (a vision tower in text-only training). None -> false, "
              "as accelerate: a traversal less per step (transformers' Trainer and Axolotl: true without "
              "gradient_checkpointing).")
    ddp_bucket_cap_mb: Optional[int] = field(None, "DDP's gradient bucket size in MiB; None -> 25 (PyTorch's).", gt=0)
    ddp_broadcast_buffers: Optional[bool] = field(
        None, "DDP copies rank 0's buffers to the other ranks before each forward; None -> true (PyTorch's).")
    deepspeed: Optional[str] = field(None, "DeepSpeed JSON file (ZeRO-1/2/3): a path, or one rlft ships by name "
                                     "(deepspeed_configs/zero3_bf16.json); \"auto\" values come from the config.")
    context_parallel_size: int = planned(1, "Sequence/context parallel degree.", issue="#11", ge=1)

    @field_validator("chat_template")
    @classmethod
    def _chat_template_known(cls, value: str) -> str:
        if value in CHAT_TEMPLATE_NAMES or value.endswith((".jinja", ".j2")) or value.startswith("tokenizer_default_fallback_"):
            return value
        raise ValueError(f"expected one of {', '.join(CHAT_TEMPLATE_NAMES)} or a path to a .jinja file")

    @field_validator("tokenizer_type")
    @classmethod
    def _tokenizer_class(cls, value: Optional[str]) -> Optional[str]:
        if value is None or value.endswith(("Tokenizer", "TokenizerFast")):
            return value
        raise ValueError(f"{value!r}: expected AutoTokenizer or a transformers *Tokenizer / *TokenizerFast class")

    @field_validator("attn_implementation")
    @classmethod
    def _attention_known(cls, value: Optional[str]) -> Optional[str]:
        if value is None or value in ATTENTION or value in AXOLOTL_ATTENTION or "/" in value:
            return value
        raise ValueError(f"unknown attention implementation {value!r}: expected one of {', '.join(ATTENTION)}")

    @field_validator("optimizer")
    @classmethod
    def _optimizer_known(cls, value: str) -> str:
        return check_optimizer(value)

    @field_validator("micro_batch_size", "gradient_accumulation_steps", "sequence_len", "logging_steps")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1")
        return value

    @field_validator("remove_unused_columns")
    @classmethod
    def _keeps_columns(cls, value: bool) -> bool:
        if value:
            raise ValueError("rlft keeps every dataset column (reward functions read them): remove the key or set it to false")
        return value

    @model_validator(mode="before")
    @classmethod
    def _bfloat16_is_bf16(cls, data: Any) -> Any:
        """Axolotl's `bfloat16: true` trains in bf16 as `bf16: true` does (it reads `bf16 or bfloat16`). Values are read
        as the fields read them (1, "yes" and "true" are true); one neither field takes is reported by the field."""
        if not isinstance(data, dict) or "bfloat16" not in data or (on := _as_bool(data["bfloat16"])) is not True:
            return data
        if _as_bool(data.get("bf16")) is False:
            raise ValueError("bfloat16: true and bf16: false disagree: remove one (bfloat16 is Axolotl's other name for bf16)")
        return {**data, "bf16": on}

    @model_validator(mode="before")
    @classmethod
    def _one_revision_key(cls, data: Any) -> Any:
        for key, other in (("revision_of_model", "model_revision"), ("random_init", "reinit_weights")):
            if isinstance(data, dict) and data.get(key) is not None and data.get(other) is not None:
                raise ValueError(f"{key} and {other} are both set (two names of one key): keep one")
        return data

    @model_validator(mode="before")
    @classmethod
    def _jinja_template_alone(cls, data: Any) -> Any:
        """Axolotl's rule: `chat_template_jinja` without `chat_template` means `chat_template: jinja`."""
        if isinstance(data, dict) and data.get("chat_template_jinja") and data.get("chat_template") is None:
            data = {**data, "chat_template": "jinja"}
        return data

    @field_validator("save_strategy", "eval_strategy", mode="before")
    @classmethod
    def _unquoted_no(cls, value: Any) -> Any:
        """YAML reads an unquoted `no` as false: it means "no" here."""
        return "no" if value is False else value

    @field_validator("unfrozen_parameters")
    @classmethod
    def _patterns(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        for text in value or []:
            parse_pattern(text)
        return value

    @field_validator("save_total_limit")
    @classmethod
    def _zero_limit(cls, value: int) -> int:
        """Axolotl passes `save_total_limit or 4` on (core/builders/base.py): 0 keeps 4, not every checkpoint."""
        return value or 4

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

    @property
    def uses_mistral_common(self) -> bool:
        """tokenizer_use_mistral_common, or unset and a Magistral model named (Axolotl infers it the same way)."""
        if self.tokenizer_use_mistral_common is not None:
            return self.tokenizer_use_mistral_common
        return any("magistral" in (name or "").lower() for name in (self.base_model, self.base_model_config, self.tokenizer_config))

    @property
    def method(self) -> str:
        """The training method: `sft`, `reward_model`, or the value of `rl` (`ipo` means DPO+IPO loss)."""
        if self.rl:
            return self.rl
        return "reward_model" if self.reward_model else "sft"

    @property
    def flat_batches(self) -> str | None:
        """How micro-batches are flattened (`batch_flattening`): None (padded rows), "varlen" (flash-attention finds the
        rows from the position ids) or "mask" (a block-diagonal causal mask, for SDPA and eager attention)."""
        flash = self.effective_attn_implementation.startswith("flash_attention")
        if self.method in PREFERENCE_METHODS:  # TRL's and Axolotl's key for the DPO trainer's padding-free batches
            on = bool(self.dpo_padding_free)
        else:
            on = flattens_batches(self) and (self.batch_flattening is True or (
                self.batch_flattening == "auto" and flash and not self.sample_packing and self.micro_batch_size > 1))
        return ("varlen" if flash else "mask") if on else None

    @property
    def effective_attn_implementation(self) -> str:
        if self.attn_implementation:
            return self.attn_implementation
        if self.flash_attention:
            return "flash_attention_2"
        if self.flex_attention:
            return "flex_attention"
        if self.eager_attention:
            return "eager"
        return "sdpa"


PREFERENCE_METHODS = ("dpo", "ipo", "kto", "orpo", "simpo")
PAIR_METHODS = ("dpo", "ipo", "orpo", "simpo")  # trained on (prompt, chosen, rejected)
SHARING_METHODS = (*PAIR_METHODS, "reward_model", "grpo", "gdpo")  # several answers to one prompt in a micro-batch
ROUTER_LOSS_METHODS = ("sft", *PREFERENCE_METHODS, "grpo", "gdpo")  # an MoE router's load-balancing loss joins theirs


def prompt_sharing_problem(cfg) -> str | None:
    """Why this config's answers cannot share their prompt (`share_prompts`), or None (the model may still say no:
    `rlft.models.shared_prompts.shared_prompt_problem`)."""
    if cfg.method not in SHARING_METHODS:
        return f"it applies to {', '.join(SHARING_METHODS[:-1])} and {SHARING_METHODS[-1]}, not {cfg.method}"
    attention = cfg.effective_attn_implementation
    if attention not in ("sdpa", "eager"):
        return f"it needs SDPA or eager attention (they read the mask that keeps the answers apart), not {attention}"
    if cfg.pad_to_sequence_len:
        return "pad_to_sequence_len pads every row to sequence_len, and a pair with its prompt shared is up to twice that"
    if (cfg.overrides_of_model_config or {}).get("output_router_logits"):
        return ("model_config.output_router_logits: transformers' router loss weighs the tokens by a mask per row, which the "
                "shared layout (one mask per pair of answers) does not give it")
    return None


def flattens_batches(cfg) -> bool:
    """Whether the method's micro-batches can be flattened by `batch_flattening` (SFT, the GRPO family, structured EBFT)."""
    return cfg.method == "sft" or cfg.rl in ("grpo", "gdpo") or (cfg.rl == "ebft" and cfg.ebft.mode != "strided")


def combination_problems(cfg: RlftConfig):
    """Yield (keys, sentence) per impossible combination: the keys involved and the fix."""
    set_keys = cfg.model_fields_set
    if not cfg.base_model:
        yield "base_model is not set: give a model folder (or a hub id when online)"
    if not cfg.datasets and not nemo_gym_enabled(cfg) and not cfg.pretraining_dataset:  # NeMo Gym's task files replace datasets:
        yield "datasets is empty: add at least one entry with a `path`"
    if cfg.bf16 is True and cfg.fp16:
        yield "bf16 and fp16 are both true: choose one precision"
    yield from _model_config_problems(cfg)
    yield from _mistral_common_problems(cfg)
    yield from _qat_problems(cfg)
    yield from _streaming_problems(cfg)
    if cfg.activation_offloading and not checkpoints(cfg):
        yield ("activation_offloading moves each checkpointed layer's input to host memory, and needs gradient_checkpointing: "
               "true (as in Axolotl; or fsdp_config.activation_checkpointing)")
    defaults = {"ddp_find_unused_parameters": False, "ddp_broadcast_buffers": True}  # what DDP does anyway
    ddp_keys = [key for key in ("ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers")
                if getattr(cfg, key) is not None and getattr(cfg, key) != defaults.get(key)]
    if ddp_keys and (cfg.fsdp or cfg.fsdp_config or cfg.deepspeed):
        yield (f"{ddp_keys[0]} sets up DDP (plain data parallelism), and {'deepspeed' if cfg.deepspeed else 'fsdp'} reduces "
               "gradients its own way: remove it")
    if cfg.chat_template == "jinja" and not cfg.chat_template_jinja:
        yield "chat_template: jinja needs chat_template_jinja (the template text or a .jinja file path)"
    if cfg.chat_template_jinja and cfg.chat_template != "jinja":
        yield (f"chat_template_jinja is read with chat_template: jinja (or with chat_template unset), and chat_template is "
               f"{cfg.chat_template}: remove one of them")
    attention_flags = [k for k in ("flash_attention", "flex_attention", "sdp_attention", "eager_attention") if getattr(cfg, k)]
    if len(attention_flags) > 1:
        yield f"{' and '.join(attention_flags)} are all set: choose one attention implementation"
    if "liger_swiglu" in set_keys and "liger_glu_activation" in set_keys:
        yield "liger_swiglu and liger_glu_activation are both set: liger_swiglu is the older name, keep liger_glu_activation"
    if cfg.liger_cross_entropy and cfg.liger_fused_linear_cross_entropy:
        yield "liger_cross_entropy and liger_fused_linear_cross_entropy are both true: keep liger_fused_linear_cross_entropy"
    liger_ce = [key for key in ("liger_fused_linear_cross_entropy", "liger_cross_entropy") if getattr(cfg, key)]
    if liger_ce and cut_cross_entropy(cfg):
        yield (f"cut_cross_entropy and {liger_ce[0]} both choose the loss's kernel: keep one (cut_cross_entropy is on when "
               f"{CCE_PLUGIN} is listed; set cut_cross_entropy: false to keep Liger's)")
    if cfg.warmup_steps is not None and cfg.warmup_ratio is not None:
        yield "warmup_steps and warmup_ratio are both set: keep one"
    if cfg.test_datasets and cfg.val_set_size:  # as Axolotl refuses it: the held-out rows would be neither trained nor used
        yield ("test_datasets and val_set_size are both set: evaluation takes test_datasets, so val_set_size would hold "
               "nothing out; keep one")
    for steps, per_epoch in (("eval_steps", "evals_per_epoch"), ("save_steps", "saves_per_epoch")):
        if getattr(cfg, steps) and getattr(cfg, per_epoch):
            yield f"{steps} and {per_epoch} are both set: keep one"
    lora_keys = sorted(k for k in set_keys if k.startswith(("lora_", "peft_")) and k != "lora_model_dir")
    if lora_keys and cfg.adapter is None:
        yield f"{', '.join(lora_keys)} set without `adapter`: add `adapter: lora` (or remove them)"
    if (cfg.load_in_4bit or cfg.load_in_8bit) and cfg.adapter is None:
        yield "load_in_4bit/load_in_8bit quantise frozen weights: they need `adapter: qlora` or `adapter: lora`"
    if cfg.adapter == "qlora" and not cfg.load_in_4bit:
        yield "adapter: qlora needs load_in_4bit: true"
    if cfg.lora_target_parameters:
        yield from _parameter_lora_problems(cfg)
    for key in ("sample_packing", "eval_sample_packing"):
        if getattr(cfg, key) and cfg.method != "sft":
            yield f"{key} applies to SFT only, not {cfg.method}"
    if cfg.group_by_length and cfg.sample_packing:
        yield "group_by_length and sample_packing: packing already fills rows from documents of any length; keep one"
    if cfg.group_by_length and cfg.method not in ("sft", "reward_model", *PREFERENCE_METHODS):
        yield f"group_by_length groups SFT, preference and reward-model batches (rollouts are not drawn by length), not {cfg.method}"
    if cfg.batch_flattening is True and cfg.sample_packing:
        yield "batch_flattening and sample_packing both remove padding: keep one (sample_packing also fills rows across batches)"
    flattened = flattens_batches(cfg)
    if cfg.batch_flattening is True and not flattened:
        instead = "use dpo_padding_free: true" if cfg.method in PREFERENCE_METHODS else "remove it"
        yield (f"batch_flattening applies to SFT and to the GRPO family's rollouts (and structured EBFT), not {cfg.method}"
               f"{' in strided mode' if cfg.rl == 'ebft' else ''}: {instead}")
    if cfg.dpo_padding_free and cfg.method not in PREFERENCE_METHODS:
        yield (f"dpo_padding_free applies to the preference methods (dpo, ipo, kto, orpo, simpo), not {cfg.method}"
               f"{': use batch_flattening: true' if flattened else ''}")
    if cfg.pad_to_sequence_len and cfg.method in ("grpo", "gdpo", "ebft"):
        yield f"pad_to_sequence_len applies to SFT, preference and reward-model batches, not {cfg.method}"
    yield from _preference_problems(cfg)
    if cfg.rl == "ebft":
        yield from _ebft_problems(cfg)
    if cfg.rl in ("grpo", "gdpo") or (cfg.rl == "ebft" and cfg.ebft.mode != "strided"):
        yield from _grpo_problems(cfg)
    yield from _nemo_gym_problems(cfg)
    yield from best_model_problems(cfg)
    yield from _unfrozen_problems(cfg)
    yield from _lora_init_problems(cfg)
    yield from _neftune_problems(cfg)
    for settings in (fsdp_settings, deepspeed_settings):
        try:
            settings(cfg)
        except ValueError as exc:
            yield str(exc)
    if cfg.deepspeed and (cfg.fsdp or cfg.fsdp_config):
        yield "deepspeed and fsdp are both set: choose one way to shard the model"
    if cfg.context_parallel_size > 1 and (cfg.trl.async_prefetch or cfg.trl.use_data_producer):
        yield "context_parallel_size > 1 cannot be combined with trl.async_prefetch / trl.use_data_producer"


def _parameter_lora_problems(cfg: RlftConfig):
    if cfg.lora_dropout:
        yield (f"lora_target_parameters with lora_dropout {cfg.lora_dropout:g}: PEFT's LoRA on parameters has no dropout; set "
               "lora_dropout: 0")
    if cfg.peft_use_dora:
        yield "lora_target_parameters with peft_use_dora: PEFT has no DoRA for parameters; remove one"


def _model_config_problems(cfg: RlftConfig):
    settings = cfg.overrides_of_model_config or {}
    if settings.get("output_router_logits") and cfg.method not in ROUTER_LOSS_METHODS:
        yield (f"model_config.output_router_logits: the MoE router's load-balancing loss is added to the loss of SFT, "
               f"the preference methods (DPO, IPO, KTO, ORPO, SimPO/CPO) and the GRPO family; for {cfg.method} it is not "
               "built: remove it")
    if settings.get("output_router_logits") and not cfg.effective_attn_implementation.startswith("flash_attention") and (
            cfg.sample_packing or cfg.eval_sample_packing or cfg.flat_batches):
        yield ("model_config.output_router_logits with packed or flattened rows: transformers' router loss needs a mask per "
               "token, which packed rows have only under flash-attention; turn sample_packing / batch_flattening off, or "
               "use flash_attention on a GPU")
    loading = sorted(set(settings) - {"output_router_logits", "router_aux_loss_coef"})
    if loading and cfg.adapter:
        yield (f"model_config {', '.join(loading)} with an adapter: the adapter is saved for the original base model, which "
               "merge-lora, generate and the rollout server load without these settings; train without the adapter, or "
               "write them into a copy of the base model's config.json")


def _mistral_common_problems(cfg: RlftConfig):
    if not cfg.uses_mistral_common:
        return
    why = ("tokenizer_use_mistral_common" if cfg.tokenizer_use_mistral_common else
           "tokenizer_use_mistral_common (on for a Magistral model unless set to false)")
    if cfg.method != "sft":
        yield (f"{why} is built for SFT; {cfg.method} renders prompts as text through a chat template, which a "
               "mistral-common tokenizer does not have: set tokenizer_use_mistral_common: false to use the model's "
               "transformers tokenizer")
    edits = [key for key in ("chat_template", "chat_template_jinja", "special_tokens", "tokens")
             if getattr(cfg, key) and getattr(cfg, key) != "tokenizer_default"]  # set and not empty, as Axolotl checks
    if edits:
        yield (f"{why} with {', '.join(edits)}: mistral-common encodes conversations with its own control tokens and "
               "cannot be given a template or new tokens (Axolotl refuses these too): remove them")
    if cfg.eot_tokens:
        yield (f"{why} with eot_tokens {cfg.eot_tokens}: mistral-common ends every assistant turn with </s> (train_on_eos "
               "decides whether it is trained) and cannot add other end-of-turn tokens; Axolotl ignores the key with "
               "mistral-common, rlft does not: remove eot_tokens")
    for ds in list(cfg.datasets or []) + list(cfg.test_datasets or []) + list(cfg.pretraining_dataset or []):
        if isinstance(ds.type, UserDefinedType) or ds.type in ("alpaca", "input_output"):
            name = "a user-defined format" if isinstance(ds.type, UserDefinedType) else ds.type
            yield (f"dataset type {name} with {why}: mistral-common encodes chat messages (type: "
                   "chat_template) and plain text (type: completion); other formats need a chat template or text pieces "
                   "tokenised apart")


def _qat_problems(cfg: RlftConfig):
    if cfg.qat is None:
        return
    problem = combination_problem(cfg.qat.activation, cfg.qat.weight, cfg.qat.group_size)
    if problem:
        yield f"qat: {problem}"
    micro = [key for key in ("quantize_embedding", "fake_quant_after_n_steps") if getattr(cfg.qat, key)]
    if cfg.qat.weight in ("nvfp4", "mxfp4") and micro:
        yield (f"qat: {' and '.join(micro)} with {cfg.qat.weight}: torchao's {cfg.qat.weight.upper()} layers have no "
               "embedding version and no switch to train without rounding (Axolotl's switch skips them): use int4 or "
               "float8 weights, or remove it")
    if cfg.method != "sft":
        yield f"qat is built for SFT (as Axolotl's QAT examples train), not {cfg.method}: remove the qat section"
    if cfg.adapter:
        yield (f"qat with adapter: {cfg.adapter}: quantization-aware training adapts the full weights to their rounding, "
               "and a LoRA's frozen base cannot adapt: remove one")
    if cfg.deepspeed:
        yield "qat under DeepSpeed is not built: use fsdp (fsdp_version: 2), or one process"


def _streaming_problems(cfg: RlftConfig):
    for key, entries in (("datasets", cfg.datasets), ("test_datasets", cfg.test_datasets or [])):
        for index, ds in enumerate(entries):
            if ds.type == "pretrain" and (key == "test_datasets" or not cfg.streaming):
                yield (f"{key}[{index}]: type: pretrain cuts streamed text into pieces, and " +
                       ("evaluation rows are read whole: use type: completion" if key == "test_datasets" else
                        "these rows are read whole: set streaming: true, or use type: completion"))
    if not cfg.streamed:
        unused = [key for key in ("streaming_multipack_buffer_size", "pretrain_multipack_attn")
                  if getattr(cfg, key) != RlftConfig.model_fields[key].default]
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
    if cfg.method != "sft":
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


def _neftune_problems(cfg: RlftConfig):
    if cfg.neftune_noise_alpha and cfg.method not in ("sft", "reward_model"):
        yield (f"neftune_noise_alpha noises the embeddings of SFT and reward-model training (Axolotl passes it to those "
               f"trainers only), not {cfg.method}: remove it")


def _lora_init_problems(cfg: RlftConfig):
    init = cfg.peft_init_lora_weights
    if isinstance(init, bool) or init is None:
        return
    if init in REFUSED_LORA_INITS:
        yield (f"peft_init_lora_weights: {init} is not built: {REFUSED_LORA_INITS[init]}; use true, gaussian, pissa or "
               "olora (rlft converts PiSSA and OLoRA adapters to load on the original base)")
    elif not LORA_INITS.fullmatch(init):
        yield (f"peft_init_lora_weights: {init!r} is not one rlft runs: true, false, gaussian, orthogonal, mica, pissa, "
               "pissa_niter_N (N iterations of fast SVD), olora")
    elif (cfg.load_in_4bit or cfg.load_in_8bit) and init not in ("gaussian", "olora"):
        yield (f"peft_init_lora_weights: {init} with a base loaded in {4 if cfg.load_in_4bit else 8} bits: PEFT builds it from "
               "full-precision weights only; use true, gaussian or olora, or load the base in full precision")
    elif init == "mica" and (cfg.peft_use_dora or cfg.lora_target_parameters):
        yield ("peft_init_lora_weights: mica with " + ("peft_use_dora" if cfg.peft_use_dora else "lora_target_parameters") +
               ": PEFT has no MiCA version of it; use another init")
    elif rewriting(init) and cfg.lora_target_parameters:
        yield (f"peft_init_lora_weights: {init} with lora_target_parameters: PEFT 0.21 cannot build it on an MoE model's "
               "expert tensors; use another init")
    elif init == "olora" and (cfg.load_in_4bit or cfg.load_in_8bit) and cfg.trl.use_vllm:
        yield ("peft_init_lora_weights: olora with a quantized base and trl.use_vllm: the vLLM engine keeps base_model's "
               "own weights, and an OLoRA adapter fits only the base its init rewrote; use true or gaussian, or the "
               "in-process engine (trl.use_vllm: false)")
    elif init == "orthogonal" and cfg.lora_r % 2:
        yield f"peft_init_lora_weights: orthogonal needs an even lora_r (PEFT pairs the rank's halves), got {cfg.lora_r}"


def _unfrozen_problems(cfg: RlftConfig):
    if not cfg.unfrozen_parameters:
        return
    if cfg.adapter:
        yield ("unfrozen_parameters chooses the weights a full fine-tune trains, and with an adapter only the adapter "
               "trains: remove one (lora_modules_to_save trains whole modules beside LoRA)")
    ranged = [text for text in cfg.unfrozen_parameters if parse_pattern(text).rows is not None]
    if ranged and cfg.weight_decay:
        yield (f"unfrozen_parameters {ranged[0]!r} trains some rows of a parameter by zeroing the other rows' gradients, and "
               f"weight_decay {cfg.weight_decay:g} would still shrink those rows: set weight_decay: 0, or drop the range")
    if ranged and (cfg.deepspeed or cfg.fsdp or cfg.fsdp_config):
        yield (f"unfrozen_parameters {ranged[0]!r}: row ranges are built for one process and DDP, not for fsdp or "
               "deepspeed: drop the range (the whole parameter trains) or train without sharding")


def _nemo_gym_problems(cfg: RlftConfig):
    unknown = [name for name in cfg.plugins or [] if not name.startswith("axolotl.integrations.")]
    if unknown:
        yield (f"plugins: {', '.join(unknown)} is not one of Axolotl's plugins (axolotl.integrations.*); the one rlft runs is "
               f"{NEMO_GYM_PLUGIN} (NeMo Gym environments): remove the others")
    if not nemo_gym_enabled(cfg):
        if cfg.nemo_gym_datasets:
            yield (f"nemo_gym_datasets is set but NeMo Gym is off: add plugins: [{NEMO_GYM_PLUGIN}] (or nemo_gym_enabled: "
                   "true), or remove nemo_gym_datasets")
        return
    if cfg.rl not in ("grpo", "gdpo"):
        yield f"NeMo Gym environments score online-RL rollouts: set rl: grpo (or gdpo), not {cfg.rl or 'sft'}"
    if cfg.dataset_exact_deduplication:
        yield ("dataset_exact_deduplication applies to datasets:, not to NeMo Gym's task files (nemo_gym_datasets): "
               "remove it, or deduplicate the JSONL tasks")
    evaluation = [key for key in ("test_datasets", "val_set_size") if getattr(cfg, key)]
    if evaluation:
        yield (f"{' and '.join(evaluation)} with NeMo Gym: evaluation on Gym tasks is not built yet (the task files "
               "replace datasets:); remove them")
    if not cfg.nemo_gym_datasets:
        yield ("NeMo Gym is on and nemo_gym_datasets is empty: list the task files, e.g. "
               "[{path: resources_servers/reasoning_gym/data/example.jsonl, server_name: reasoning_gym}]")
    if cfg.nemo_gym_auto_start and not cfg.nemo_gym_config_paths:
        yield ("nemo_gym_auto_start is true (the default) but nemo_gym_config_paths is empty: list the Gym server configs "
               "ng_run should start, e.g. [resources_servers/reasoning_gym/configs/resources_only.yaml], or start the "
               "servers yourself and set nemo_gym_auto_start: false")
    if not cfg.nemo_gym_multi_turn:
        if cfg.nemo_gym_max_turns is not None:
            yield "nemo_gym_max_turns limits multi-turn episodes: set nemo_gym_multi_turn: true, or remove it"
        return
    if not cfg.trl.use_vllm or (cfg.trl.vllm_mode or "server") != "server":
        yield ("nemo_gym_multi_turn: true: the Gym agent calls the policy over HTTP, so it needs rlft's rollout server: set "
               "trl.use_vllm: true and trl.vllm_mode: server, and start `rlft vllm-serve <config>` (docs/environments.md)")
    verify = [name for name in cfg.trl.reward_funcs or [] if str(name).endswith("reward_nemo_gym_verify")]
    if verify:
        yield (f"trl.reward_funcs: {verify[0]} scores single answers, but with nemo_gym_multi_turn the agent's /run "
               "verifies each episode: use axolotl.integrations.nemo_gym.rewards.reward_env (the /run reward)")
    if cfg.trl.rollout_func:
        yield "trl.rollout_func and nemo_gym_multi_turn both produce the episodes: keep one of them"
    # the Gym agent asks the rollout server with temperature and top_p only: other filters would not sample, but the
    # trainer's log-probs (and so its importance-sampling ratios) would assume them
    filters = (("top_k", cfg.trl.top_k, (None, 0, -1)), ("min_p", cfg.trl.min_p, (None, 0.0)),
               ("repetition_penalty", cfg.trl.repetition_penalty, (None, 1.0)))
    unsent = [f"trl.{key}: {value}" for key, value, off in filters if value not in off]
    if unsent:
        yield (f"{', '.join(unsent)} with nemo_gym_multi_turn: the Gym agent sends the rollout server temperature and top_p "
               "only, so the episodes would not be sampled with it while the trainer's log-probs assume it: remove it")


# the preference losses' own keys and the methods whose loss reads them
METHOD_KEYS = {**dict.fromkeys(("dpo_loss_type", "dpo_loss_weights", "dpo_use_weighting", "dpo_ld_alpha", "dpo_discopop_tau"),
                               ("dpo", "ipo")),
               "dpo_label_smoothing": ("dpo", "ipo", "simpo"), **dict.fromkeys(("cpo_loss_type", "cpo_alpha", "simpo_gamma"), ("simpo",)),
               **dict.fromkeys(("orpo_alpha", "orpo_nll_span"), ("orpo",)),
               **dict.fromkeys(("kto_desirable_weight", "kto_undesirable_weight"), ("kto",))}


def _preference_problems(cfg: RlftConfig):
    if cfg.reward_model and cfg.rl:
        yield f"reward_model: true trains a reward model, rl: {cfg.rl} trains a policy: set one of them"
    if cfg.num_labels not in (None, 1) and not cfg.process_reward_model:  # `train` says a PRM is not built
        yield f"num_labels is {cfg.num_labels}: a Bradley-Terry reward model has a single score (num_labels: 1)"
    if cfg.rl == "kto" and cfg.micro_batch_size < 2:
        yield ("rl: kto needs micro_batch_size >= 2: the KL reference point is a batch mean over mismatched "
               "prompt/completion pairs, and one pair per step makes it the reward itself")
    if cfg.dpo_loss_weights is not None:
        types = cfg.dpo_loss_type or ["sigmoid"]
        if len(cfg.dpo_loss_weights) != len(types):
            yield f"dpo_loss_weights has {len(cfg.dpo_loss_weights)} entries for {len(types)} dpo_loss_type entries: give one weight per type"
    types = cfg.dpo_loss_type or []
    if "exo_pair" in types and cfg.dpo_label_smoothing == 0:
        yield "dpo_loss_type exo_pair needs dpo_label_smoothing > 0 (the EXO paper uses 1e-3): log(0) is undefined"
    if cfg.dpo_use_weighting and {"aot", "aot_unpaired"} & set(types):
        yield "dpo_use_weighting (WPO) cannot weight aot/aot_unpaired: those losses sort the batch, so rows lose their weights"
    if cfg.rl == "ipo" and cfg.dpo_loss_type not in (None, ["ipo"]):
        yield f"rl: ipo is DPO with dpo_loss_type [ipo]; remove dpo_loss_type {cfg.dpo_loss_type} or use rl: dpo"
    for key in ("precompute_ref_log_probs", "ref_model"):
        if getattr(cfg, key) and cfg.method in ("orpo", "simpo", "reward_model"):
            yield f"{key}: {cfg.method} uses no reference model; remove the key"
    if cfg.share_prompts and (problem := prompt_sharing_problem(cfg)):
        yield f"share_prompts: {problem}; remove the key (or set it to false)"
    if cfg.method in ("dpo", "ipo", "kto", "simpo") and cfg.trl.beta == 0:
        yield f"trl.beta is {cfg.method}'s beta here (it takes precedence over rl_beta, as in Axolotl) and must be > 0"
    for key, methods in METHOD_KEYS.items():  # a method's own key set for another method would do nothing
        value = getattr(cfg, key)
        if key in cfg.model_fields_set and cfg.method not in methods and value != RlftConfig.model_fields[key].default:
            yield f"{key}: {value} acts only with rl: {' or '.join(methods)}, and this config trains {cfg.method}: remove it"


def _ebft_problems(cfg: RlftConfig):
    ebft = cfg.ebft
    if "ebft" not in cfg.model_fields_set:
        yield "rl: ebft needs an `ebft:` section (at least `mode: structured` or `mode: strided`) saying how features are matched"
    group = ebft.n_samples_per_prompt if ebft.mode == "strided" else (cfg.trl.num_generations or RL_DEFAULTS["num_generations"])
    if ebft.use_whitening and group < 2:
        yield f"ebft.use_whitening needs at least 2 samples per group to estimate a second moment; the group size is {group}"
    if ebft.mode == "strided" and ebft.embed_method in ("concat", "completion_mean"):
        yield f"ebft.embed_method {ebft.embed_method!r} is for structured mode; strided mode pools a block: last_token or mean_pooling"
    if ebft.mode == "strided" and ebft.temperature <= 0:
        yield "ebft.temperature must be > 0: the REINFORCE term needs the sampling distribution's log-probs"
    rollout_keys = [f"trl.{key}" for key in ("use_vllm", "async_prefetch") if getattr(cfg.trl, key)]
    if ebft.mode == "strided" and rollout_keys:
        yield (f"{' and '.join(rollout_keys)} with ebft.mode: strided: strided EBFT generates its blocks inside each "
               "document in the trainer, not through a rollout engine; remove them (they apply to structured mode)")


def rows_per_step(cfg: RlftConfig) -> int:
    """Completions one optimizer step trains: micro_batch_size x gradient_accumulation_steps x processes."""
    return cfg.micro_batch_size * cfg.gradient_accumulation_steps * launched()[1]


def _grpo_problems(cfg: RlftConfig):
    trl = cfg.trl
    completion = trl.max_completion_length or RL_DEFAULTS["max_completion_length"]
    if "sequence_len" in cfg.model_fields_set and not cfg.skip_prepare_dataset and cfg.sequence_len <= completion:
        yield (f"sequence_len {cfg.sequence_len} leaves no room for prompts next to trl.max_completion_length {completion} "
               "(a prompt may use sequence_len - max_completion_length tokens): raise sequence_len, or remove it (prompts "
               "are then kept whatever their length, as in Axolotl)")
    if trl.aipo_rho is not None and trl.loss_type == "cispo":
        yield "trl.aipo_rho replaces the clipped ratio, cispo clips it its own way: use one of them"
    if trl.reward_weights is not None and trl.reward_funcs is not None and len(trl.reward_weights) != len(trl.reward_funcs):
        yield f"trl.reward_weights has {len(trl.reward_weights)} entries for {len(trl.reward_funcs)} trl.reward_funcs: give one weight per function"
    if trl.temperature is not None and trl.temperature <= 0:
        yield "trl.temperature must be > 0 for online RL: the log-probs of greedy decoding are not a distribution to train on"
    resets = [k for k in ("reference_reset_interval", "sync_ref_model") if getattr(trl, k)]
    if resets and cfg.adapter and not cfg.rl_adapter_ref_model:
        yield (f"trl.{resets[0]} updates a frozen reference copy, but with an adapter the reference is the policy with its "
               "adapter disabled: set rl_adapter_ref_model: true to keep a copy, or remove the key")
    groups = trl.num_generations if trl.num_generations is not None else RL_DEFAULTS["num_generations"]
    if groups is not None and groups < 2:
        yield f"trl.num_generations is {groups}: group-relative advantages need at least 2 completions per prompt"
    if trl.generation_batch_size is None and groups:
        per_step = cfg.micro_batch_size * cfg.gradient_accumulation_steps
        if per_step % groups:
            yield (
                f"micro_batch_size * gradient_accumulation_steps = {cfg.micro_batch_size} * "
                f"{cfg.gradient_accumulation_steps} = {per_step} must be divisible by trl.num_generations = {groups} "
                f"(each prompt's {groups} completions must land in the same step): change micro_batch_size "
                "or gradient_accumulation_steps, or set trl.generation_batch_size"
            )
    elif trl.generation_batch_size is not None and groups and trl.generation_batch_size % groups:
        yield f"trl.generation_batch_size = {trl.generation_batch_size} must be divisible by trl.num_generations = {groups}"
    if trl.generation_batch_size is not None:
        step_rows = rows_per_step(cfg)
        if trl.generation_batch_size % step_rows:
            yield (f"trl.generation_batch_size = {trl.generation_batch_size} is not a whole number of optimizer steps' rows "
                   f"(micro_batch_size * gradient_accumulation_steps * processes = {step_rows}): some steps would train "
                   "on fewer rows; make it a multiple of that")
        if trl.steps_per_generation is not None:
            yield ("trl.generation_batch_size and trl.steps_per_generation both size the generation batch (TRL refuses "
                   "both too): keep one of them")
    if cfg.rl == "gdpo" and trl.multi_objective_aggregation == "sum_then_normalize":
        yield "rl: gdpo normalises each reward before summing: remove trl.multi_objective_aggregation: sum_then_normalize (or use rl: grpo)"
    yield from _rollout_problems(cfg)


def _rollout_problems(cfg: RlftConfig):
    """Rollout engine, async, importance-sampling and replay keys of the `trl:` section."""
    trl = cfg.trl
    depth = trl.prefetch_depth if trl.prefetch_depth is not None else RL_DEFAULTS["prefetch_depth"]
    if trl.async_prefetch and depth < 1:
        yield (f"trl.prefetch_depth is {depth} with trl.async_prefetch: true: prefetch_depth counts the rollout batches "
               "generated ahead and must be >= 1 (1 is the usual choice), or set async_prefetch: false")
    if trl.async_prefetch and trl.allowed_outdated_steps is not None:
        # optimizer steps per generation batch: its windows of one step's rows (generation_batch_size), each reused
        # num_iterations times
        step_rows = rows_per_step(cfg)
        windows = -(-trl.generation_batch_size // step_rows) if trl.generation_batch_size else 1
        per_batch = (trl.steps_per_generation or 1) * windows * (trl.num_iterations or 1)
        oldest = depth * per_batch + (trl.vllm_sync_interval or 1) - 1
        if trl.allowed_outdated_steps < oldest:
            yield (f"trl.allowed_outdated_steps = {trl.allowed_outdated_steps} is below the age of every prefetched batch: "
                   f"prefetch_depth = {depth} batches of {per_batch} optimizer step(s) with vllm_sync_interval = "
                   f"{trl.vllm_sync_interval or 1} trains on rollouts up to {oldest} steps old, so every batch would be "
                   "dropped; raise allowed_outdated_steps or lower prefetch_depth / vllm_sync_interval")
    if trl.use_vllm and cfg.adapter == "qlora" and not trl.vllm_lora_sync:
        yield ("adapter: qlora with trl.use_vllm sends merged weights, which a 4-bit base cannot give: set "
               "trl.vllm_lora_sync: true (the server keeps base_model's own weights and loads the adapter)")
    if trl.vllm_lora_sync and cfg.adapter not in ("lora", "qlora"):
        yield ("trl.vllm_lora_sync sends the LoRA adapter: set adapter: lora, or remove vllm_lora_sync to send full "
               "weights")
    if trl.vllm_lora_sync and cfg.vllm.max_lora_rank is not None and cfg.lora_r > cfg.vllm.max_lora_rank:
        yield (f"lora_r = {cfg.lora_r} is above vllm.max_lora_rank = {cfg.vllm.max_lora_rank}: the server would refuse "
               f"the adapter sent by trl.vllm_lora_sync; raise vllm.max_lora_rank to at least {cfg.lora_r}")
    if trl.use_decoupled_loss and trl.vllm_importance_sampling_correction:
        yield ("trl.use_decoupled_loss and trl.vllm_importance_sampling_correction: true both weight the policy term by "
               "exp(old - sampling) log-probs: pick one (remove vllm_importance_sampling_correction, or "
               "use_decoupled_loss)")
    if trl.behav_imp_weight_cap is not None and not trl.use_decoupled_loss:
        yield ("trl.behav_imp_weight_cap caps the decoupled loss's behaviour weight: set trl.use_decoupled_loss: true, "
               "or remove behav_imp_weight_cap (the IS correction's cap is vllm_importance_sampling_cap)")
    if trl.streaming_min_groups is not None and not trl.streaming_partial_batch:
        yield ("trl.streaming_min_groups sizes the chunks of streaming scoring: set trl.streaming_partial_batch: true, "
               "or remove streaming_min_groups")
    filters = [f"trl.{key}" for key, off in (("top_k", (None, 0, -1)), ("top_p", (None, 1.0)), ("min_p", (None, 0.0)),
                                              ("repetition_penalty", (None, 1.0))) if getattr(trl, key) not in off]
    if trl.replay_buffer_size and not trl.replay_recompute_logps and filters:
        yield (f"trl.replay_recompute_logps: false with {', '.join(filters)}: a replayed row would keep the log-probs "
               "recorded when it was sampled, which are of the filtered distribution, while the PPO ratio compares "
               "temperature-only ones (every ratio off 1); set replay_recompute_logps: true (the default)")
    if trl.reroll_start_fraction < 1 and cfg.max_steps is None:
        yield (f"trl.reroll_start_fraction = {trl.reroll_start_fraction} is a fraction of max_steps, which is not set: "
               "set max_steps, or remove reroll_start_fraction (1.0 = no re-roll)")

