"""Streamed SFT data: `pretraining_dataset`, or `datasets:` with `streaming: true`, read as training goes.

Rows are read in buffers of `streaming_multipack_buffer_size`, tokenised, packed (`sample_packing`), shuffled within
the buffer (`shuffle_merged_datasets`, seeded by the epoch and the buffer) and cut into micro-batches. Every process
reads every row and makes the same global sequence of micro-batches; each optimizer step takes the next
`gradient_accumulation_steps x processes` of them, the k-th to process k mod N, as a run of one process would see
them in turn. A checkpoint records where the stream stands (`StreamPosition`: epoch, rows before the current buffer,
micro-batches taken from it), so a resume, also with another process count, continues with the same micro-batches:
it reads the rows before the buffer again without tokenising them. At the stream's end the next epoch starts over.

`type: pretrain` rows are raw text (`text_column`): the tokenizer's ids with its end-of-text token after, cut into
pieces of `sequence_len` tokens, each starting with the last token of the one before; a piece's first token is context
only, so every token of a text but its first is a target exactly once.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from datasets import load_dataset

from rlft.data.cache import tokenizer_fingerprint
from rlft.data.collate import pack_examples
from rlft.data.formats.rows import RowError
from rlft.data.loading import json_line, load_saved, locate, parse_split, read_json_rows
from rlft.data.prepare import sft_steps, tokenize_test_datasets
from rlft.data.prepared import LengthReport, PreparedData
from rlft.data.tokenize import IGNORE
from rlft.errors import DataError

@dataclass
class StreamPosition:
    """Where a stream stands, at an optimizer step's end."""

    epoch: int = 0
    rows: int = 0  # rows of this epoch read before the current buffer
    taken: int = 0  # micro-batches of the current buffer already trained (by all processes)


@dataclass
class StreamCounts:
    """What the rows read so far became (every process counts the same)."""

    rows: int = 0
    kept: int = 0
    truncated: int = 0
    dropped: int = 0
    too_long: int = 0  # of the dropped: longer than sequence_len (excess_length_strategy: drop)
    pieces: int = 0  # pretrain: the pieces of sequence_len tokens the texts were cut into


Convert = Callable[[list[tuple[str, dict]]], list[list[dict[str, list[int]]]]]  # (place, row) each -> its examples


class StreamSource:
    """The rows of one dataset entry, from the start each time it is opened, and how a run of its rows becomes
    examples (`convert`: one list of examples per row)."""

    def __init__(self, ds, where: str, convert: Convert):
        self.ds, self.where, self.convert = ds, where, convert
        split, spec = parse_split(ds.split)
        self.split, self.start, self.stop = split, *_row_slice(spec, where)
        self.start += getattr(ds, "skip", 0) or 0

    def rows(self) -> Iterator[tuple[str, dict]]:
        return itertools.islice(_read(self.ds, self.split, self.where), self.start, self.stop)


def _row_slice(spec: str | None, where: str) -> tuple[int, int | None]:
    """A split's slice as rows to skip and the row to stop at: a stream has no length, so only counts from its start."""
    if spec is None or not spec.strip():
        return 0, None
    parts = [part.strip() for part in spec.split(":")]
    if len(parts) != 2 or not all(part == "" or part.isdigit() for part in parts):
        raise DataError(f"{where}: split slice [{spec}] cannot be read from a stream, which has no length: use row "
                        "counts from its start, e.g. [:1000] or [100:1000]")
    return int(parts[0] or 0), int(parts[1]) if parts[1] else None


def _read(ds, split: str, where: str) -> Iterator[tuple[str, dict]]:
    """(place, row) of a dataset entry, lazily; what a reader raises while it reads becomes a DataError naming the
    dataset. A row lacking a key that rows before it had gets it as null, as a file read whole has every key of the
    file in every row (transforms written for that read `row["input"]` of every row)."""
    seen: dict[str, None] = {}
    try:
        for place, row in _open(ds, split, where):
            seen.update(dict.fromkeys(row))
            yield place, {**dict.fromkeys(seen), **row} if len(row) < len(seen) else row
    except DataError:
        raise
    except Exception as exc:  # datasets and pyarrow raise many types for a file or dataset they cannot read
        raise DataError(f"{where}: cannot read its rows: {type(exc).__name__}: {str(exc)[:300]}") from None


