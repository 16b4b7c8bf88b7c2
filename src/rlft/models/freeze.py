"""`unfrozen_parameters`, Axolotl's selective fine-tuning: only the parameters whose names match one of the patterns
train, the rest are frozen.

The patterns read as Axolotl reads them (`axolotl/utils/freeze.py`): a regular expression matched at the start of
the parameter name (`re.match`: add `$` to match whole names), in which a dot is a literal dot unless a `+` follows
it; a trailing `[start:end]` (or `[i]`, `[:end]`, `[start:]`) trains only those rows (dimension 0) of the matched
parameter: the other rows' gradients are zeroed (where a pattern without a range matches the same parameter too, the
whole parameter trains; Axolotl then trains the ranged rows only). With zero gradients from the first step and no weight decay (which
`rlft train` requires with a row range) the optimizer never moves those rows; Axolotl allows weight decay there,
which shrinks the rows it calls frozen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlft.config.unfrozen import parse_pattern


@dataclass
class Frozen:
    """What `freeze_except` did: the trained parameters (with their row ranges) and the patterns that matched none."""

    trained: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    unmatched: list[str] = field(default_factory=list)


def _zero_rows_outside(ranges: list[tuple[int, int]]):
    def hook(grad: torch.Tensor) -> torch.Tensor:
        kept = torch.zeros(grad.shape[0], dtype=torch.bool, device=grad.device)
        for start, end in ranges:
            kept[start:end] = True
        return grad * kept.view(-1, *[1] * (grad.dim() - 1)).to(grad.dtype)

    return hook


def freeze_except(model: torch.nn.Module, texts: list[str]) -> Frozen:
    """Freeze every parameter of `model` that no pattern matches; a matched parameter with row ranges trains only those
    rows. ValueError when a range lies outside its parameter or nothing at all is left to train."""
    patterns = [parse_pattern(text) for text in texts]
    used: set[str] = set()
    result = Frozen()
    for name, param in model.named_parameters():
        matched = [p for p in patterns if p.regex.match(name)]
        used.update(p.text for p in matched)
        param.requires_grad_(bool(matched))
        if not matched:
            continue
        ranges = [] if any(p.rows is None for p in matched) else [p.rows for p in matched]
        size = param.shape[0] if param.dim() else 1
        spans = []
        for pattern, (start, end) in zip(matched, ranges):
            end = size if end is None else end
            if end > size or start >= end:
                raise ValueError(f"unfrozen_parameters: {pattern.text!r}: {name} has {size} rows, the range is "
                                 f"[{start}:{end}]")
            spans.append((start, end))
        if spans:
            param.register_hook(_zero_rows_outside(spans))
        result.trained[name] = sorted(spans)
    result.unmatched = [p.text for p in patterns if p.text not in used]
    if not result.trained:
        names = [name for name, _ in model.named_parameters()]
        raise ValueError(f"unfrozen_parameters matches no parameter of {type(model).__name__}, so nothing would train. Its "
                         f"parameters are named like {', '.join(names[:2] + names[-2:])} (a dot in a pattern is a literal "
                         "dot, and a pattern matches from the start of the name)")
    return result
