"""The trainer's side of the collective weight sync with a rollout server (`trl.vllm_group_port`).

`GroupLink.open` makes the handshake (`/init_weight_group`, with the server's token) and joins the group as its last
rank; `send` asks the server to receive one update (`/update_weights_group`, a watched call) and broadcasts the
buckets meanwhile. The server answers with the checksum of what it loaded, which the caller verifies as for every
other path. When the server stops answering during a broadcast, the watched call fails within ~10 s; the broadcast,
which cannot be interrupted, ends on its own thread when the group's timeout passes.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import torch

from rlft.errors import RolloutError
from rlft.rollout.watched_http import ServerRefused
from rlft.rollout.weight_group import ALONE_BYTES, BUCKET_BYTES, TensorSpec, WeightGroup, bucket_plan, connect_store, send_buckets, specs_of


class GroupBroken(RolloutError):
    """The group failed while the server still answers: the update can go over HTTP instead."""


class GroupLink:
    """`engine`: the RemoteEngine of the server (its guarded and watched calls carry the token and the liveness checks)."""

    def __init__(self, engine, port: int, timeout: float = 60.0, bucket_bytes: int = BUCKET_BYTES):
        self.engine, self.port, self.timeout, self.bucket_bytes = engine, port, timeout, bucket_bytes
        self.alone_bytes = ALONE_BYTES
        self.group: WeightGroup | None = None
        self.device = torch.device("cpu")

    def open(self, specs: list[TensorSpec]) -> str:
        """Form the group with the server; the backend it runs (gloo or nccl)."""
        wanted = "nccl" if torch.cuda.is_available() else "gloo"
        # watched: the server first waits for an earlier trainer's join to end (up to that group's timeout)
        answer = self.engine.watched_guarded("/init_weight_group", {
            "port": self.port, "backend": wanted, "tensors": [spec.to_json() for spec in specs], "timeout": self.timeout})
        store = connect_store(self.engine.host, self.port, self.timeout)
        try:
            self.group = WeightGroup.join(store, prefix=answer["prefix"], rank=answer["rank"], world_size=answer["world_size"],
                                          backend=answer["backend"], timeout=self.timeout, address=self._address())
        except RuntimeError as exc:
            raise GroupBroken(f"joining the weight group on {self.engine.host}:{self.port} failed "
                              f"({str(exc).splitlines()[0][:200]})") from None
        self.device = torch.device("cuda", torch.cuda.current_device()) if answer["backend"] == "nccl" else torch.device("cpu")
        return answer["backend"]

    def send(self, tensors: dict[str, torch.Tensor], version: int) -> dict[str, Any]:
        """Broadcast one update (tensors in the served dtype); the server's answer once it has loaded it.

        The broadcasts run on a thread of their own and the update call, watched by /health, on this one: a server
        that hangs or dies fails the call within ~10 s, and the group is dropped (a gloo broadcast cannot be
        interrupted: its thread ends when the server's connections close or the group's timeout passes)."""
        if self.group is None:
            raise GroupBroken("the weight group is closed")
        group = self.group
        tensors = {name: tensor.to(self.device) for name, tensor in tensors.items()}
        plan = bucket_plan(specs_of(tensors), self.bucket_bytes, self.alone_bytes)
        failed: list[BaseException] = []

        def broadcast() -> None:
            try:
                send_buckets(group, plan, tensors)
            except BaseException as exc:  # noqa: BLE001 - reported by the caller below
                failed.append(exc)

        sender = threading.Thread(target=broadcast, name="rlft-group-broadcast", daemon=True)
        sender.start()
        try:
            answer = self.engine.watched_guarded("/update_weights_group", {
                "version": version, "names": sorted(tensors), "bucket_bytes": self.bucket_bytes,
                "alone_bytes": self.alone_bytes})
        except ServerRefused as exc:  # it answers, with an error: HTTP can still reach it
            self.close()
            reason = f"; on the trainer's side: {_first_line(failed[0])}" if failed else ""
            raise GroupBroken(f"{exc}{reason}") from None
        except RolloutError:
            self.close()
            raise  # the server died or hangs: nothing else can reach it either
        sender.join(self.timeout)  # the server has every bucket: the broadcasts are done
        if failed or sender.is_alive():
            self.close()
            raise GroupBroken(f"the weight broadcast failed: {_first_line(failed[0]) if failed else 'it did not end'}")
        return answer

    def close(self) -> None:
        self.group = None  # the process group goes with its last reference, and its connections with it

    def _address(self) -> str:
        """This machine's address on the route to the server (the group's connections use it)."""
        family = socket.AF_INET6 if ":" in self.engine.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((self.engine.host, self.port))  # UDP: no packet is sent
                return probe.getsockname()[0]
            except OSError:
                return "127.0.0.1"


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