def _open(ds, split: str, where: str) -> Iterator[tuple[str, dict]]:
    """JSON lines line by line (a .json file whole, as `rlft.data.loading` reads it), other files and hub datasets
    through `datasets`' streaming mode, a `save_to_disk` folder memory-mapped; found as `rlft.data.loading` finds them."""
    kind, found = locate(ds, where)
    if kind == "saved":
        rows = load_saved(found, split, where)
    elif kind == "hub":
        rows = load_dataset(found, name=ds.name, split=split, revision=ds.revision, data_files=ds.data_files, streaming=True)
    elif found[1] != "json":
        rows = load_dataset(found[1], data_files=found[0], split="train", streaming=True)
    else:
        files = [Path(file) for file in found[0]]
        for file in files:
            if file.suffix.lower() == ".json":
                yield from ((f"{file.name} {place}" if len(files) > 1 else place, row)
                            for place, row in read_json_rows(file, where))
            else:
                yield from _json_lines(file, where, len(files) > 1)
        return
    yield from ((f"row {number}", dict(row)) for number, row in enumerate(rows, 1))


def _json_lines(path: Path, where: str, named: bool) -> Iterator[tuple[str, dict]]:
    """A JSON-lines file line by line."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            place = f"{path.name} line {number}" if named else f"line {number}"
            try:
                line = raw.decode("utf-8").lstrip("\ufeff")
            except UnicodeDecodeError:
                raise DataError(f"{where}: {path.name} line {number} is not UTF-8: save the file as UTF-8") from None
            row = json_line(line, number, path.name, where)
            if row is not None:
                yield place, row


def pretrain_converter(ds, tokenizer, sequence_len: int, counts: StreamCounts) -> Convert:
    """`type: pretrain`: a row's text (`text_column`) as pieces of `sequence_len` tokens. A piece's first token is
    only context (nothing before it in the piece predicts it), so each piece starts with the last token of the one
    before: every token of the text but its first is a target exactly once. The texts of a run of rows are tokenised
    in one call (a fast tokenizer encodes the batch on several threads where TOKENIZERS_PARALLELISM allows it; rlft's
    command sets it false unless it is set)."""
    column = getattr(ds, "text_column", None) or ds.field  # a datasets: entry names its text column `field`
    end = tokenizer.eos_token_id

    def text(place: str, row: dict) -> str:
        found = row.get(column)
        if not isinstance(found, str):
            known = ", ".join(sorted(row)) or "none"
            raise RowError(f"{place}: no text in column {column!r} (the row's columns: {known}); set text_column")
        return found

    def pieces(ids: list[int]) -> list[dict[str, list[int]]]:
        ids = list(ids)
        if end is not None and (not ids or ids[-1] != end):
            ids.append(end)
        cut = [ids[start : start + sequence_len] for start in range(0, len(ids) - 1, sequence_len - 1)]
        counts.pieces += len(cut)
        # the first label is no target here, not only where collate drops a document's first: a packed row that
        # pretrain_multipack_attn: false makes one document keeps it
        return [{"input_ids": piece, "labels": [IGNORE] + piece[1:]} for piece in cut]

    def convert(rows: list[tuple[str, dict]]) -> list[list[dict[str, list[int]]]]:
        texts = [text(place, row) for place, row in rows]
        return [pieces(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]] if texts else []

    return convert


def sft_converter(ds, index: int, cfg, tokenizer, counts: StreamCounts, where: str) -> Convert:
    """A `datasets:` entry's rows through SFT's own format, tokenisation and length rules (`rlft.data.prepare`)."""
    steps = sft_steps(cfg)
    to_record = steps.resolve(ds, cfg, index, where, tokenizer)

    def one(place: str, row: dict) -> list[dict[str, list[int]]]:
        try:
            example, outcome = steps.fit(steps.tokenize(to_record(row), tokenizer, ds), cfg)
        except RowError as exc:
            raise RowError(f"{place}: {exc}") from None
        counts.truncated += outcome == "truncated"
        counts.too_long += outcome == "too_long"
        return [example] if example is not None else []

    return lambda rows: [one(place, row) for place, row in rows]  # chat templates and masks: a row at a time


def sources_for(cfg, tokenizer, counts: StreamCounts) -> list[StreamSource]:
    """The streamed entries of a config: its `pretraining_dataset`, or its `datasets` with `streaming: true`."""
    entries = [("pretraining_dataset", cfg.pretraining_dataset[0])] if cfg.pretraining_dataset else \
        [("datasets", ds) for ds in cfg.datasets]
    sources = []
    for index, (key, ds) in enumerate(entries):
        where = f"{key}[{index}] ({ds.path or ds.data_files})"
        convert = pretrain_converter(ds, tokenizer, cfg.sequence_len, counts) if ds.type == "pretrain" else \
            sft_converter(ds, index, cfg, tokenizer, counts, where)
        sources.append(StreamSource(ds, where, convert))
    return sources


def check_sources(cfg, tokenizer) -> None:
    """Read and convert the first row of each streamed dataset, so that a wrong path, format or column stops the run
    before the model loads."""
    for source in sources_for(cfg, tokenizer, StreamCounts()):
        first = next(_read(source.ds, source.split, source.where), None)  # not past `skip`: read again when training
        if first is None:
            raise DataError(f"{source.where}: no rows to stream")
        try:
            source.convert([first])
        except RowError as exc:
            raise DataError(f"{source.where}, {exc}") from None


def prepare_streamed_sft_data(cfg, tokenizer) -> PreparedData:
    """A streamed run's data before training: its test_datasets (the training rows are read as it goes; the first
    of each dataset is read here, as a check)."""
    check_sources(cfg, tokenizer)  # a wrong path, format or column stops here, before the model loads
    reports: list[LengthReport] = []
    return PreparedData(train=[], eval=tokenize_test_datasets(cfg, tokenizer, sft_steps(cfg), reports), reports=reports)


def stream_settings(cfg, tokenizer) -> dict[str, Any]:
    """What decides a stream's micro-batches (not the process count or accumulation): a checkpoint keeps it, and a
    resume with other values says so."""
    entries = [cfg.pretraining_dataset[0]] if cfg.pretraining_dataset else list(cfg.datasets)
    keys = ("seed", "streaming_multipack_buffer_size", "micro_batch_size", "sequence_len", "sample_packing",
            "pretrain_multipack_attn", "shuffle_merged_datasets", "excess_length_strategy", "train_on_inputs",
            "chat_template", "chat_template_jinja", "eot_tokens")
    return {"datasets": [ds.model_dump(mode="json", exclude_defaults=True) for ds in entries],
            "tokenizer": tokenizer_fingerprint(tokenizer), **{key: getattr(cfg, key) for key in keys}}


def interleaved(sources: list[StreamSource]) -> Iterator[tuple[StreamSource, str, dict]]:
    """One row of each source in turn; a source that ends drops out."""
    iterators = [(source, source.rows()) for source in sources]
    while iterators:
        alive = []
        for source, rows in iterators:
            row = next(rows, None)
            if row is not None:
                alive.append((source, rows))
                yield source, *row
        iterators = alive


def read_rows(rows: Iterator[tuple[StreamSource, str, dict]], counts: StreamCounts) -> tuple[int, list[dict]]:
    """(rows read, the examples they became, in the rows' order), counted in `counts`; each source converts its rows
    in one call; a bad row stops the run, named by its place."""
    taken = list(rows)
    found: list[list[dict]] = [[] for _ in taken]
    for source in dict.fromkeys(source for source, _, _ in taken):
        indices = [i for i, (owner, _, _) in enumerate(taken) if owner is source]
        try:
            converted = source.convert([taken[i][1:] for i in indices])
        except RowError as exc:
            raise DataError(f"{source.where}, {exc}") from None
        for i, examples in zip(indices, converted):
            found[i] = examples
    counts.rows += len(taken)
    counts.kept += sum(bool(examples) for examples in found)
    counts.dropped += sum(not examples for examples in found)
    return len(taken), [example for examples in found for example in examples]


def preview(cfg, tokenizer) -> tuple[list[dict], str]:
    """`rlft preprocess` of a streamed config: the examples of its first buffer of rows, and a line on them."""
    counts = StreamCounts()
    rows, examples = read_rows(itertools.islice(interleaved(sources_for(cfg, tokenizer, counts)),
                                                cfg.streaming_multipack_buffer_size), counts)
    pieces = f", cut into {counts.pieces} pieces of at most sequence_len tokens" if counts.pieces else ""
    return examples, (f"streamed data, its first {rows} rows (streaming_multipack_buffer_size): {counts.kept} kept{pieces}, "
                      f"{counts.dropped} dropped, {counts.truncated} truncated; `rlft train` reads the rest as it trains")


class StreamedBatches:
    """The global sequence of micro-batches of a stream, and this process's share of each step."""

    def __init__(self, cfg, tokenizer, collate: Callable[[list[Any]], dict[str, Any]], shard: tuple[int, int] = (0, 1)):
        self.counts = StreamCounts()
        self.sources = sources_for(cfg, tokenizer, self.counts)
        self.collate, (self.rank, self.world) = collate, shard
        self.buffer_rows, self.micro_batch_size, self.seed = cfg.streaming_multipack_buffer_size, cfg.micro_batch_size, cfg.seed
        self.sequence_len = cfg.sequence_len
        self.capacity = cfg.sequence_len if cfg.sample_packing else None
        self.attend_across = bool(cfg.pretraining_dataset) and not cfg.pretrain_multipack_attn
        self.shuffle = cfg.shuffle_merged_datasets
        self.position = StreamPosition()
        self.settings, self._messages = stream_settings(cfg, tokenizer), []
        self._rows: Iterator | None = None  # the open stream, at `position.rows + rows in the buffer`
        self._buffer: list[list[Any]] | None = None  # the current buffer's micro-batches (items, not yet collated)
        self._buffer_read = 0  # the rows the current buffer was made from

    def step(self, micro_batches: int) -> list[dict[str, Any]]:
        """This process's `micro_batches` of the next step: of the next `micro_batches x processes` global ones, the
        k-th goes to process k mod N."""
        mine = []
        for k in range(micro_batches * self.world):
            items = self._next_items()
            if k % self.world == self.rank:
                mine.append(items)
        return [self.collate(items) for items in mine]

    def _next_items(self) -> list[Any]:
        while self._buffer is None or self.position.taken >= len(self._buffer):
            if self._buffer is not None:  # the buffer is used up: the next one
                self.position.rows += self._buffer_read
                self.position.taken = 0
            self._fill()
        self.position.taken += 1
        return self._buffer[self.position.taken - 1]

    def _fill(self) -> None:
        """Read and batch the buffer at `position` (after a resume, its rows are read again and the same micro-batches
        made). An epoch's end opens the stream again; an epoch without a single trained row stops the run."""
        ends = 0
        while True:
            if self._rows is None:
                self._rows = itertools.islice(interleaved(self.sources), self.position.rows, None)
            read, examples = read_rows(itertools.islice(self._rows, self.buffer_rows), self.counts)
            if examples:
                break
            if read:  # a whole buffer of rows that train nothing: on to the next one
                self.position.rows += read
                continue
            ends += 1
            if ends == 2:  # a whole pass over the stream without a trained row
                raise DataError(f"the streamed data gave no training rows: {self.counts.rows} rows read, "
                                f"{self.counts.dropped} dropped{self._why_dropped()}")
            self.position = StreamPosition(self.position.epoch + 1)  # the stream's end: the next epoch from its start
            self._rows = None
        self._buffer_read = read
        items: list[Any] = examples
        if self.capacity:
            items = [[examples[i] for i in pack] for pack in pack_examples(examples, self.capacity)]
            if self.attend_across:  # pretrain_multipack_attn: false: a pack is one document, attending across its texts
                items = [[{key: sum((e[key] for e in p), []) for key in ("input_ids", "labels")}] for p in items]
        if self.shuffle:
            random.Random(f"{self.seed}/{self.position.epoch}/{self.position.rows}").shuffle(items)
        size = self.micro_batch_size
        self._buffer = [items[start : start + size] for start in range(0, len(items), size)]

    def describe(self) -> str:
        """The plan's line."""
        how = [f"{self.buffer_rows} rows read at a time"]
        if self.capacity:
            how.append(f"packed into rows of {self.capacity} tokens" + (", texts attending across (pretrain_multipack_attn: "
                                                                          "false)" if self.attend_across else ""))
        if self.shuffle:
            how.append("shuffled within each buffer")
        if self.world > 1:
            how.append(f"each of the {self.world} processes reads every row and trains its share")
        return f"streamed from {', '.join(source.where for source in self.sources)}: {', '.join(how)}"

    def warnings(self) -> list[str]:
        """The summary's line on rows dropped."""
        if not self.counts.dropped:
            return []
        return [f"streamed data: {self.counts.dropped} of the {self.counts.rows} rows read were dropped{self._why_dropped()}"]

    def _why_dropped(self) -> str:
        long, dropped = self.counts.too_long, self.counts.dropped
        parts = [f"{long} longer than sequence_len={self.sequence_len} (excess_length_strategy: drop; raise sequence_len or "
                 "set truncate)"] if long else []
        parts += [f"{dropped - long} without a trained token (empty texts, or check the format)"] if dropped > long else []
        return f" ({'; '.join(parts)})" if parts else ""

    @property
    def epochs_done(self) -> float:
        return float(self.position.epoch)

    def messages(self) -> list[str]:
        messages, self._messages = self._messages, []
        return messages

    def state_dict(self) -> dict[str, Any]:
        return {"position": asdict(self.position), "counts": asdict(self.counts), "settings": self.settings}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = StreamPosition(**state.get("position", {}))
        for key, value in state.get("counts", {}).items():
            setattr(self.counts, key, value)
        self._rows, self._buffer = None, None
        written = state.get("settings", {})
        changed = sorted(key for key in self.settings if written.get(key) != self.settings[key])
        taken = self.position.taken
        if changed:
            self._messages.append(
                f"the streamed data's settings changed since the checkpoint ({', '.join(changed)}): the stream goes on "
                f"from row {self.position.rows} of epoch {self.position.epoch}" + (
                    ", the start of the buffer it was in, whose micro-batches are made anew: rows of it that had trained "
                    "may train again" if taken else ""))
        if taken:  # the buffer the run was in, its micro-batches as they were unless the settings changed
            counts = asdict(self.counts)  # its rows were counted when it was first read
            self._fill()
            self.position.taken = 0 if changed else taken
            for key, value in counts.items():  # the converters hold this object
                setattr(self.counts, key, value)


class StreamPlan:
    """The loop's view of a stream, which has no epoch length: the run's `max_steps` stand for one epoch (for
    `saves_per_epoch`, `evals_per_epoch` and the warm-up's step count)."""

    def __init__(self, micro_batches_per_process: int):
        self.micro_batches = micro_batches_per_process

    def __len__(self) -> int:
        return self.micro_batches
