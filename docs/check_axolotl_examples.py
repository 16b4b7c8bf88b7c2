"""Validate every YAML config under a folder (e.g. a checkout of Axolotl's `examples/`) and count problems by key.

    PYTHONPATH=src .venv/bin/python docs/check_axolotl_examples.py path/to/axolotl/examples

Prints how many files validate and, for the others, each problem key with the number of files it
appears in and one example message. Nothing is loaded but the YAML.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

from rlft.config import load_config
from rlft.errors import ConfigError


def main(folder: str) -> int:
    files = sorted(p for p in Path(folder).rglob("*") if p.suffix in (".yml", ".yaml"))
    passed, problems, example = 0, collections.Counter(), {}
    for path in files:
        try:
            load_config(path)
            passed += 1
        except ConfigError as exc:
            for where, what in exc.problems:
                key = where.split("[")[0] if where != "combination" else "combination: " + what.split(":")[0]
                problems[key] += 1
                example.setdefault(key, f"{path.relative_to(folder)}: {what}")
    print(f"{passed} of {len(files)} configs validate")
    for key, count in problems.most_common():
        print(f"{count:4d}  {key}  (e.g. {example[key][:160]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
