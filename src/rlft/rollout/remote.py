"""The trainer's side of rlft's rollout server: an engine (`RolloutEngine`) that samples over HTTP.

Calls are watched (`rlft.rollout.watched_http`): a dead or hung server is noticed within ~10 s.
Weight syncs are verified: the server reads back what it loaded and returns its checksum, which must
equal the checksum of what was sent; every generation reports the (version, checksum) it sampled
with, and a checksum other than the one sent for that version stops the run.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping

import httpx
import torch
from safetensors.torch import load_file

from rlft.errors import RolloutError
from rlft.models.weights import ChecksumStream, architecture_digest, weights_checksum
from rlft.rollout.local import NOT_FINITE
from rlft.rollout import wire
from rlft.rollout.remote_group import GroupBroken, GroupLink
from rlft.rollout.server.protocol import DTYPES, UNKNOWN_VERSION
from rlft.rollout.server.transfer import body_digest
from rlft.rollout.types import Rollout, SamplingParams
from rlft.rollout.weight_group import TensorSpec
from rlft.rollout.watched_http import WatchedServer


class NotAnRlftServer(RolloutError):
    """Something answers /health at that address, without the weight version rlft's rollout server reports."""


def _says_unhealthy(response: httpx.Response) -> bool:
    """An rlft server's own 503 (`"status": "unhealthy"`), not a proxy's."""
    try:
        payload = response.json()
    except ValueError:
        return False
    return isinstance(payload, dict) and payload.get("status") == "unhealthy"


