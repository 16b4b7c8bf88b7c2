"""The transformers backend: rlft's batched KV-cache decoder (`LocalEngine`) behind the server, on any device.

One engine thread owns the model. It takes every generation request waiting, decodes those with the
same sampling settings together in one batch (a request with a seed alone, right after seeding, so
it reproduces `LocalEngine.generate` exactly), and applies weight and adapter updates between batches.
Log-probs come from the distribution actually sampled (`process_logits`), as in training.
"""

from __future__ import annotations

import torch

from rlft.config.settings.rollout import ServerSettings
from rlft.errors import ConfigError
from rlft.models.loading import load_model, load_tokenizer
from rlft.models.weights import architecture_digest, plain_state_dict, weights_checksum
from rlft.models.compile import compile_options
from rlft.rollout.local import LocalEngine
from rlft.rollout.server.collective import LocalGroupMember
from rlft.rollout.server.engine_thread import EngineThread, ThreadedBackend
from rlft.rollout.server.protocol import DTYPES, AdapterFiles, Generated, GenerationRequest, ServerError


def served_dtype(setting: str | None, model_dtype: torch.dtype | None, device_type: str) -> torch.dtype:
    """`vllm.dtype` resolved: auto -> float32 on CPU, else the model's own dtype (float32 when it names none)."""
    if setting in (None, "auto"):
        if device_type == "cpu" or model_dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return torch.float32
        return model_dtype
    if setting not in DTYPES:
        raise ConfigError(f"vllm.dtype: {setting!r} is not a dtype the server knows: use auto, bfloat16, float16 or float32")
    return DTYPES[setting]


