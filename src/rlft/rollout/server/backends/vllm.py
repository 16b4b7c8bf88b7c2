"""The vLLM backend: `vllm.LLM` in this process, driven from the server's engine thread.

Generation goes from token ids (`TokensPrompt`) with `logprobs=0` (the sampled token's log-prob) and
`logprobs_mode="processed_logprobs"`, so log-probs come from the distribution after temperature,
min-p, top-k/top-p and repetition penalty (rlft uses vLLM's order everywhere), as the trainer computes them. `ignore_eos` is set and the
stop ids are passed explicitly, so `/generate` stops exactly where the transformers backend does.
Every waiting request goes into one `LLM.generate` call (vLLM batches them itself).

Full weights reach the model through vLLM's in-place reload inside each worker, by methods of rlft's worker
extension (`vllm_worker.py`) called through `LLM.collective_rpc`: from a safetensors file in shared memory (HTTP
buckets, shared paths), or received as broadcasts of the weight group (`trl.vllm_group_port`: each worker is a rank,
the buckets go to the reload as they arrive). The prefix cache is then reset so no KV computed with the old weights
is reused. vLLM stacks and renames weights (qkv_proj, gate_up_proj), so they cannot be read back under the
trainer's names: the checksum returned is that of the verified tensors handed to the reload. LoRA adapters load
through a `LoRARequest` with a new int id per version (vLLM keeps `max_loras` of them, least recently used out).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

from rlft.config.settings.rollout import ServerSettings
from rlft.errors import ConfigError
from rlft.models.loading import base_model_source, hub_revision, load_tokenizer
from rlft.models.weights import architecture_digest, weights_checksum
from rlft.rollout.server.engine_thread import EngineThread, ThreadedBackend
from rlft.rollout.server.protocol import DTYPES, AdapterFiles, Generated, GenerationRequest, ServerError
from rlft.rollout.types import prompt_seed


class VLLMBackend(ThreadedBackend):
    name = "vllm"

    def __init__(self, llm, tokenizer, *, model_name: str, architecture: str, shapes, lora_dtype: torch.dtype,
                 max_lora_rank: int, enable_lora: bool, tied: list[list[str]] | None = None, workers: int = 1):
        config = llm.llm_engine.model_config
        self._llm = llm
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.dtype = config.dtype
        self.lora_dtype = lora_dtype
        self.max_model_len = config.max_model_len
        self.max_lora_rank = max_lora_rank
        self.architecture = architecture
        self.vocab_size = config.get_vocab_size()
        self.weight_version = 0
        self.weight_checksum: str | None = None
        self.base_updated = False  # True once full weights were loaded: the base is no longer base_model's own
        self.lora: dict[str, int] | None = None
        self._shapes = {name: (shape, self.dtype) for name, shape in shapes.items()}
        self._tied = tied or []  # plain names of one tensor (lm_head.weight and model.embed_tokens.weight when tied)
        self._enable_lora = enable_lora
        self._lora_request = None
        self._lora_ids = 0
        self.group_ranks = workers  # each engine worker is a rank of a weight group
        self.joins_on_engine = True  # through collective_rpc, which only the engine thread calls
        self._thread = EngineThread(self._run_batch, name="rlft-vllm")

    @classmethod
    def from_config(cls, server: ServerSettings) -> "VLLMBackend":
        from vllm import LLM  # optional (rlft[vllm]) and heavy: imported only when this backend starts

        settings, model = server.vllm, server.model
        if model.random_init:
            raise ConfigError("random_init: the vllm backend loads weights from base_model and cannot start from a random "
                              "init: save the initial weights to a folder, or use --backend transformers")
        if (settings.data_parallel_size or 1) > 1:
            raise ConfigError("vllm.data_parallel_size > 1: start one server per replica (each with its own --port)")
        source = base_model_source(model)
        tokenizer = load_tokenizer(model)
        hf_config = AutoConfig.from_pretrained(source, trust_remote_code=model.trust_remote_code, **hub_revision(model, source))
        with torch.device("meta"):  # names and shapes only, no memory
            skeleton = AutoModelForCausalLM.from_config(hf_config, trust_remote_code=model.trust_remote_code)
        state = skeleton.state_dict()
        enable_lora = server.lora_sync
        max_lora_rank = server.max_lora_rank
        lora_dtype_name = settings.lora_dtype or "auto"
        if lora_dtype_name not in ("auto", "float16", "bfloat16"):
            if lora_dtype_name != (settings.dtype or "auto"):
                raise ConfigError(f"vllm.lora_dtype: {lora_dtype_name!r}: vLLM runs adapters in auto (the served dtype), "
                                  "float16 or bfloat16")
            lora_dtype_name = "auto"  # the served dtype, which is what was asked
        extension = worker_extension(settings.worker_extension_cls)
        on_cpu = not torch.cuda.is_available()
        if on_cpu:  # the CPU build: the engine in this process (no spawned worker), a KV cache of 1 GiB unless told
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        kwargs = dict(
            model=source, tokenizer=source, **hub_revision(model, source), dtype=settings.dtype or "auto", seed=model.seed,
            tensor_parallel_size=settings.tensor_parallel_size or 1,
            gpu_memory_utilization=settings.gpu_memory_utilization or 0.9,
            max_model_len=settings.max_model_len,
            # on a CPU, compiling costs ~30 s of start-up for tiny models: eager unless the config says otherwise
            enforce_eager=bool(settings.enforce_eager) if settings.enforce_eager is not None else on_cpu,
            kv_cache_dtype=settings.kv_cache_dtype or "auto", trust_remote_code=model.trust_remote_code,
            logprobs_mode="processed_logprobs", max_logprobs=20, worker_extension_cls=extension,
        )
        if settings.enable_prefix_caching is not None:
            kwargs["enable_prefix_caching"] = settings.enable_prefix_caching
        if enable_lora:
            kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=settings.max_loras, lora_dtype=lora_dtype_name)
        try:
            llm = LLM(**kwargs)
        except Exception as exc:  # noqa: BLE001 - vLLM's own reason, without its traceback
            reason = str(exc).strip().splitlines()
            raise ConfigError(f"vLLM could not start with the vllm: settings of this config ({type(exc).__name__}: "
                              f"{' '.join(reason[:4])[:600]}): fix the setting it names, or use --backend transformers") from None
        model_dtype = llm.llm_engine.model_config.dtype
        lora_dtype = DTYPES.get(lora_dtype_name, model_dtype)
        return cls(llm, tokenizer, model_name=str(model.base_model), architecture=architecture_digest(state),
                   workers=settings.tensor_parallel_size or 1,
                   shapes={name: tuple(t.shape) for name, t in state.items()}, lora_dtype=lora_dtype, tied=_tied_names(skeleton),
                   max_lora_rank=max_lora_rank, enable_lora=enable_lora)

    def dead(self) -> str | None:
        """Also when vLLM's engine core has stopped: its client sets `engine_dead` (vLLM 0.3x) when the engine-core
        process exits (a process of its own unless VLLM_ENABLE_V1_MULTIPROCESSING=0) or reports a fatal error, and every
        later call would fail, or wait for ever."""
        core = getattr(self._llm.llm_engine, "engine_core", None)
        if getattr(getattr(core, "resources", None), "engine_dead", False):
            return "vLLM's engine core has stopped (its process exited or hit a fatal error: the server's log says why)"
        return super().dead()

    async def load_adapter(self, adapter: AdapterFiles, version: int) -> str:
        if not self._enable_lora:
            raise ServerError(400, "this server was started without LoRA support: set trl.vllm_lora_sync: true in the "
                                   "config it was started with, and restart it")
        return await super().load_adapter(adapter, version)

    async def reset_prefix_cache(self) -> None:
        await self._while_alive(lambda: self._thread.call(self._llm.reset_prefix_cache))

    # ---------------------------------------------------------------- on the engine thread

    def _run_batch(self, requests: list[GenerationRequest]) -> list[Generated | BaseException]:
        from vllm import SamplingParams  # optional, as in from_config
        from vllm.inputs import TokensPrompt

        prompts, sampling = [], []
        for request in requests:
            p = request.params
            for index, ids in enumerate(request.prompt_ids):
                seed = prompt_seed(request.seed, index, request.n)  # one per prompt, spaced by n
                prompts.append(TokensPrompt(prompt_token_ids=ids))
                sampling.append(SamplingParams(
                    n=request.n, max_tokens=p.max_new_tokens, temperature=p.temperature, top_p=p.top_p,
                    top_k=p.top_k if p.top_k > 0 else -1, min_p=p.min_p, repetition_penalty=p.repetition_penalty,
                    stop_token_ids=list(p.stop_token_ids), stop=list(p.stop_strings) or None, ignore_eos=True,
                    seed=seed, logprobs=request.top_logprobs, detokenize=bool(p.stop_strings),
                ))
        try:
            outputs = self._llm.generate(prompts, sampling_params=sampling, use_tqdm=False, lora_request=self._lora_request)
        except Exception:
            self._abort_unfinished()  # else the next call's outputs would include them, and be matched by position
            raise
        if len(outputs) != len(prompts):
            self._abort_unfinished()
            raise ServerError(500, f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts: nothing was kept")
        results: list[Generated | BaseException] = []
        position = 0
        for request in requests:
            mine = outputs[position : position + len(request.prompt_ids)]
            position += len(request.prompt_ids)
            completions = [c for output in mine for c in sorted(output.outputs, key=lambda c: c.index)]
            ids = [list(c.token_ids) for c in completions]
            logprobs = [[step[token].logprob for step, token in zip(c.logprobs, c.token_ids)] for c in completions]
            tops = None
            if request.top_logprobs:
                tops = [[_top(step, request.top_logprobs) for step in c.logprobs] for c in completions]
            results.append(Generated(ids, logprobs, [c.finish_reason == "length" for c in completions], tops,
                                     self.weight_version, self.weight_checksum))
        return results

    def _abort_unfinished(self) -> None:
        """Drop the requests a failed `generate` left in vLLM (its engine keeps them when a step raises part-way)."""
        engine = self._llm.llm_engine
        left = list(getattr(getattr(engine, "output_processor", None), "request_states", {}))
        if left:
            try:
                engine.abort_request(left)
            except Exception:  # noqa: BLE001 - a dead engine cannot abort; dead() reports it
                pass

    def _write_weights(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """vLLM stacks and renames what it loads: the tensors handed to it, verified before, are what is checksummed."""
        given = tensors
        self._written.update(tensors)
        for names in self._tied:  # vLLM's reload keeps the old weights of a layer it gets nothing for: every name once
            source = next((name for name in names if name in given), None)
            if source is not None:
                aliases = [name for name in names if name not in self._written]
                tensors = {**tensors, **{name: given[source] for name in aliases}}
                self._written.update(aliases)
        folder = "/dev/shm" if Path("/dev/shm").is_dir() else None  # shared memory: the workers read it without disk I/O
        with tempfile.TemporaryDirectory(dir=folder, prefix="rlft-weights-") as scratch:
            path = str(Path(scratch) / "part.safetensors")
            save_file(_unshared(tensors), path)
            self._llm.collective_rpc("rlft_reload_from_file", args=(path,))
        return given

    # ---------------------------------------------------------------- the weight group, on the engine thread

    def group_device(self) -> torch.device:
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")

    def join_group(self, store, port: int, *, prefix: str, world_size: int, backend: str, timeout: float,
                   address: str) -> None:
        """Every worker joins (they reach the store, which this process keeps, on this machine's loopback)."""
        self._llm.collective_rpc("rlft_join_group", args=("127.0.0.1", port, prefix, world_size, backend, timeout, address))

    def leave_group(self) -> None:
        self._llm.collective_rpc("rlft_leave_group")

    def receive_weights(self, plan, version: int) -> str:
        self.begin_now(version)
        try:
            checksums = self._llm.collective_rpc(
                "rlft_receive_weights", args=([[spec.to_json() for spec in bucket] for bucket in plan], self._tied))
        except BaseException:
            self.abandon_now()
            raise
        self.end_now(version, checksums[0])
        return checksums[0]

    def _before_full_update(self) -> None:
        self._written: set[str] = set()  # names loaded in this update (a tied name comes once, sent or aliased)

    def _after_full_update(self) -> None:
        self._llm.reset_prefix_cache()  # KV computed with the old weights must not be reused
        self._lora_request, self.lora = None, None  # full weights are what is served now, without an earlier adapter

    def _load_adapter(self, adapter: AdapterFiles, version: int) -> str:
        from vllm.lora.request import LoRARequest  # optional, as in from_config

        self._lora_ids += 1  # a new id per version: vLLM caches adapters by id
        request = LoRARequest(lora_name=f"rlft-v{version}", lora_int_id=self._lora_ids, lora_path=adapter.folder)
        try:
            self._llm.llm_engine.add_lora(request)
        except Exception as exc:  # noqa: BLE001 - vLLM's reason is the useful part
            raise ServerError(400, f"vLLM refused the adapter in {adapter.folder}: {type(exc).__name__}: {exc}") from None
        self._lora_request = request
        self._llm.reset_prefix_cache()
        checksum = weights_checksum({name: tensor.to(self.lora_dtype) for name, tensor in adapter.tensors.items()})
        self.weight_version, self.weight_checksum = version, checksum
        self.lora = {"rank": adapter.rank, "version": version}
        return checksum


def worker_extension(name: str | None) -> str:
    """The worker extension class vLLM mixes into its workers: rlft's, or the user's subclass of it."""
    own = "rlft.rollout.server.backends.vllm_worker.WeightGroupWorker"
    if not name or name == own:
        return own
    from rlft.rollout.server.backends.vllm_worker import WeightGroupWorker  # only for a class of the user's
    from rlft.usercode import UserCodeError, load_user_function  # only for a class of the user's

    try:
        found, _ = load_user_function(name)  # a class is callable: found as a function would be
    except UserCodeError as exc:
        raise ConfigError(f"vllm.worker_extension_cls: {exc}") from None
    if not (isinstance(found, type) and issubclass(found, WeightGroupWorker)):
        raise ConfigError(f"vllm.worker_extension_cls: {name} must be a class that subclasses {own} (rlft syncs weights "
                          "through its methods); subclass it, or remove the key")
    return name


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous tensors, a copy for each name after the first of one storage (safetensors writes no shared ones)."""
    out, seen = {}, set()
    for name, tensor in tensors.items():
        tensor = tensor.contiguous()
        if tensor.data_ptr() in seen:
            tensor = tensor.clone()
        seen.add(tensor.data_ptr())
        out[name] = tensor
    return out


def _tied_names(model: torch.nn.Module) -> list[list[str]]:
    """Groups of state-dict names that are one parameter (tied embeddings), from a (meta) copy of the model."""
    groups: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(parameter), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def _top(step: dict, k: int) -> list[tuple[int, float]]:
    """The k most likely tokens of one step (vLLM adds the sampled token to them, ranked wherever it is)."""
    ranked = sorted(((entry.rank, token, entry.logprob) for token, entry in step.items() if entry.rank is not None and entry.rank <= k))
    return [(token, logprob) for _, token, logprob in ranked]