class RemoteEngine(WatchedServer):
    def __init__(self, host: str = "127.0.0.1", port: int = 8000, token: str | None = None, timeout: float = 3600.0, *,
                 bucket_bytes: int = 64 * 2**20, health_interval: float = 2.0, health_failures: int = 3,
                 health_timeout: float = 1.5, on_note: Callable[[str], None] | None = None):
        """`timeout`: the longest a generation or weight update may take while the server keeps answering /health
        (a dead or hung server is noticed within ~10 s regardless); short calls (health, weight info) time out after
        5 x `health_timeout`. `on_note`: how a note for the user is shown (a fallback to HTTP)."""
        super().__init__(host, port, token, timeout, health_interval=health_interval, health_failures=health_failures,
                         health_timeout=health_timeout)
        self.bucket_bytes = bucket_bytes
        self._sent: dict[int, str] = {}  # version -> checksum of the weights this client sent for it
        self.group: GroupLink | None = None  # the collective weight group, when one is open
        self.on_note = on_note or (lambda text: print(f"note: {text}", file=sys.stderr))
        self._version: int | None = None
        self._info: dict[str, Any] | None = None

    # ---------------------------------------------------------------- RolloutEngine

    @property
    def version(self) -> int:
        if self._version is None:
            self.health()
        return self._version  # type: ignore[return-value]

    def health(self) -> dict[str, Any]:
        state = self._call("GET", "/health", timeout=self.health_timeout * 5)
        if not isinstance(state, dict) or "weight_version" not in state:
            raise NotAnRlftServer(f"the server at {self.base_url} answers /health but is not an rlft rollout server (no "
                                  "weight version in its answer): start `rlft vllm-serve CONFIG` there, or point "
                                  "trl.vllm_server_host / vllm_server_port at the rlft server")
        if self._version is None:
            self._version = state["weight_version"]
        return {**state, "ok": state.get("status") == "ok", "version": state["weight_version"]}

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, num_samples: int = 1, seed: int | None = None) -> Rollout:
        body = {"prompt_ids": prompt_ids, "n": num_samples, "max_tokens": params.max_new_tokens, "temperature": params.temperature,
                "top_p": params.top_p, "top_k": params.top_k, "min_p": params.min_p, "repetition_penalty": params.repetition_penalty,
                "stop_token_ids": list(params.stop_token_ids), "stop": list(params.stop_strings), "seed": seed}
        out = self._watched("POST", "/generate", json=body)
        self._check_served(out["weight_version"], out.get("weight_checksum"))
        if any(None in row for row in out["logprobs"]):  # the server writes NaN as JSON null (allow_nan=False)
            raise RolloutError(NOT_FINITE)  # a backend passed NaN on (JSON null)
        expanded = [ids for ids in prompt_ids for _ in range(num_samples)]
        return Rollout(expanded, out["completion_ids"], out["logprobs"], out["truncated"],
                       weight_versions=[out["weight_version"]] * len(expanded))

    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Send every tensor (plain state-dict names), cast to the server's dtype: through the weight group when one
        is open (`open_group`), else in safetensors buckets that the server loads as they arrive (with each body's
        digest against damage on the way). Verify the checksum of what the server read back. A group that breaks
        while the server still answers is closed with a note, and this update and the later ones go over HTTP."""
        if self.group is not None:
            tensors = self.wire_tensors(weights, self.group.device)  # an NCCL group sends from the GPU
            with ThreadPoolExecutor(1, thread_name_prefix="rlft-checksum") as hashing:
                sent = hashing.submit(weights_checksum, tensors)  # while the buckets travel
                try:
                    out = self.group.send(tensors, version)
                except GroupBroken as exc:
                    self.group = None
                    self.on_note(f"the collective weight sync failed ({exc}): weights go to the rollout server over "
                                 "HTTP from now on")
                else:
                    self._confirm(out, version, sent.result(), "weights")
                    return
        self._load_by_http(self.wire_tensors(weights), version)

    def relabel(self, version: int) -> None:
        """The server's weights stand for `version` too (no step changed them): its version moves on, nothing is sent."""
        served = self.version
        out = self.watched_guarded("/set_weight_version", {"from_version": served, "version": version})  # after a batch
        self._confirm(out, version, self._sent.get(served), "weights")

    def open_group(self, port: int, specs: list[TensorSpec], timeout: float = 60.0) -> str:
        """Form a collective weight group with the server on its `port`; later full updates travel through it. The
        backend it runs (gloo or nccl)."""
        link = GroupLink(self, port, timeout)
        backend = link.open(specs)
        self.group = link
        return backend

    def _load_by_http(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        buckets = _buckets(tensors, self.bucket_bytes)
        stream = ChecksumStream()

        def encode(bucket: dict[str, torch.Tensor]) -> tuple[list, int, str]:
            stream.update(bucket)  # buckets are encoded in order, one at a time
            chunks, size = wire.encode(bucket)  # the tensors' own memory: no copy
            return chunks, size, body_digest(chunks)

        out: dict[str, Any] = {}
        with ThreadPoolExecutor(1, thread_name_prefix="rlft-encode") as pool:
            coming = pool.submit(encode, buckets[0])
            for index in range(len(buckets)):
                chunks, size, digest = coming.result()
                if index + 1 < len(buckets):
                    coming = pool.submit(encode, buckets[index + 1])
                params = {"version": version, "bucket": index, "buckets": len(buckets), "digest": digest}
                if index + 1 == len(buckets):
                    params["checksum"] = stream.hexdigest()
                out = self._watched("POST", "/update_weights", content=iter(chunks), params=params,
                                    headers={"content-type": "application/octet-stream", "content-length": str(size)})
        self._confirm(out, version, stream.hexdigest(), "weights")

    def wire_tensors(self, weights: Mapping[str, torch.Tensor], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """The tensors as the server holds them: on `device`, in its dtype, contiguous. Tied names share one converted
        tensor (converted once; rlft's wire format and the group send each name from it)."""
        dtype = DTYPES[self.weight_info(refresh=self._info is None)["dtype"]]
        converted: dict[tuple, torch.Tensor] = {}
        tensors = {}
        for name, tensor in weights.items():
            key = (tensor.data_ptr(), tensor.device, tuple(tensor.shape), tensor.stride())
            if key not in converted:
                converted[key] = tensor.detach().to(device, dtype).contiguous()
            tensors[name] = converted[key]
        return tensors

    # ---------------------------------------------------------------- beyond the protocol

    def load_weights_from_path(self, path: str | Path, version: int, checksum: str) -> None:
        """Have the server read full weights from *.safetensors at `path` (shared by both machines); verify them.

        `checksum` is `weights_checksum` of the tensors as saved there (in the server's dtype).
        """
        out = self._watched("POST", "/update_weights_from_path",  # absolute: the server may run in another directory
                            json={"path": str(Path(path).resolve()), "version": version, "checksum": checksum})
        self._confirm(out, version, checksum, "weights")

    def load_adapter(self, folder: str | Path, version: int, checksum: str | None = None) -> None:
        """Load the PEFT LoRA adapter saved in `folder` (a path the server can read) as weight `version`.

        `checksum` is `weights_checksum` of the adapter's tensors as the trainer saved them (read from the folder
        when not given). The server must report it received exactly those and serves them cast to its LoRA dtype.
        """
        stored = load_file(str(Path(folder) / "adapter_model.safetensors")) if (Path(folder) / "adapter_model.safetensors").exists() else None
        if checksum is None and stored is not None:
            checksum = weights_checksum(stored)
        out = self._watched("POST", "/load_lora_adapter",  # absolute: the server may run in another directory
                            json={"lora_path": str(Path(folder).resolve()), "version": version, "checksum": checksum})
        if checksum and out.get("received_checksum") != checksum:
            raise RolloutError(f"LoRA sync of version {version}: the server read checksum {out.get('received_checksum')} "
                               f"from {folder}, the trainer saved {checksum}")
        expected = None
        if stored is not None:
            lora_dtype = DTYPES[self.weight_info(refresh=self._info is None)["lora_dtype"]]
            expected = weights_checksum({name: tensor.to(lora_dtype) for name, tensor in stored.items()})
        self._confirm(out, version, expected, "LoRA adapter")

    def watched_guarded(self, path: str, body: dict[str, Any]) -> Any:
        """A long POST, watched by /health (a dead server fails it within ~10 s)."""
        return self._watched("POST", path, json=body)

    def weight_info(self, refresh: bool = True) -> dict[str, Any]:
        if refresh or self._info is None:
            self._info = self._call("GET", "/weight_info", timeout=self.health_timeout * 5)
        return self._info

    def check_serves(self, model_or_state_dict) -> None:
        """Raise unless the server's base model has the architecture (plain names and shapes) of this one."""
        served = self.weight_info()["architecture"]
        if served != architecture_digest(model_or_state_dict):
            raise RolloutError(f"the rollout server at {self.host}:{self.port} serves {self.weight_info(False)['model']}, whose "
                               "weights differ in names or shapes from the trained model: start it with the same base_model")

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        super().close()

    # ---------------------------------------------------------------- HTTP

    def _dead_engine(self, probe: httpx.Response) -> RolloutError | None:
        if not _says_unhealthy(probe):
            return None
        return RolloutError(f"the rollout server at {self.host}:{self.port} reports: {probe.json().get('error')}: restart "
                            "it (`rlft vllm-serve CONFIG`); the last checkpoint is kept")

    def _confirm(self, out: dict[str, Any], version: int, checksum: str | None, what: str) -> None:
        served_version, served = out.get("weight_version"), out.get("weight_checksum")
        if served_version != version:
            raise RolloutError(f"{what} sync: the server reports version {served_version} after being sent version {version}")
        if checksum is not None and served != checksum:
            raise RolloutError(f"{what} sync of version {version}: the server loaded checksum {served}, the trainer sent "
                               f"{checksum}: the served weights are not the trained ones")
        self._sent[version] = served
        self._version = version

    def _check_served(self, version: int, checksum: str | None) -> None:
        """Once this client has sent weights, every sample must come from weights it sent (a client that never sent
        any, a plain sampler, takes the server's own)."""
        if version == UNKNOWN_VERSION:
            raise RolloutError(f"the rollout server at {self.host}:{self.port} serves weights in an unknown state (a weight "
                               "update failed part-way): send a full update or restart it with `rlft vllm-serve CONFIG`")
        if version in self._sent:
            if checksum != self._sent[version]:
                raise RolloutError(f"the rollout server sampled with weight version {version} of checksum {checksum}, but this "
                                   f"trainer sent checksum {self._sent[version]} for it: another process changed its weights")
        elif self._sent:
            raise RolloutError(f"the rollout server sampled with weight version {version}, which this trainer never sent "
                               f"(it sent {sorted(self._sent)}): it was restarted or another trainer updates it")


def _buckets(tensors: dict[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    """Tensors in name order, grouped into buckets of at most `limit` bytes (a larger tensor goes alone)."""
    buckets: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if buckets[-1] and size + nbytes > limit:
            buckets.append({})
            size = 0
        buckets[-1][name] = tensors[name]
        size += nbytes
    return buckets
