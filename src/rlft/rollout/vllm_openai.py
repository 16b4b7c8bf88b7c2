"""A stock vLLM OpenAI server as the rollout engine: `vllm serve MODEL --enable-lora --logprobs-mode processed_logprobs`
started with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (https://docs.vllm.ai/en/latest/features/lora/).

* Generation goes through `/v1/completions`: the prompt as token ids, one request per prompt with its own seed (vLLM
  seeds each prompt alone: one seed for a list of prompts would give them the same random draws), `n` samples, the
  run's sampling settings, `ignore_eos` with the trainer's stop ids (so a completion ends where rlft's engines end
  it, its stop token included), and the sampled ids (`return_token_ids`) with their log-probs (`logprobs: 0`).
* Weights reach it only as LoRA adapters, through `/v1/load_lora_adapter`, under a fresh name per load
  (`rlft-v{version}-{tag}-{load}`: vLLM keys its prefix cache by adapter name and path, so a name never stands for
  other weights). Generation names the last adapter as its `model`; the one before is unloaded (no longer listed).
* The weight version is read back from `/v1/models`, which lists the loaded adapters with their folders, and every
  answer names the adapter that sampled it. A stock server reports no checksum of what it read.

Full weights have no route into a stock server: a full fine-tune, or LoRA sent merged, needs `rlft vllm-serve`.
The log-probs must be those of the distribution sampled (after temperature, penalties, min-p, top-k and top-p), which
vLLM reports with `--logprobs-mode processed_logprobs`; its default, `raw_logprobs`, reports the model's own, equal to
the sampled ones only at temperature 1 without penalty or filter. The server does not say which mode it runs, so
`check_logprobs_mode` samples with top-k 1 at start: the one token left has log-prob exactly 0 in processed mode.
"""

from __future__ import annotations

import math
import re
import secrets
from pathlib import Path
from typing import Any

import httpx

from rlft.errors import RolloutError
from rlft.rollout.local import NOT_FINITE
from rlft.rollout.types import Rollout, SamplingParams, prompt_seed
from rlft.rollout.watched_http import ServerRefused, WatchedServer

ADAPTER_NAME = re.compile(r"^rlft-v(\d+)-([0-9a-f]+)-(\d+)$")
LOGPROBS_FLAG = "--logprobs-mode processed_logprobs"
RUNTIME_LORA = "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"


def needs_processed_logprobs(params: SamplingParams) -> bool:
    """Whether the sampled distribution differs from the model's own (raw) one under these settings."""
    return (params.temperature != 1.0 or params.top_k > 0 or params.top_p < 1.0 or params.min_p > 0.0
            or params.repetition_penalty != 1.0)


def completion_body(model: str, prompt_ids: list[int], params: SamplingParams, num_samples: int, seed: int | None,
                    max_model_len: int) -> dict[str, Any]:
    """The `/v1/completions` request for `num_samples` completions of one prompt. `max_tokens` is cut to what
    `max_model_len` leaves after the prompt, as rlft's server cuts it."""
    room = max_model_len - len(prompt_ids)
    if room < 1:
        raise RolloutError(f"a prompt of {len(prompt_ids)} tokens leaves no room under the vLLM server's max_model_len "
                           f"{max_model_len}: start it with a larger --max-model-len, or shorten the prompts "
                           "(trl.max_prompt_length, sequence_len)")
    return {
        "model": model, "prompt": list(prompt_ids), "n": num_samples, "max_tokens": min(params.max_new_tokens, room),
        "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k if params.top_k > 0 else -1,
        "min_p": params.min_p, "repetition_penalty": params.repetition_penalty,
        "presence_penalty": 0.0, "frequency_penalty": 0.0,  # else the model's generation_config.json may set them
        "stop_token_ids": list(params.stop_token_ids), "stop": list(params.stop_strings), "ignore_eos": True,
        "seed": seed, "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
    }


def parse_completion(answer: dict[str, Any], num_samples: int, model: str) -> tuple[list[list[int]], list[list[float]], list[bool]]:
    """(completion ids, sampling log-probs, truncated) of the `num_samples` choices of one `/v1/completions` answer, in
    sample order; a choice that does not hold what was asked for stops the run."""
    if answer.get("model") != model:
        raise RolloutError(f"the vLLM server answered with model {answer.get('model')!r}, not the adapter {model!r} the "
                           "trainer asked for: another process changed its adapters")
    choices = sorted(answer.get("choices") or [], key=lambda choice: choice["index"])
    if len(choices) != num_samples:
        raise RolloutError(f"the vLLM server answered {len(choices)} completions where {num_samples} were asked for")
    ids, logprobs, truncated = [], [], []
    for choice in choices:
        tokens, sampled = choice.get("token_ids"), (choice.get("logprobs") or {}).get("token_logprobs")
        if tokens is None or sampled is None or len(tokens) != len(sampled):
            raise RolloutError("the vLLM server's completion lacks its token ids or their log-probs (`return_token_ids` and "
                               "`logprobs` of /v1/completions): upgrade vLLM to a version with both")
        if any(value is None or not math.isfinite(value) for value in sampled):
            raise RolloutError(NOT_FINITE)
        ids.append([int(token) for token in tokens])
        logprobs.append([float(value) for value in sampled])
        truncated.append(choice.get("finish_reason") == "length")
    return ids, logprobs, truncated


