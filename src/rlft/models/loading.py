"""Load the policy model and tokenizer as the config says: source, random init, attention, adapters.

Weights are kept in float32 and `bf16`/`fp16` run as autocast mixed precision (accelerate), so
optimizer updates are never rounded to 16 bits.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch
import transformers
from huggingface_hub import snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError
from safetensors import safe_open
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, PreTrainedModel,
                          PreTrainedTokenizerBase)

from rlft.config.methods import method_spec
from rlft.config.parallel import launched
from rlft.config.settings.model import AdapterSettings, ModelSettings
from rlft.data.mistral_common import has_mistral_files, load_mistral_tokenizer
from rlft.data.tokenizer import apply_chat_template_setting
from rlft.errors import ConfigError, ModelError
from rlft.models.attention import unmaskable_layers
from rlft.models.base_changing import is_converted
from rlft.models.checkpointing import enable_checkpointing
from rlft.models.liger import apply_liger, check_liger
from rlft.models.qat import check_qat, prepare_qat

if TYPE_CHECKING:
    from peft import LoraConfig

ADAPTER_CONFIG = "adapter_config.json"


def resolve_source(name: str | None, key: str, revision: str | None = None) -> str:
    """A local folder as an absolute path, or a hub id when the hub may be used; else a clear error. `revision` (a
    branch, tag or commit of a hub repository) picks the cached snapshot offline; a local folder has none."""
    if not name:
        raise ModelError(f"`{key}` is not set: give a model folder (or a hub id when online)")
    local = Path(name).expanduser()
    if local.exists():
        if revision:
            raise ModelError(f"revision_of_model: {revision} picks a version of a hub repository, but {key} is the folder "
                             f"{local.resolve()}: remove revision_of_model, or give {key} as a hub id (ORG/NAME)")
        if not local.is_dir():
            raise ModelError(f"{key}: {local} is a file; give the model folder that contains config.json")
        if not (local / "config.json").exists() and (local / "model" / "config.json").exists():
            return str((local / "model").resolve())  # an rlft checkpoint: its model is in checkpoint-N/model
        return str(local.resolve())
    looks_like_path = name.startswith((".", "/", "~")) or name.count("/") > 1  # hub ids are `org/name`
    if looks_like_path:
        raise ModelError(f"{key}: folder {local} does not exist (relative paths are read from {Path.cwd()})")
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        try:  # downloaded before: the local Hugging Face cache holds it
            return snapshot_download(name, revision=revision, local_files_only=True)
        except (LocalEntryNotFoundError, ValueError):
            pass
        what = f"{name!r} at revision {revision!r}" if revision else repr(name)
        raise ModelError(
            f"{key}: no folder {local} (relative to {Path.cwd()}), and HF_HUB_OFFLINE=1 forbids reading {what} "
            "from the hub and it is not in the local Hugging Face cache: fix the path, or download the model first "
            f"(hf download {name}{' --revision ' + revision if revision else ''})"
        )
    return name


def model_source(settings: ModelSettings, name: str | None, key: str) -> str:
    """A key that names a model repository (base_model, base_model_config, tokenizer_config, ref_model) resolved; at
    `revision_of_model` (Axolotl's key) where it names base_model's repository, online and offline alike."""
    return resolve_source(name, key, settings.revision if name == settings.base_model else None)


def base_model_source(settings: ModelSettings) -> str:
    """`base_model` resolved at `revision_of_model`, for the model, its config and its tokenizer."""
    return model_source(settings, settings.base_model, "base_model")


def hub_revision(settings: ModelSettings, source: str) -> dict[str, str]:
    """`from_pretrained`'s revision for a source that is `base_model`'s hub id (online, `model_source` returns it as it
    is; offline, from_pretrained finds the revision's snapshot in the cache itself); a folder holds its revision."""
    return {"revision": settings.revision} if settings.revision and source == settings.base_model else {}


def adapter_base(folder: Path) -> tuple[str, dict[str, str]]:
    """The base model of a saved adapter (its adapter_config.json) resolved, and the revision to load it at."""
    saved = json.loads((folder / ADAPTER_CONFIG).read_text())
    base = saved.get("base_model_name_or_path")
    # a revision names a version of a hub repository: beside a folder (other tools write one) it says nothing
    revision = saved.get("revision") if base and not Path(base).expanduser().exists() else None
    source = resolve_source(base, "adapter base model", revision)
    return source, ({"revision": revision} if revision and source == base else {})


def model_config(settings: ModelSettings, source: str, **extra: Any):
    """The model's config from `source`, with Axolotl's `model_config` overrides set on it (before the model is built,
    so that settings read at construction, such as rope_scaling, take effect)."""
    config = AutoConfig.from_pretrained(source, trust_remote_code=settings.trust_remote_code, **hub_revision(settings, source), **extra)
    for key, value in settings.config_overrides.items():
        if not hasattr(config, key):
            close = difflib.get_close_matches(key, list(config.to_dict()), n=1)
            raise ConfigError(f"model_config.{key}: {type(config).__name__} has no setting of that name"
                              + (f" (did you mean {close[0]}?)" if close else "") + ": fix the name or remove it")
        current = getattr(config, key)
        if isinstance(value, dict) and isinstance(current, dict):  # e.g. rope_parameters: the keys not given stay
            value = {**current, **value}
        elif isinstance(value, dict) and hasattr(current, "to_dict"):  # a sub-config (text_config): its own settings
            for name, setting in value.items():
                setattr(current, name, setting)
            continue
        setattr(config, key, value)
    return config


@contextmanager
def built_with_overrides(settings: ModelSettings) -> Iterator[None]:
    """Around building a model: a value of `model_config` the model's code cannot take is named, not a traceback."""
    try:
        yield
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        if not settings.config_overrides:
            raise
        raise ConfigError(f"the model could not be built with model_config {', '.join(settings.config_overrides)} "
                          f"({type(exc).__name__}: {exc}): fix the values or remove them") from None


def check_context_length(settings: ModelSettings) -> None:
    """Refuse a sequence_len longer than the model's context (read from its config.json) before any work."""
    key = "base_model_config" if settings.base_model_config else "base_model"
    try:
        source = model_source(settings, settings.base_model_config, key) if settings.base_model_config else base_model_source(settings)
        config = model_config(settings, source)  # model_config may set the context (max_position_embeddings)
    except (OSError, ValueError, ModelError):
        return  # a model that cannot be read is reported where it loads, with its own message
    names = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
    found = next(((name, getattr(config, name)) for name in names if isinstance(getattr(config, name, None), int)), None)
    if found and settings.sequence_len > found[1]:
        raise ConfigError(f"sequence_len {settings.sequence_len} is longer than the model's context of {found[1]} tokens ({found[0]} in "
                          f"{source}/config.json): lower sequence_len to {found[1]} or less"
                          + (" (prompts get sequence_len - trl.max_completion_length)"
                             if method_spec(settings.method).reward_functions else ""))


def transformers_class(name: str, key: str):
    """A class of transformers by name (`model_type`, `tokenizer_type`)."""
    found = getattr(transformers, name, None)
    if found is None:
        raise ModelError(f"{key}: transformers {transformers.__version__} has no class {name!r}; check the spelling, or leave "
                         f"{key} unset for the Auto class")
    return found


def load_tokenizer(settings: ModelSettings) -> PreTrainedTokenizerBase:
    """The tokenizer of `tokenizer_config` or `base_model`, with special tokens and the chat template set."""
    source = model_source(settings, settings.tokenizer_config, "tokenizer_config") if settings.tokenizer_config else base_model_source(settings)
    if settings.mistral_common:  # its own conversation encoding: no template, no added tokens (refused by validate)
        return load_mistral_tokenizer(source, **hub_revision(settings, source))
    try:
        tokenizer = transformers_class(settings.tokenizer_type, "tokenizer_type").from_pretrained(
            source, trust_remote_code=settings.trust_remote_code, **hub_revision(settings, source))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load a tokenizer from {source}: {exc}") from None
    if settings.special_tokens:
        tokenizer.add_special_tokens(dict(settings.special_tokens))
    if settings.tokens:
        tokenizer.add_tokens(list(settings.tokens))
    if settings.eot_tokens:  # end-of-turn markers are single special tokens, never trained in pieces
        missing = [token for token in settings.eot_tokens if token not in tokenizer.get_vocab()]
        if missing:
            tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelError(f"the tokenizer of {source} has neither a pad nor an eos token: set special_tokens.pad_token")
        tokenizer.pad_token = tokenizer.eos_token
    apply_chat_template_setting(tokenizer, settings.chat_template, settings.chat_template_jinja)
    return tokenizer


def check_attention(implementation: str, training: bool, device_type: str) -> None:
    """Refuse attention choices that cannot run here, saying why and what to use instead."""
    if implementation.startswith("flash_attention"):
        package = "flash_attn_interface" if implementation == "flash_attention_3" else "flash_attn"
        if device_type != "cuda":
            raise ModelError(f"{implementation} needs a CUDA GPU; on {device_type} use sdp_attention (the default)")
        if importlib.util.find_spec(package) is None:
            raise ModelError(f"{implementation} needs the `{package}` package: pip install flash-attn, or use sdp_attention")
    if implementation == "flex_attention" and training and device_type == "cpu":
        raise ModelError(
            "flex_attention cannot train on CPU (PyTorch has no flex_attention backward on CPU): "
            "set flex_attention: false (sdpa is used) or train on a GPU"
        )


def fit_embeddings(model: PreTrainedModel, settings: ModelSettings, tokenizer: PreTrainedTokenizerBase) -> None:
    """Grow the embedding rows to the tokenizer's length, as Axolotl does: rounded up to a multiple of 32 with
    `resize_token_embeddings_to_32x`, cut down to it only with `shrink_embeddings` (spare rows are kept otherwise).
    New rows are initialised as the model's own weights are (seeded), or from the old rows' mean and covariance
    with `mean_resizing_embeddings` (transformers' mean resizing; Axolotl's default is off)."""
    rows = model.get_input_embeddings().num_embeddings
    target = -(-len(tokenizer) // 32) * 32 if settings.embeddings_to_32x else len(tokenizer)
    if rows < target or (rows > target and settings.shrink_embeddings):
        with torch.random.fork_rng():
            torch.manual_seed(settings.seed)  # the same new rows on every process and every run
            model.resize_token_embeddings(target, mean_resizing=settings.mean_resizing_embeddings)


def load_model(settings: ModelSettings, tokenizer: PreTrainedTokenizerBase, device_type: str, init_base_dir: Path | None = None,
               with_adapter: bool = True, serving: bool = False) -> PreTrainedModel:
    """Build the trainable model: base weights (or a seeded random init), attention, checkpointing, adapter.

    With `random_init` and an adapter the frozen random base must be the same on resume and at
    inference, so it is written once to `init_base_dir` and loaded from there afterwards. `serving`: for the rollout
    server, which trains nothing (the router-loss check is the trainer's).
    """
    attention = settings.attention
    check_attention(attention, training=True, device_type=device_type)
    check_liger(settings, device_type)
    if settings.qat and not serving:
        check_qat(settings, device_type)
    if (settings.load_in_4bit or settings.load_in_8bit) and (device_type != "cuda" or importlib.util.find_spec("bitsandbytes") is None):
        raise ModelError("load_in_4bit/load_in_8bit (QLoRA) need a CUDA GPU and the bitsandbytes package; use adapter: lora here")
    source = base_model_source(settings)
    kwargs: dict[str, Any] = {"attn_implementation": attention, "trust_remote_code": settings.trust_remote_code, "dtype": torch.float32}
    causal = settings.model_type and settings.model_type.endswith("ForCausalLM")  # anything else is refused before loading
    model_class = transformers_class(settings.model_type, "model_type") if causal else AutoModelForCausalLM
    if init_base_dir is not None and (init_base_dir / "config.json").exists():
        model = model_class.from_pretrained(init_base_dir, **kwargs)
    elif settings.random_init:
        config_source = model_source(settings, settings.base_model_config, "base_model_config") if settings.base_model_config else source
        config = model_config(settings, config_source)
        with torch.random.fork_rng(), built_with_overrides(settings):
            torch.manual_seed(settings.seed)
            if model_class is AutoModelForCausalLM:
                model = model_class.from_config(config, **kwargs)
            else:  # a concrete class: its code is in transformers, so no remote code to allow
                model = model_class._from_config(config, **{k: v for k, v in kwargs.items() if k != "trust_remote_code"})
        if init_base_dir is not None and settings.adapter.kind and launched()[0] == 0:
            # written whole, then renamed: other processes build the same seeded weights until the folder is there
            staging = init_base_dir.with_name(f".tmp-{init_base_dir.name}-{os.getpid()}")
            model.save_pretrained(staging)
            staging.rename(init_base_dir)
    else:
        kwargs.update(_quantization_kwargs(settings), **hub_revision(settings, source))
        if settings.config_overrides:
            kwargs["config"] = model_config(settings, source)
        try:
            with built_with_overrides(settings):
                model = model_class.from_pretrained(source, **kwargs)
        except OSError as exc:
            raise ModelError(
                f"cannot load weights from {source}: {exc}. If the folder holds only config.json, set random_init: true"
            ) from None
    fit_embeddings(model, settings, tokenizer)
    check_own_masks(settings, model)
    if not serving:
        check_router_loss(settings, model, device_type)
    apply_liger(model, settings)
    if settings.qat and not serving:  # torchao's fake-quantized layers; the weights keep their names (rlft.models.qat)
        prepare_qat(model, settings.qat)
    if settings.checkpointing:
        enable_checkpointing(model, settings, device_type)
        model.config.use_cache = False
    if settings.adapter.kind and with_adapter:
        model = attach_adapter(model, settings)
    return model


def check_own_masks(settings: ModelSettings, model) -> None:
    """Packed, flattened and strided batches run through masks that rlft builds (rlft.models.masks.per_layer_type):
    a model with attention layers other than full and sliding-window ones cannot take them (ModelError)."""
    flash = settings.attention.startswith("flash_attention")
    strided = method_spec(settings.method, settings.ebft_mode).strided_blocks
    if (strided or (not flash and (settings.sample_packing or settings.flat_batches))) and (kinds := unmaskable_layers(model)):
        raise ModelError(f"model type {model.config.model_type} has {', '.join(kinds)} layers: rlft builds the attention "
                         "masks of packed, flattened and strided batches itself and knows only full and sliding-window "
                         "layers; train this model on padded rows (sample_packing, batch_flattening and "
                         "dpo_padding_free off)")


def check_router_loss(settings: ModelSettings, model, device_type: str) -> None:
    """A mixture-of-experts model whose config.json sets output_router_logits computes its router's load-balancing loss
    in every forward: the methods that add it are SFT, the preference methods and the GRPO family, on rows with a mask
    each (`model_config` setting it is checked with the config: `rlft.config.rules`). On a GPU under SDPA, the GRPO
    family's rows, which start with their prompts' left padding, get a (B, 1, T, T) mask of rlft's own
    (`rlft.models.masks.safe_attention`), which transformers' router loss cannot read: refused there, whether
    model_config or config.json sets it."""
    if not getattr(model.config, "output_router_logits", False):
        return
    spec = method_spec(settings.method)
    if spec.engine and spec.router_loss and device_type == "cuda" and settings.attention == "sdpa":
        raise ConfigError("output_router_logits with SDPA attention on a GPU: GRPO's rows start with their prompts' left "
                          "padding, for which rlft gives SDPA a 4-D mask of its own that transformers' router loss cannot "
                          "read; set attn_implementation: flash_attention_2 (or eager), or model_config: "
                          "{output_router_logits: false} to train without the router's loss")
    if "output_router_logits" in settings.config_overrides:
        return
    fix = "or set model_config: {output_router_logits: false} to train without the router's loss"
    if not method_spec(settings.method).router_loss:
        raise ConfigError(f"base_model's config sets output_router_logits: true (a mixture-of-experts router's load-balancing "
                          f"loss), which rlft adds to SFT, the preference methods and the GRPO family, not to {settings.method}: "
                          f"{fix}")
    packed = settings.sample_packing or settings.eval_sample_packing or settings.flat_batches
    if not settings.attention.startswith("flash_attention") and packed:
        raise ConfigError("base_model's config sets output_router_logits: true, and transformers' router loss needs a mask per "
                          "row, which packed or flattened rows have only under flash-attention: turn sample_packing / "
                          "eval_sample_packing / "
                          f"batch_flattening / dpo_padding_free off, {fix}")


def disable_dropout(model: torch.nn.Module) -> None:
    """Dropout off everywhere (TRL's default for preference training): policy and reference agree."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def _quantization_kwargs(settings: ModelSettings) -> dict[str, Any]:
    if not (settings.load_in_4bit or settings.load_in_8bit):
        return {}
    if settings.load_in_8bit:
        return {"quantization_config": BitsAndBytesConfig(load_in_8bit=True)}
    return {
        "quantization_config": BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16
        )
    }


def lora_config(adapter: AdapterSettings, task_type: str = "CAUSAL_LM") -> LoraConfig:
    from peft import LoraConfig  # peft loads where an adapter is built or loaded

    if adapter.target_linear:
        targets: Any = "all-linear"
    else:  # parameters alone: no modules (PEFT would otherwise pick its default modules for the model type)
        targets = adapter.target_modules if adapter.target_modules or not adapter.target_parameters else []
    init = True if adapter.init_lora_weights is None else adapter.init_lora_weights
    return LoraConfig(
        r=adapter.r,
        lora_alpha=adapter.alpha,
        lora_dropout=adapter.dropout,
        target_modules=targets,
        target_parameters=[adapter.target_parameters] if isinstance(adapter.target_parameters, str) else adapter.target_parameters,
        modules_to_save=adapter.modules_to_save,
        fan_in_fan_out=adapter.fan_in_fan_out,
        use_rslora=adapter.use_rslora,
        use_dora=adapter.use_dora,
        init_lora_weights=init,
        task_type=task_type,
    )


def attach_adapter(model: PreTrainedModel, settings: ModelSettings, task_type: str = "CAUSAL_LM") -> Any:
    """Wrap the model with a new LoRA adapter, or the trainable adapter of `lora_model_dir`."""
    from peft import PeftModel, get_peft_model, prepare_model_for_kbit_training  # adapters only

    if settings.load_in_4bit or settings.load_in_8bit:  # checkpointing is on already (enable_checkpointing), as configured
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if settings.checkpointing:
        model.enable_input_require_grads()
    if settings.adapter.model_dir:
        folder = Path(settings.adapter.model_dir).expanduser()
        if not (folder / ADAPTER_CONFIG).exists():
            raise ModelError(f"lora_model_dir: {folder} has no {ADAPTER_CONFIG}")
        if not is_converted(folder):
            raise ModelError(f"lora_model_dir: {folder} holds a PiSSA or OLoRA adapter as trained, which fits only the base "
                             "its init rewrote (PEFT would run the init again on load): use a converted one, such as an "
                             "rlft checkpoint's model/ folder or final output")
        return PeftModel.from_pretrained(model, str(folder), is_trainable=True)
    try:
        return get_peft_model(model, lora_config(settings.adapter, task_type))
    except ValueError as exc:
        raise ModelError(
            f"cannot attach LoRA: {exc}. Set lora_target_modules (e.g. [q_proj, v_proj]), lora_target_linear: true or "
            "lora_target_parameters (e.g. [experts.gate_up_proj])"
        ) from None


def _saved_embedding_rows(base: PreTrainedModel, folder: Path) -> int | None:
    """The input embedding's row count in an adapter folder that saved the embeddings (PEFT does when the run resized
    them), else None."""
    file = folder / "adapter_model.safetensors"
    name = next((n for n, m in base.named_modules() if m is base.get_input_embeddings()), None)
    if not file.exists() or name is None:
        return None
    with safe_open(str(file), "pt") as handle:
        key = next((k for k in handle.keys() if k.endswith(f"{name}.weight")), None)
        return handle.get_slice(key).get_shape()[0] if key else None


def load_for_inference(path: str, device: str = "cpu") -> tuple[Any, PreTrainedTokenizerBase]:
    """Load a model folder or an rlft checkpoint; a LoRA checkpoint is loaded on its base model."""
    folder = Path(path).expanduser()
    if (folder / "model").is_dir():  # an rlft checkpoint: weights live in checkpoint/model
        folder = folder / "model"
    source = resolve_source(str(folder) if folder.exists() else path, "model")
    adapter_file = Path(source) / ADAPTER_CONFIG
    if adapter_file.exists():
        base_source, revision = adapter_base(Path(source))
        base = AutoModelForCausalLM.from_pretrained(base_source, **revision)
        rows = _saved_embedding_rows(base, Path(source))
        if rows and rows != base.get_input_embeddings().num_embeddings:  # the run resized them (tokens:, 32x, shrink)
            base.resize_token_embeddings(rows, mean_resizing=False)  # the adapter holds the trained rows
        from peft import PeftModel  # adapters only

        model = PeftModel.from_pretrained(base, source)
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(source)
        except OSError as exc:
            raise ModelError(f"cannot load a model from {source}: {exc}") from None
    if has_mistral_files(source):  # a tokenizer_use_mistral_common run's output: its tekken.json / tokenizer.model.v*
        return model.to(device).eval(), load_mistral_tokenizer(source, mode="test")
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer
