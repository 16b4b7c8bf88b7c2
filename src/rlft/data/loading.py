"""Load the rows of one `datasets:` entry: local file, folder of files, `save_to_disk` folder, or hub id.

Splits may carry a slice (`train[:1%]`, `train[10:100]`, `train[-50:]`), applied the same way to
every source.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from datasets import Dataset, DatasetDict, load_dataset, load_from_disk

from rlft.errors import DataError

EXTENSION_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
    ".txt": "text",
}
_SPLIT = re.compile(r"^\s*([\w.\-]+)\s*(?:\[\s*([^\]]*)\s*\])?\s*$")


def describe(ds, index: int) -> str:
    """How messages name a dataset: `datasets[0] (data/train.jsonl)`."""
    return f"datasets[{index}] ({ds.path or ds.data_files})"


def parse_split(split: str) -> tuple[str, str | None]:
    match = _SPLIT.match(split)
    if not match:
        raise DataError(f"split {split!r} is not understood: use e.g. train, train[:1%], train[10:100]")
    return match.group(1), match.group(2)


def apply_slice(rows: Dataset, spec: str | None, where: str) -> Dataset:
    """Select `start:stop` of `rows`; each bound is a row count or a percentage, negatives count from the end."""
    if spec is None or spec.strip() == "":
        return rows
    if ":" not in spec:
        raise DataError(f"{where}: split slice [{spec}] needs a colon, e.g. [:100] or [10%:20%]")
    start_text, stop_text = (part.strip() for part in spec.split(":", 1))
    total = len(rows)

    def bound(text: str, default: int) -> int:
        if text == "":
            return default
        try:
            value = round(float(text[:-1]) * total / 100) if text.endswith("%") else int(text)
        except ValueError:
            raise DataError(f"{where}: bad slice bound {text!r} in [{spec}]") from None
        return max(0, min(total, value + total if value < 0 else value))

    start, stop = bound(start_text, 0), bound(stop_text, total)
    return rows.select(range(start, max(start, stop)))


def _builder_for(files: list[str], ds_type: str | None, where: str) -> str:
    if ds_type:
        return "json" if ds_type == "jsonl" else ds_type
    suffixes = {Path(f).suffix.lower() for f in files}
    builders = {EXTENSION_BUILDERS.get(s) for s in suffixes}
    if None in builders or len(builders) != 1:
        raise DataError(f"{where}: cannot infer the file format of {sorted(suffixes)}: set ds_type (json, csv, parquet, arrow, text)")
    return builders.pop()


def _load_files(files: list[str], ds_type: str | None, where: str) -> Dataset:
    missing = [f for f in files if not Path(f).exists()]
    if missing:
        raise DataError(f"{where}: file not found: {', '.join(missing)} (relative paths are read from {Path.cwd()})")
    empty = [f for f in files if Path(f).is_file() and Path(f).stat().st_size == 0]
    if empty:
        raise DataError(f"{where}: file is empty: {', '.join(empty)}")
    builder = _builder_for(files, ds_type, where)
    try:
        return load_dataset(builder, data_files=files, split="train")
    except Exception as exc:  # datasets raises many types for malformed files
        raise DataError(f"{where}: cannot read {', '.join(files)} as {builder}: {exc}") from None


def load_rows(ds, index: int) -> Dataset:
    """All rows of dataset entry `ds` after the split slice, before any format is applied."""
    where = describe(ds, index)
    split_name, slice_spec = parse_split(ds.split)
    data_files = [ds.data_files] if isinstance(ds.data_files, str) else list(ds.data_files or [])
    path = Path(ds.path).expanduser() if ds.path else None

    if path is not None and path.is_file():
        rows = _load_files([str(path)], ds.ds_type, where)
    elif path is not None and path.is_dir():
        rows = _load_folder(path, data_files, ds, split_name, where)
    elif path is None:
        rows = _load_files(data_files, ds.ds_type, where)
    else:
        rows = _load_hub(ds, split_name, where)
    if len(rows) == 0:
        raise DataError(f"{where}: the dataset has no rows")
    return apply_slice(rows, slice_spec, where)


def _load_folder(path: Path, data_files: list[str], ds, split_name: str, where: str) -> Dataset:
    if data_files:
        return _load_files([str(path / f) for f in data_files], ds.ds_type, where)
    if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
        try:
            saved = load_from_disk(str(path))
        except Exception as exc:
            raise DataError(f"{where}: cannot read saved dataset {path}: {type(exc).__name__}: {exc}") from None
        if isinstance(saved, DatasetDict):
            if split_name not in saved:
                raise DataError(f"{where}: saved dataset has splits {list(saved)}, not {split_name!r}")
            return saved[split_name]
        return saved
    files = sorted(str(p) for p in path.iterdir() if p.suffix.lower() in EXTENSION_BUILDERS)
    if not files:
        raise DataError(f"{where}: folder {path} holds no data files ({', '.join(EXTENSION_BUILDERS)}) and is not a saved dataset")
    return _load_files(files, ds.ds_type, where)


def _load_hub(ds, split_name: str, where: str) -> Dataset:
    name = ds.path
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or Path(name).suffix.lower() in EXTENSION_BUILDERS:
        raise DataError(f"{where}: {name} does not exist (relative paths are read from {Path.cwd()})")
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        raise DataError(f"{where}: {name!r} is not a local file or folder, and the hub is off (HF_HUB_OFFLINE=1)")
    try:
        return load_dataset(name, name=ds.name, split=split_name, revision=ds.revision, data_files=ds.data_files)
    except Exception as exc:
        raise DataError(f"{where}: cannot load hub dataset {name!r}: {exc}") from None
