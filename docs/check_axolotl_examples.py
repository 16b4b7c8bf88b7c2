"""Validate every YAML config under a folder (e.g. a checkout of Axolotl's `examples/`) and count problems by key.

    PYTHONPATH=src .venv/bin/python docs/check_axolotl_examples.py path/to/axolotl/examples

Prints how many files validate and, for the others, each problem key with the number of files it
appears in and one example message. Then, of the files that validate, how many set no key that
`rlft train` refuses as not built (Axolotl keys and plugins rlft does not run, planned keys), and those
keys counted by file. What a machine lacks (a GPU, a package) is not counted. Nothing is loaded but
the YAML.
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

from rlft.config import load_config, planned_settings
from rlft.config.axolotl_keys import unsupported_settings
from rlft.errors import ConfigError
from rlft.train.unbuilt import parameter_lora_unbuilt


def main(folder: str) -> int:
    files = sorted(p for p in Path(folder).rglob("*") if p.suffix in (".yml", ".yaml"))
    passed, problems, example, runnable, refused = 0, collections.Counter(), {}, 0, collections.Counter()
    for path in files:
        try:
            cfg = load_config(path)
            passed += 1
            keys = {re.sub(r"\[\d+\]", "[]", key.split(":")[0]) for key, _ in unsupported_settings(cfg)[0] + planned_settings(cfg)}
            keys |= {"lora_target_parameters"} if cfg.lora_target_parameters and parameter_lora_unbuilt(cfg) else set()
            runnable += not keys
            refused.update(keys)
        except ConfigError as exc:
            for where, what in exc.problems:
                key = where.split("[")[0] if where != "combination" else "combination: " + what.split(":")[0]
                problems[key] += 1
                example.setdefault(key, f"{path.relative_to(folder)}: {what}")
    print(f"{passed} of {len(files)} configs validate")
    for key, count in problems.most_common():
        print(f"{count:4d}  {key}  (e.g. {example[key][:160]})")
    print(f"{runnable} of the {passed} set no key that `rlft train` refuses as not built; the keys it refuses, by files:")
    for key, count in refused.most_common():
        print(f"{count:4d}  {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
