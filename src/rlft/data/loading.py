"""Load the rows of one `datasets:` entry: local file, folder of files, `save_to_disk` folder, or hub id.

Splits may carry a slice (`train[:1%]`, `train[10:100]`, `train[-50:]`), applied the same way to
every source.

JSON and JSON-lines files are read here, not by `datasets`, which would re-type a column to one type
for the whole file (a number next to strings, a list where a string is expected: a whole-file arrow error,
or a value cast to text). Each row keeps the values its user wrote (and, as with `datasets`, every key of
the file, null where the row has none: transforms written for Axolotl expect that), as JSON text in the `ROW` column, with
its place in the file (`line 12` of a JSON-lines file, `element 3` of a JSON array) in `PLACE`; rows
from other sources get `row N` (1-based). Every row message names that place, whatever the slice.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

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
ROW, PLACE = "__rlft_row__", "__rlft_place__"  # a JSON row as its user wrote it; where it is in its file


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


def _load_files(files: list[str], builder: str, where: str) -> Dataset:
    if builder == "json":
        found = [(f"{Path(file).name} {place}" if len(files) > 1 else place, row)
                 for file in files for place, row in read_json_rows(Path(file), where)]
        keys = list(dict.fromkeys(key for _, row in found for key in row))  # every row gets every key, null where it has
        rows = [json.dumps({key: row.get(key) for key in keys}, ensure_ascii=False) for _, row in found]  # none (as datasets)
        return Dataset.from_dict({ROW: rows, PLACE: [place for place, _ in found]})
    try:
        return load_dataset(builder, data_files=files, split="train")
    except Exception as exc:  # datasets raises many types for malformed files
        raise DataError(f"{where}: cannot read {', '.join(files)} as {builder}: {exc}") from None


def read_json_rows(path: Path, where: str) -> list[tuple[str, dict]]:
    """(place, row) of a JSON-lines file, or of a .json file holding an array of objects (or one object; a .json file
    of JSON lines is read as lines)."""
    raw, name = path.read_bytes(), path.name  # `where` names the whole path
    try:
        text = raw.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as exc:
        line, column = raw.count(b"\n", 0, exc.start) + 1, exc.start - raw.rfind(b"\n", 0, exc.start)
        raise DataError(f"{where}: {name} line {line} is not UTF-8 (byte {raw[exc.start]:#04x} at column {column}): save "
                        "the file as UTF-8") from None
    if path.suffix.lower() == ".json" and (text.lstrip().startswith("[") or not _looks_like_lines(text)):
        try:
            whole = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: {name} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
        items = whole if isinstance(whole, list) else [whole]
        for number, item in enumerate(items):
            if not isinstance(item, dict):
                raise DataError(f"{where}: {name} element {number} is {type(item).__name__} {json.dumps(item)[:60]}, not "
                                "an object with the row's fields")
        return [(f"element {number}", item) for number, item in enumerate(items)]
    rows = [(number, json_line(line, number, name, where)) for number, line in enumerate(text.split("\n"), 1)]
    return [(f"line {number}", row) for number, row in rows if row is not None]


def json_line(line: str, number: int, name: str, where: str) -> dict | None:
    """The row of line `number` of JSON-lines file `name`, or None for a blank line."""
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: {name} line {number} is not valid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(row, dict):
        raise DataError(f"{where}: {name} line {number} is {type(row).__name__} {line.strip()[:60]}, not an object "
                        "with the row's fields (one JSON object per line)")
    return row


def unpack(row: dict) -> tuple[str, dict]:
    """(place in its file, the fields as its user wrote them) of one row of `load_rows`."""
    row = dict(row)  # datasets hands lazy rows to map functions
    place = row.pop(PLACE)
    return place, json.loads(row[ROW]) if ROW in row else row


def _looks_like_lines(text: str) -> bool:
    """A .json file that is JSON lines in fact: its first non-blank line is a whole object."""
    first = next((line for line in text.split("\n") if line.strip()), "")
    try:
        return isinstance(json.loads(first), dict) and first.strip() != text.strip()
    except json.JSONDecodeError:
        return False


def load_rows(ds, index: int) -> Dataset:
    """All rows of dataset entry `ds` after the split slice, before any format is applied. JSON rows come as the `ROW`
    column (JSON text); every row has its place in its file in `PLACE`."""
    where = describe(ds, index)
    split_name, slice_spec = parse_split(ds.split)
    kind, found = locate(ds, where)
    if kind == "files":
        rows = _load_files(*found, where)
    elif kind == "saved":
        rows = load_saved(found, split_name, where)
    else:
        rows = _load_hub(ds, split_name, where)
    if len(rows) == 0:
        raise DataError(f"{where}: the dataset has no rows")
    if PLACE not in rows.column_names:
        rows = rows.add_column(PLACE, [f"row {number}" for number in range(1, len(rows) + 1)])
    return apply_slice(rows, slice_spec, where)


def locate(ds, where: str) -> tuple[str, Any]:
    """Where the rows of dataset entry `ds` are: ("files", (paths, builder)), ("saved", folder) for a `save_to_disk`
    folder, or ("hub", name); read whole here and streamed by `rlft.data.stream`. A missing or empty file, a format
    that cannot be inferred, a folder without data, a local-looking path that does not exist and a hub name while the
    hub is off are DataErrors."""
    data_files = [ds.data_files] if isinstance(ds.data_files, str) else list(ds.data_files or [])
    path = Path(ds.path).expanduser() if ds.path else None
    if path is not None and path.is_dir() and not data_files:
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            return "saved", path
        files = sorted(str(p) for p in path.iterdir() if p.suffix.lower() in EXTENSION_BUILDERS)
        if not files:
            raise DataError(f"{where}: folder {path} holds no data files ({', '.join(EXTENSION_BUILDERS)}) and is not a "
                            "saved dataset")
    elif path is not None and path.is_dir():
        files = [str(path / f) for f in data_files]
    elif path is not None and path.is_file():
        if data_files and {str(Path(f).expanduser().resolve()) for f in data_files} != {str(path.resolve())}:
            raise DataError(f"{where}: data_files are read inside a folder `path`, and {path} is a file: list every file "
                            "in data_files with path: their folder (or leave data_files out)")
        files = [str(path)]
    elif path is None:
        files = data_files
    else:
        name = ds.path
        if name.startswith((".", "/", "~")) or name.count("/") > 1 or Path(name).suffix.lower() in EXTENSION_BUILDERS:
            raise DataError(f"{where}: {name} does not exist (relative paths are read from {Path.cwd()})")
        if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
            raise DataError(f"{where}: {name!r} is not a local file or folder, and the hub is off (HF_HUB_OFFLINE=1)")
        return "hub", name
    missing = [f for f in files if not Path(f).exists()]
    if missing:
        raise DataError(f"{where}: file not found: {', '.join(missing)} (relative paths are read from {Path.cwd()})")
    empty = [f for f in files if Path(f).is_file() and Path(f).stat().st_size == 0]
    if empty:
        raise DataError(f"{where}: file is empty: {', '.join(empty)}")
    return "files", (files, _builder_for(files, ds.ds_type, where))


def load_saved(folder: Path, split_name: str, where: str) -> Dataset:
    """The split `split_name` of a `save_to_disk` folder (memory-mapped)."""
    try:
        saved = load_from_disk(str(folder))
    except Exception as exc:
        raise DataError(f"{where}: cannot read saved dataset {folder}: {type(exc).__name__}: {exc}") from None
    if isinstance(saved, DatasetDict):
        if split_name not in saved:
            raise DataError(f"{where}: saved dataset has splits {list(saved)}, not {split_name!r}: set split")
        return saved[split_name]
    return saved


def _load_hub(ds, split_name: str, where: str) -> Dataset:
    try:
        return load_dataset(ds.path, name=ds.name, split=split_name, revision=ds.revision, data_files=ds.data_files)
    except Exception as exc:
        raise DataError(f"{where}: cannot load hub dataset {ds.path!r}: {exc}") from None