def newest_adapter(models: dict[str, Any], tag: str) -> dict[str, Any] | None:
    """The card of the adapter with tag `tag` that was loaded last among those `/v1/models` lists, with its `version`."""
    ours = []
    for card in models.get("data") or []:
        match = ADAPTER_NAME.match(str(card.get("id")))
        if match and match.group(2) == tag:
            ours.append((int(match.group(3)), {**card, "version": int(match.group(1))}))
    return max(ours, key=lambda item: item[0])[1] if ours else None


class VLLMServerEngine(WatchedServer):
    """A `RolloutEngine` on a stock vLLM OpenAI server; `base_fixed`: it serves base_model's own weights, and takes
    adapters only (`WeightSync` then sends the adapter alone)."""

    start_hint = ("`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve BASE_MODEL --enable-lora --host HOST --port PORT` "
                  "(python -m vllm.entrypoints.openai.api_server takes the same arguments)")
    base_fixed = True

    def __init__(self, host: str = "127.0.0.1", port: int = 8000, token: str | None = None, timeout: float = 3600.0, **watch):
        super().__init__(host, port, token, timeout, **watch)
        self.tag = secrets.token_hex(3)  # this client's adapters, among others the server may hold
        self.processed_logprobs: bool | None = None  # measured by check_logprobs_mode
        self._base: dict[str, Any] | None = None  # the base model's card in /v1/models
        self._adapter: str | None = None
        self._version: int | None = None
        self._loads = 0

    # ---------------------------------------------------------------- RolloutEngine

    @property
    def version(self) -> int:
        """The version of the last adapter loaded (0, base_model's own weights, before any)."""
        return self._version if self._version is not None else 0

    def health(self) -> dict[str, Any]:
        """`ok`, and `version`: that of the newest adapter of this client the server lists (None when it lists none)."""
        self._call("GET", "/health", timeout=self.health_timeout * 5)  # a 503 (its engine died) raises
        newest = newest_adapter(self._models(), self.tag)
        return {"ok": True, "version": newest["version"] if newest else None, "adapter": newest["id"] if newest else None,
                "model": self.base()["id"]}

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, num_samples: int = 1, seed: int | None = None) -> Rollout:
        self._check_mode(params)
        model, limit = self._adapter or self.base()["id"], int(self.base().get("max_model_len") or 0) or 2**31
        calls = [("POST", "/v1/completions", {"json": completion_body(model, ids, params, num_samples,
                                                                       prompt_seed(seed, index, num_samples), limit)})
                 for index, ids in enumerate(prompt_ids)]
        completion_ids, logprobs, truncated = [], [], []
        for answer in self._watched_all(calls):
            ids, values, cut = parse_completion(answer, num_samples, model)
            completion_ids += ids
            logprobs += values
            truncated += cut
        expanded = [ids for ids in prompt_ids for _ in range(num_samples)]
        return Rollout(expanded, completion_ids, logprobs, truncated, weight_versions=[self.version] * len(expanded))

    def load_weights(self, weights, version: int) -> None:
        raise RolloutError(f"the stock vLLM server at {self.base_url} cannot take full weights (it has no route for them): "
                           "train a LoRA adapter synced as a folder (adapter: lora, trl.vllm_lora_sync: true), or serve "
                           "with `rlft vllm-serve CONFIG`")

    # ---------------------------------------------------------------- beyond the protocol

    def load_adapter(self, folder: str | Path, version: int, checksum: str | None = None) -> None:
        """Load the PEFT adapter saved in `folder` (a path the server can read) as weight `version`, check that the
        server lists it from that folder, then unload the one before. `checksum` is not checked: a stock server
        cannot report what it read."""
        self._loads += 1
        name, path = f"rlft-v{version}-{self.tag}-{self._loads}", str(Path(folder).resolve())
        try:
            self._watched("POST", "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
        except ServerRefused as exc:
            raise self._lora_refusal(exc, path) from None
        listed = next((card for card in self._models()["data"] if card.get("id") == name), None)
        if listed is None or listed.get("root") != path:
            raise RolloutError(f"LoRA sync of version {version}: the vLLM server does not list adapter {name} from {path} "
                               "after loading it: another process changes its adapters")
        previous, self._adapter, self._version = self._adapter, name, version
        if previous is not None:  # out of the listing and unusable by name (vLLM's engine evicts its weights itself)
            self._call("POST", "/v1/unload_lora_adapter", json={"lora_name": previous}, timeout=60.0)

    def describe(self) -> dict[str, Any]:
        """`version` (vLLM's) and the served base model's card (`id`, `root`, `max_model_len`); raises unless a vLLM
        OpenAI server answers."""
        try:
            version = self._call("GET", "/version", timeout=self.health_timeout * 5)  # open, also with --api-key
        except RolloutError:
            version = None
        if not isinstance(version, dict) or "version" not in version:
            raise RolloutError(f"the server at {self.base_url} answers /health but is neither rlft's rollout server (no "
                               "weight version in its /health answer) nor a vLLM OpenAI server (no /version and "
                               "/v1/models): start `rlft vllm-serve CONFIG` there, or `vllm serve` as docs/rollout-server.md "
                               "says, or point trl.vllm_server_host / vllm_server_port at one of them")
        return {"version": version["version"], **self.base()}  # /v1/models: a wrong or missing --api-key key says so

    def base(self) -> dict[str, Any]:
        """The base model's card in /v1/models (the first model without a parent)."""
        if self._base is None:
            cards = [card for card in self._models().get("data") or [] if not card.get("parent")]
            if not cards:
                raise RolloutError(f"the vLLM server at {self.base_url} lists no base model in /v1/models")
            self._base = cards[0]
        return self._base

    def check_serves(self, base_model: str) -> None:
        """Raise unless the server serves `base_model`: its name (`--served-model-name`) or its folder. A stock
        server cannot report its weights' names and shapes, so the name is what is compared."""
        served = self.base()
        names = {str(served.get("id")), str(served.get("root"))}
        same_folder = Path(base_model).exists() and served.get("root") and Path(str(served["root"])).exists() \
            and Path(base_model).resolve() == Path(str(served["root"])).resolve()
        if base_model not in names and not same_folder:
            raise RolloutError(f"the vLLM server at {self.base_url} serves {served.get('id')} (from {served.get('root')}), "
                               f"not the trained base_model {base_model}: start it with `vllm serve {base_model}`, or name "
                               f"the same weights with --served-model-name {base_model}")

    def check_lora_support(self) -> None:
        """Raise, naming the flag to add, unless the server loads adapters at run time: a load of a folder that does
        not exist must fail as 'not found'."""
        missing = f"/nonexistent/rlft-probe-{self.tag}"
        try:
            self._call("POST", "/v1/load_lora_adapter", json={"lora_name": f"rlft-probe-{self.tag}", "lora_path": missing},
                       timeout=60.0)
        except ServerRefused as exc:
            if exc.status == 404 and "No adapter found" in str(exc.reason):
                return  # the route is there and LoRA is on: only the folder is missing, as it should be
            raise self._lora_refusal(exc, missing) from None
        raise RolloutError(f"the vLLM server at {self.base_url} reported loading an adapter from {missing}, which does not exist")

    def check_logprobs_mode(self, params: SamplingParams) -> None:
        """Measure whether the server reports processed log-probs (one sample with top-k 1: every log-prob is 0 in
        that mode), then raise if `params` need them and it does not."""
        body = completion_body(self.base()["id"], [0, 1, 2, 3], SamplingParams(max_new_tokens=4, top_k=1), 1, 0,
                               int(self.base().get("max_model_len") or 64))
        _, logprobs, _ = parse_completion(self._watched("POST", "/v1/completions", json=body), 1, self.base()["id"])
        self.processed_logprobs = all(abs(value) < 1e-6 for value in logprobs[0])
        self._check_mode(params)

    # ---------------------------------------------------------------- HTTP

    def _models(self) -> dict[str, Any]:
        models = self._call("GET", "/v1/models", timeout=self.health_timeout * 5)
        if not isinstance(models, dict):
            raise RolloutError(f"the server at {self.base_url} answered /v1/models with {str(models)[:200]}")
        return models

    def _check_mode(self, params: SamplingParams) -> None:
        if self.processed_logprobs is False and needs_processed_logprobs(params):
            raise RolloutError(f"the vLLM server at {self.base_url} reports the model's raw log-probs, not those of the "
                               "distribution it samples (temperature, penalties, min-p, top-k, top-p), so importance "
                               f"sampling would correct for the wrong ratio: restart it with {LOGPROBS_FLAG}")

    def _dead_engine(self, probe: httpx.Response) -> RolloutError:
        return RolloutError(f"the vLLM server at {self.host}:{self.port} answers /health with 503: its engine has died (its "
                            f"log says why): restart it with {self.start_hint}; the last checkpoint is kept")

    def _lora_refusal(self, exc: ServerRefused, path: str) -> RolloutError:
        """vLLM's refusal of an adapter load, with the flag that fixes it where one does."""
        if exc.status == 404 and isinstance(exc.reason, dict) and exc.reason.get("detail") == "Not Found":
            return RolloutError(f"the vLLM server at {self.base_url} has no /v1/load_lora_adapter route: restart it with "
                                f"the environment variable {RUNTIME_LORA} (and --enable-lora)")
        if "LoRA is not enabled" in str(exc.reason):
            return RolloutError(f"the vLLM server at {self.base_url} was started without LoRA support: restart it with "
                                "--enable-lora (and --max-lora-rank at least the config's lora_r)")
        hint = ": restart it with --max-lora-rank at least the config's lora_r" if "rank" in str(exc.reason).lower() else ""
        return RolloutError(f"the vLLM server at {self.base_url} refused the adapter in {path} ({exc.status}): "
                            f"{exc.reason}{hint}")