class TransformersBackend(LocalGroupMember, ThreadedBackend):
    name = "transformers"

    def __init__(self, model, tokenizer, *, model_name: str, dtype: torch.dtype, max_model_len: int, max_lora_rank: int,
                 compiled: tuple[str | None, str] | None = None):
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.dtype = self.lora_dtype = dtype
        self.max_model_len = max_model_len
        self.max_lora_rank = max_lora_rank
        self.weight_version = 0
        self.weight_checksum: str | None = None
        self.base_updated = False  # True once full weights were loaded: the base is no longer base_model's own
        self.lora: dict[str, int] | None = None
        self._lora_config: dict | None = None
        self._engine = LocalEngine(model.to(dtype).requires_grad_(False), tokenizer.pad_token_id, tokenizer, compiled=compiled)
        plain = plain_state_dict(model)
        self.architecture = architecture_digest(plain)
        self._shapes = {name: (tuple(t.shape), t.dtype) for name, t in plain.items()}
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self._thread = EngineThread(self._run_batch)

    @property
    def compiled(self) -> bool:
        """Whether the decode step runs compiled (torch_compile: a static KV cache; CUDA graphs on a GPU)."""
        return bool(self._engine.compiled)

    @classmethod
    def from_config(cls, server: ServerSettings) -> "TransformersBackend":
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
        tokenizer = load_tokenizer(server.model)
        model = load_model(server.model, tokenizer, device_type, with_adapter=False, serving=True)
        dtype = served_dtype(server.vllm.dtype, getattr(model.config, "dtype", None), device_type)
        positions = getattr(model.config, "max_position_embeddings", None)
        max_model_len = server.vllm.max_model_len or positions
        if max_model_len is None:
            raise ConfigError("vllm.max_model_len: the model's config names no max_position_embeddings: set vllm.max_model_len")
        if positions is not None and max_model_len > positions:
            raise ConfigError(f"vllm.max_model_len={max_model_len} is above the model's max_position_embeddings={positions}: lower it")
        return cls(model.to(device_type), tokenizer, model_name=str(server.model.base_model), dtype=dtype,
                   max_model_len=max_model_len, max_lora_rank=server.max_lora_rank, compiled=compile_options(server.model))

    async def reset_prefix_cache(self) -> None:
        return None  # each batch builds its own KV cache: nothing is kept between batches

    # ---------------------------------------------------------------- on the engine thread

    def _run_batch(self, requests: list[GenerationRequest]) -> list[Generated | BaseException]:
        results: list[Generated | BaseException | None] = [None] * len(requests)
        groups: dict[object, list[int]] = {}
        for index, request in enumerate(requests):
            key = ("seed", index) if request.seed is not None else request.params  # seeded requests decode alone
            groups.setdefault(key, []).append(index)
        for members in groups.values():
            try:
                for index, generated in zip(members, self._decode_group([requests[i] for i in members])):
                    results[index] = generated
            except Exception as exc:  # noqa: BLE001 - only this group's requests fail
                for index in members:
                    results[index] = ServerError(500, f"generation failed: {type(exc).__name__}: {exc}")
        return results  # type: ignore[return-value]

    def _decode_group(self, requests: list[GenerationRequest]) -> list[Generated]:
        expanded = [ids for request in requests for ids in request.prompt_ids for _ in range(request.n)]
        seed = requests[0].seed
        if seed is not None:
            torch.manual_seed(seed)
        top = max(request.top_logprobs for request in requests)
        decoded = self._engine.decode(expanded, requests[0].params, top_logprobs=top)
        if seed is not None:
            torch.seed()  # later unseeded requests must not replay this stream
        out, start = [], 0
        for request in requests:
            end = start + len(request.prompt_ids) * request.n
            tops = None
            if request.top_logprobs and decoded.top_logprobs is not None:
                tops = [[step[: request.top_logprobs] for step in row] for row in decoded.top_logprobs[start:end]]
            out.append(Generated(decoded.completion_ids[start:end], decoded.logprobs[start:end], decoded.truncated[start:end],
                                 tops, self.weight_version, self.weight_checksum))
            start = end
        return out

    def _before_full_update(self) -> None:
        if self._lora_config is not None:  # full weights are what is served now: an earlier adapter must not stay on top
            self._unwrap()
        self._plain = plain_state_dict(self._engine.model)  # once per update, not per bucket

    @torch.no_grad()
    def _write_weights(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        state = self._plain  # shares storage with the module: copy_ writes the weights
        for name, tensor in tensors.items():
            if tensor.data_ptr() != state[name].data_ptr():  # a collective may have received it in place
                state[name].copy_(tensor)
        return {name: state[name] for name in tensors}  # read back from the module

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        """The served base model's weights under plain names, sharing storage (a collective receives into them)."""
        return plain_state_dict(self._engine.model)

    @torch.no_grad()
    def _load_adapter(self, adapter: AdapterFiles, version: int) -> str:
        previous = None  # the adapter served now, to serve again unchanged if this one is refused half-way
        if self._lora_config is not None:
            served = _peft().get_peft_model_state_dict(self._engine.model)
            previous = (self._lora_config, {k: v.clone() for k, v in served.items()}, self.lora)
            if _adapter_shape(adapter.config) != _adapter_shape(self._lora_config):
                self._unwrap()
        try:
            if self._lora_config is None:
                self._wrap(adapter.config)
            readback = self._set_adapter_tensors(adapter)
        except Exception as exc:  # a wrap PEFT refuses (target modules the model lacks) too: serve what was served
            if self._lora_config is not None:
                self._unwrap()
            if previous is not None:
                self._wrap(previous[0])
                _set_state(self._engine.model, previous[1])
                self.lora = previous[2]
            if isinstance(exc, ServerError):
                raise
            raise ServerError(400, f"{adapter.folder}: the adapter cannot be applied to the served model "
                                   f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
        checksum = weights_checksum(readback)
        self.weight_version, self.weight_checksum = version, checksum
        self.lora = {"rank": adapter.rank, "version": version}
        return checksum

    def _wrap(self, config: dict) -> None:
        known = {k: v for k, v in config.items() if k in _peft().LoraConfig.__dataclass_fields__}
        known.update(inference_mode=True, init_lora_weights=True)  # the tensors come next: no PiSSA/OLoRA init on this base
        model = _peft().get_peft_model(self._engine.model, _peft().LoraConfig(**known), autocast_adapter_dtype=False)
        model.to(self.dtype).requires_grad_(False).eval()
        self._engine = LocalEngine(model, self._engine.pad_id, self.tokenizer, self._engine.max_batch, self.weight_version,
                                   compiled=self._engine.compiled)
        self._lora_config = config

    def _unwrap(self) -> None:
        base = self._engine.model.unload()  # removes the LoRA layers; base weights untouched
        self._engine = LocalEngine(base, self._engine.pad_id, self.tokenizer, self._engine.max_batch, self.weight_version,
                                   compiled=self._engine.compiled)
        self._lora_config, self.lora = None, None

    def _set_adapter_tensors(self, adapter: AdapterFiles) -> dict[str, torch.Tensor]:
        model = self._engine.model
        expected = _peft().get_peft_model_state_dict(model)
        missing = sorted(set(expected) - set(adapter.tensors))
        unknown = sorted(set(adapter.tensors) - set(expected))
        if missing or unknown:
            name = (unknown or missing)[0]
            what = "is not a tensor of this adapter on the served model" if unknown else "is missing from the adapter file"
            raise ServerError(400, f"{adapter.folder}: {name!r} {what}: the adapter was saved from another model or config")
        for name, tensor in adapter.tensors.items():
            if tuple(tensor.shape) != tuple(expected[name].shape):
                raise ServerError(400, f"{adapter.folder}: {name!r} has shape {tuple(tensor.shape)}, the served adapter's "
                                       f"is {tuple(expected[name].shape)}")
        cast = {name: tensor.to(self.lora_dtype) for name, tensor in adapter.tensors.items()}
        _set_state(model, cast)
        readback = {name: tensor for name, tensor in _peft().get_peft_model_state_dict(model).items() if name in cast}
        bad = next((name for name in cast if not torch.equal(readback[name].cpu(), cast[name])), None)
        if bad is not None:
            raise ServerError(500, f"adapter tensor {bad!r} reads back different from the file after loading")
        return readback


def _set_state(model, tensors: dict[str, torch.Tensor]) -> None:
    _peft().set_peft_model_state_dict(model, tensors)


def _adapter_shape(config: dict) -> tuple:
    """What decides the adapter's modules and sizes: a change needs a new wrap, the rest only new tensors."""
    keys = ("r", "lora_alpha", "target_modules", "rank_pattern", "alpha_pattern", "use_rslora", "use_dora",
            "modules_to_save", "layers_to_transform", "bias", "fan_in_fan_out", "exclude_modules")
    return tuple(repr(config.get(key)) for key in keys)


def _peft():
    import peft  # a second or more to import: a server loads it when it serves an adapter

    return peft
