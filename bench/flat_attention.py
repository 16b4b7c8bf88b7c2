"""Padded rows against the same rows flattened (`batch_flattening: true`): forward and backward of one micro-batch.

Three layouts of the same rows through the same model: padded to the longest row; flattened with attention per row
(rlft.models.varlen, SDPA); flattened under the block-diagonal mask (what eager attention, a compiled forward or a model
type that drops the forward's keywords get). Each case draws its row lengths uniformly from a range, so the padding
share differs from case to case. Then `sample_packing`'s layout: documents packed first-fit into rows of 2,048 tokens,
attended per document against under the block-diagonal mask (what every packed batch got before 2026-11-26). The
median of the timed repeats is reported, and the flattened and packed results are checked against the padded ones.

    .venv/bin/python bench/flat_attention.py                 # size S, the default cases, 2 torch threads
    .venv/bin/python bench/flat_attention.py --size M --repeat 5
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.data.collate import documents_mask, flatten_rows, pack_examples, packed_batch, pad_batch
from rlft.models.masks import with_model_mask

RESULTS = Path(__file__).parent / "results"
SIZES = {"S": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
         "M": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)}
CASES = [(32, 8, 11), (8, 32, 128), (8, 100, 200), (16, 64, 256), (16, 20, 200), (8, 64, 640), (8, 50, 200)]  # rows, shortest, longest
PACKED = [(2048, 50, 500), (2048, 100, 1000)]  # row capacity, shortest and longest document


def rows_of(count: int, shortest: int, longest: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(shortest, longest + 1, (count,), generator=g)
    width = int(lengths.max())
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    return torch.randint(1, 260, (count, width), generator=g) * mask, mask


def timed(step, repeat: int) -> float:
    times = []
    for _ in range(repeat + 1):  # the first call warms up
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def packed_case(model, capacity: int, shortest: int, longest: int, args) -> dict:
    """Documents of `shortest`-`longest` tokens packed into two rows of `capacity`: per document against the block
    mask, and the documents' own padded rows as the reference."""
    g = torch.Generator().manual_seed(args.seed)
    documents, packs = [], []
    while len(packs) < 3:  # two full rows (the third holds what did not fit)
        ids = torch.randint(1, 260, (int(torch.randint(shortest, longest + 1, (1,), generator=g)),), generator=g).tolist()
        documents.append({"input_ids": ids, "labels": ids})
        packs = pack_examples(documents, capacity)
    documents = [documents[i] for pack in packs[:2] for i in pack]
    batch = packed_batch([documents[:len(packs[0])], documents[len(packs[0]):]], pad_id=0)
    inputs = {key: batch[key] for key in ("input_ids", "position_ids")}
    filled = torch.tensor([sum(len(documents[i]["input_ids"]) for i in range(len(pack))) for pack in packs[:1]]
                          + [sum(len(doc["input_ids"]) for doc in documents[len(packs[0]):])])
    real = torch.arange(batch["input_ids"].shape[1])[None] < filled[:, None]  # the rows' documents, not their padding
    layouts = {"per_document": lambda: model(**with_model_mask(model, {**inputs, "documents": batch["documents"]})).logits,
               "block_mask": lambda: model(**with_model_mask(model, {**inputs, "attention_mask": documents_mask(
                   batch["documents"], *batch["input_ids"].shape)})).logits}
    with torch.no_grad():
        padded = pad_batch(documents, pad_id=0)
        alone = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]).logits
        expected = torch.cat([alone[row, :len(doc["input_ids"])] for row, doc in enumerate(documents)])
        difference = max(float((layouts[name]()[real] - expected).abs().max()) for name in layouts)
    step_ms = {name: 1e3 * timed(lambda run=run: run().float().sum().backward(), args.repeat) for name, run in layouts.items()}
    case = {"rows": 2, "capacity": capacity, "documents": len(documents), "document_lengths": [shortest, longest],
            "forward_backward_ms": step_ms, "block_mask_over_per_document": step_ms["block_mask"] / step_ms["per_document"],
            "largest_logit_difference": difference}
    print(f"packed: {len(documents)} documents of {shortest}-{longest} tokens in 2 rows of {capacity}: per document "
          f"{step_ms['per_document']:.1f} ms, block mask {step_ms['block_mask']:.1f} ms, "
          f"{case['block_mask_over_per_document']:.2f}x (logits within {difference:.1e})", flush=True)
    return case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="S")
    parser.add_argument("--repeat", type=int, default=11)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=260, max_position_embeddings=1024, attn_implementation="sdpa",
                                         **SIZES[args.size]))
    cases = []
    for count, shortest, longest in CASES:
        ids, mask = rows_of(count, shortest, longest, args.seed)
        real = mask.bool()

        def flat_inputs(block: bool):
            flat = flatten_rows(ids, mask, True)
            inputs = {"input_ids": flat["flat_input_ids"], "position_ids": flat["flat_position_ids"]}
            if block:
                inputs["attention_mask"] = documents_mask(flat["flat_documents"], 1, inputs["input_ids"].shape[1])
            else:
                inputs["documents"] = flat["flat_documents"]
            return with_model_mask(model, inputs)

        layouts = {"padded": lambda: model(input_ids=ids, attention_mask=mask).logits[real],
                   "flat_per_row": lambda: model(**flat_inputs(False)).logits[0],
                   "flat_block_mask": lambda: model(**flat_inputs(True)).logits[0]}
        with torch.no_grad():
            expected = layouts["padded"]()
            difference = max(float((layouts[name]() - expected).abs().max()) for name in ("flat_per_row", "flat_block_mask"))
        step_ms = {name: 1e3 * timed(lambda run=run: run().float().sum().backward(), args.repeat) for name, run in layouts.items()}
        case = {"rows": count, "lengths": [shortest, longest], "width": ids.shape[1],
                "padding": 1 - float(real.sum()) / real.numel(), "forward_backward_ms": step_ms,
                "padded_over_flat_per_row": step_ms["padded"] / step_ms["flat_per_row"],
                "largest_logit_difference": difference}
        cases.append(case)
        print(f"{count:3d} rows of {shortest:3d}-{longest:3d} tokens, {case['padding']:5.1%} padding: padded "
              f"{step_ms['padded']:7.1f} ms, flat per row {step_ms['flat_per_row']:7.1f} ms, flat block mask "
              f"{step_ms['flat_block_mask']:7.1f} ms; padded/per row {case['padded_over_flat_per_row']:.2f}x "
              f"(logits within {difference:.1e})", flush=True)
    packed_cases = []
    for capacity, shortest, longest in PACKED:
        packed_cases.append(packed_case(model, capacity, shortest, longest, args))
    report = {"benchmark": "flat_attention", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "size": args.size, "repeat": args.repeat, "threads": torch.get_num_threads(), "machine": platform.machine(),
              "cpu_count": os.cpu_count(), "load_average_1m": os.getloadavg()[0],
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__}, "cases": cases,
              "packed": packed_cases}
    out = RESULTS / f"flat_attention-{args.size}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
