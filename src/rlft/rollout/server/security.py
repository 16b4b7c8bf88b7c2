"""Who may change the served weights: a bearer token on every weight- or adapter-changing endpoint.

A token is in force when one is configured (`--api-key`, `vllm.api_key`, `RLFT_SERVER_TOKEN`); when
the server listens beyond loopback and none is configured, one is generated and printed at start,
so an open port never lets anyone on the network replace the model.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path

TOKEN_ENV = "RLFT_SERVER_TOKEN"


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere


def resolve_token(configured: str | None, host: str) -> tuple[str | None, bool]:
    """(token in force, whether it was generated now)."""
    token = configured or os.environ.get(TOKEN_ENV) or None
    if token:
        return token, False
    if is_loopback(host):
        return None, False
    return secrets.token_urlsafe(32), True


def token_file(port: int) -> Path:
    """Where a generated token is kept for trainers of the same user on this machine (readable by that user only)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "rlft" / f"server-token-{port}"


def save_generated_token(token: str, port: int) -> Path:
    path = token_file(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token)
    return path


def local_token(port: int) -> str | None:
    """The token a server on this machine generated for `port`, if any."""
    try:
        return token_file(port).read_text().strip() or None
    except OSError:
        return None
