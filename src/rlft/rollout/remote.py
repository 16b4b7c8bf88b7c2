"""The trainer's side of the rollout server: an engine (`RolloutEngine`) that samples over HTTP.

Every call has a timeout, and a long call (generation, a weight update) is watched: while it runs,
`/health` is asked every ~2 s, and after 3 unanswered checks in a row the call fails with a
RolloutError, so a dead or hung server is noticed within ~10 s instead of at the next timeout; a server
that answers 503 (its engine is dead) fails the call at the first check.
Weight syncs are verified: the server reads back what it loaded and returns its checksum, which must
equal the checksum of what was sent; every generation reports the (version, checksum) it sampled
with, and a checksum other than the one sent for that version stops the run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
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

TOKEN_ENV = "RLFT_SERVER_TOKEN"
_GONE = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def _says_unhealthy(response: httpx.Response) -> bool:
    """An rlft server's own 503 (`"status": "unhealthy"`), not a proxy's."""
    try:
        payload = response.json()
    except ValueError:
        return False
    return isinstance(payload, dict) and payload.get("status") == "unhealthy"


class RemoteEngine:
    def __init__(self, host: str = "127.0.0.1", port: int = 8000, token: str | None = None, timeout: float = 3600.0, *,
                 bucket_bytes: int = 64 * 2**20, health_interval: float = 2.0, health_failures: int = 3,
                 health_timeout: float = 1.5, on_note: Callable[[str], None] | None = None):
        """`timeout`: the longest a generation or weight update may take while the server keeps answering /health
        (a dead or hung server is noticed within ~10 s regardless); short calls (health, weight info) time out after
        5 x `health_timeout`. `on_note`: how a note for the user is shown (a fallback to HTTP)."""
        self.host = "127.0.0.1" if host in ("0.0.0.0", "", None) else host  # 0.0.0.0 is where a server listens, not an address
        self.port = port
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.base_url = f"http://{shown}:{port}"
        self.timeout = timeout
        self.bucket_bytes = bucket_bytes
        self.health_interval, self.health_failures, self.health_timeout = health_interval, health_failures, health_timeout
        token = token or os.environ.get(TOKEN_ENV) or None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0))
        # one client for the liveness probes of watched calls (making a client costs ~20 ms: not once per call)
        self._probe = httpx.Client(base_url=self.base_url, timeout=health_timeout)
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
            raise RolloutError(f"the server at {self.base_url} answers /health but is not an rlft rollout server (no weight "
                               "version in its answer; a plain `vllm serve` or TRL's server cannot take verified weight "
                               "syncs): start `rlft vllm-serve CONFIG` there, or point trl.vllm_server_host / "
                               "vllm_server_port at the rlft server")
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
        tensors = self.wire_tensors(weights)
        if self.group is not None:
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
        self._load_by_http(tensors, version)

    def relabel(self, version: int) -> None:
        """The server's weights stand for `version` too (no step changed them): its version moves on, nothing is sent."""
        served = self.version
        out = self.call_guarded("/set_weight_version", {"from_version": served, "version": version})
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

    def wire_tensors(self, weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors as the server holds them: on the CPU, in its dtype, contiguous, one storage each."""
        dtype = DTYPES[self.weight_info(refresh=self._info is None)["dtype"]]
        tensors, seen = {}, set()
        for name, tensor in weights.items():
            tensor = tensor.detach().to("cpu", dtype).contiguous()
            if tensor.data_ptr() in seen:  # tied weights share storage, which safetensors refuses to write twice
                tensor = tensor.clone()
            seen.add(tensor.data_ptr())
            tensors[name] = tensor
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

    def call_guarded(self, path: str, body: dict[str, Any]) -> Any:
        """A short POST to a route that needs the token."""
        return self._call("POST", path, json=body, timeout=self.health_timeout * 20)

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

    def wait_until_ready(self, timeout: float = 240.0, on_progress: Callable[[float], None] | None = None) -> dict[str, Any]:
        """Poll /health every second until the server answers; raise saying what to start when it never does."""
        start = time.monotonic()
        while True:
            try:
                return self.health()
            except RolloutError as exc:
                if "stopped answering" not in str(exc) and "no rollout server" not in str(exc):
                    raise  # it answered, with an error: waiting will not help
            elapsed = time.monotonic() - start
            if elapsed >= timeout:
                raise RolloutError(f"no rollout server answered at {self.base_url}/health after {timeout:.0f} s: start one with "
                                   f"`rlft vllm-serve CONFIG` (listening on {self.host}:{self.port}: vllm.host / vllm.port, "
                                   "or --host / --port), or fix the trainer's server host and port")
            if on_progress is not None:
                on_progress(elapsed)
            time.sleep(min(1.0, max(timeout - elapsed, 0.0)))

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        self._http.close()
        self._probe.close()

    # ---------------------------------------------------------------- HTTP

    def _died(self) -> RolloutError:
        return RolloutError(f"the rollout server at {self.host}:{self.port} stopped answering (it died or hangs): restart it "
                            "with `rlft vllm-serve CONFIG`; the last checkpoint is kept")

    def _dead_engine(self, probe: httpx.Response) -> RolloutError:
        return RolloutError(f"the rollout server at {self.host}:{self.port} reports: {probe.json().get('error')}: restart "
                            "it (`rlft vllm-serve CONFIG`); the last checkpoint is kept")

    def _call(self, method: str, path: str, timeout: float | None = None, **kwargs) -> Any:
        try:
            response = self._http.request(method, path, timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT, **kwargs)
        except httpx.ConnectError:
            if self._version is None:
                raise RolloutError(f"no rollout server at {self.base_url}: start one with `rlft vllm-serve CONFIG`") from None
            raise self._died() from None
        except (*_GONE, httpx.TimeoutException):
            raise self._died() from None
        return self._answer(response, path)

    def _answer(self, response: httpx.Response, path: str) -> Any:
        if response.status_code == 401:
            raise RolloutError(f"the rollout server refused {path} (401): the token is wrong or missing: set vllm.api_key in "
                               f"the trainer's config or the {TOKEN_ENV} environment variable to the server's token")
        try:
            payload = response.json()
        except ValueError:
            payload = {"error": response.text[:300]}
        if response.status_code >= 400:
            reason = payload.get("error", payload) if isinstance(payload, dict) else payload
            reason = reason.get("message", reason) if isinstance(reason, dict) else reason  # the /v1/ routes' OpenAI form
            raise RolloutError(f"the rollout server refused {path} ({response.status_code}): {reason}")
        return payload

    def _watched(self, method: str, path: str, **kwargs) -> Any:
        """A long call, with /health checked every `health_interval` s on the side: a dead server fails it within ~10 s."""
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                result["response"] = self._http.request(method, path, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                result["error"] = exc

        worker = threading.Thread(target=run, name=f"rlft-remote{path}", daemon=True)  # daemon: a hung call never blocks exit
        worker.start()
        failures, next_probe = 0, time.monotonic() + self.health_interval
        while True:
            worker.join(max(next_probe - time.monotonic(), 0.0))
            if not worker.is_alive():
                break
            next_probe = time.monotonic() + self.health_interval  # a slow probe does not stretch the schedule
            try:
                probe = self._probe.get("/health")
                if probe.status_code == 503 and _says_unhealthy(probe):  # its engine is dead: waiting will not help
                    raise self._dead_engine(probe)
                probe.raise_for_status()
                failures = 0
            except httpx.ConnectError:
                raise self._died() from None  # refused: the process is gone
            except httpx.HTTPError:
                failures += 1
                if failures >= self.health_failures:
                    raise self._died() from None
        if "error" in result:
            if isinstance(result["error"], (*_GONE, httpx.TimeoutException)):
                raise self._died() from None
            raise result["error"]
        return self._answer(result["response"], path)

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
