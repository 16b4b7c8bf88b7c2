"""Where the commands print: results on stdout, errors on stderr."""

from __future__ import annotations

from rich.console import Console

console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # messages stay whole lines: easy to read and grep
