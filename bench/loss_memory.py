"""Peak tensor memory, time and gradient accuracy of rlft's chunked output-layer losses (rlft/losses/linear_ce.py)
against autograd through the (rows, V) logits, on the same hidden states and output layer.

```bash
.venv/bin/python bench/loss_memory.py                     # 4,096 positions, hidden 512, 32,768 entries; bf16 and fp32
.venv/bin/python bench/loss_memory.py --rows 512 --hidden 1024
git show 003f654:src/rlft/losses/linear_ce.py > /tmp/linear_ce_003f654.py
.venv/bin/python bench/loss_memory.py --impl /tmp/linear_ce_003f654.py   # an older version of the module, same cases
```

* **peak**: the most bytes of tensors alive at once during one forward and backward, counted as each operator creates
  its output's storage and freed with it (a dispatch mode; the inputs, created before, are not counted, their
  gradients are). This is what a GPU's caching allocator reports as allocated, up to its block rounding, and is the
  same on every device, so it can be measured on a CPU.
* **error**: |gradient - float64 gradient| / |float64 gradient| for the hidden states and the weight, the float64
  reference being autograd through the logits in float64. "bf16" runs the forward under CPU bf16 autocast over
  float32 tensors, and the backward outside it, as the training loop does.
* **time**: median of `--repeat` forward+backward passes without the counter.
* `--device cuda` runs the same on a GPU (autocast on CUDA, times after `torch.cuda.synchronize()`), and adds
  `torch.cuda.max_memory_allocated` over the pass (`cuda_peak_mib`) next to the counted peak.
* Each loss is weighted per row (random weights), as the preference and policy-gradient losses are: `ce_sum` is
  SFT's summed cross-entropy, `token_nll` the preference methods' per-row NLL, `token_logps` the policy-gradient
  log-probs, `token_logps+entropy` with an entropy bonus (`entropy_coeff`).

Results: a table on stdout and bench/results/loss_memory-<rows>x<hidden>x<vocab>[-<impl>].json.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import platform
import statistics
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from common import RESULTS, device_name, fresh_memory_peak
from rlft.train.metrics import clock  # perf_counter once queued GPU work is done


class LiveTensors(TorchDispatchMode):
    """Bytes of tensor storages created inside the mode and still alive; `peak` is their high-water mark."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = self.peak = 0

    def _freed(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key = id(storage)  # storages keep their Python object while they live: the id is theirs until freed
            if key in self.live or storage.nbytes() == 0:
                continue
            self.live[key] = storage.nbytes()
            self.current += storage.nbytes()
            self.peak = max(self.peak, self.current)
            weakref.finalize(storage, self._freed, key)
        return out


def load_impl(path: Path | None):
    if path is None:
        import rlft.losses.linear_ce as module
        return module
    spec = importlib.util.spec_from_file_location("linear_ce_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cases(impl, targets, weights):
    def plain_logps(h, w):
        logits = F.linear(h, w).float()
        return logits.log_softmax(-1), logits

    def plain(kind):
        def run(h, w):
            logp, _ = plain_logps(h, w)
            picked = logp.gather(-1, targets[:, None]).squeeze(-1)
            if kind == "ce_sum":
                return -picked.sum()
            if kind == "token_logps+entropy":
                entropy = -(logp.exp() * logp).sum(-1)
                return (picked * weights).sum() + 0.01 * entropy.sum()
            return ((-picked if kind == "token_nll" else picked) * weights).sum()
        return run

    fused = {
        "ce_sum": lambda h, w: impl.linear_cross_entropy_sum(h, w, None, targets),
        "token_nll": lambda h, w: (impl.linear_token_nll(h, w, None, targets) * weights).sum(),
        "token_logps": lambda h, w: (impl.linear_token_logps(h, w, None, targets, with_entropy=False)[0] * weights).sum(),
        "token_logps+entropy": lambda h, w: (lambda out: (out[0] * weights).sum() + 0.01 * out[1].sum())(
            impl.linear_token_logps(h, w, None, targets, with_entropy=True, grad_entropy=True)),
    }
    return {kind: (fused[kind], plain(kind)) for kind in fused}


def leaves(hidden, weight):
    return hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()


def pass_once(loss_of, h, w, bf16: bool):
    with torch.autocast(h.device.type, torch.bfloat16, enabled=bf16):
        loss = loss_of(h, w)
    loss.backward()  # outside autocast, as the training loop does
    return h.grad, w.grad


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4096, help="target positions (rows of hidden states)")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--logit-scale", type=float, default=8.0, help="standard deviation of the logits")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--impl", type=Path, default=None, help="a linear_ce.py to measure instead of rlft's")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    impl = load_impl(args.impl)
    g = torch.Generator().manual_seed(0)
    device = torch.device(args.device)
    hidden = torch.randn(args.rows, args.hidden, generator=g).to(device)
    weight = (torch.randn(args.vocab, args.hidden, generator=g) * (args.logit_scale / args.hidden ** 0.5)).to(device)
    targets = torch.randint(0, args.vocab, (args.rows,), generator=g).to(device)
    weights = torch.randn(args.rows, generator=g).to(device)
    cuda = device.type == "cuda"

    rows = []
    for kind, (fused, plain) in cases(impl, targets, weights).items():
        exact = pass_once(plain, *leaves(hidden.double(), weight.double()), bf16=False)
        for precision in ("bf16", "fp32"):
            for label, loss_of in (("rlft", fused), ("logits", plain)):
                bf16 = precision == "bf16"
                counter, inputs = LiveTensors(), leaves(hidden, weight)
                if cuda:
                    fresh_memory_peak()
                    start_bytes = torch.cuda.memory_allocated()
                with counter:
                    grads = pass_once(loss_of, *inputs, bf16)
                cuda_peak = round((torch.cuda.max_memory_allocated() - start_bytes) / 2**20, 1) if cuda else None
                errors = [relative(got, want) for got, want in zip(grads, exact)]
                del grads, inputs
                times = []
                for _ in range(args.repeat):
                    inputs = leaves(hidden, weight)
                    start = clock()
                    pass_once(loss_of, *inputs, bf16)
                    times.append(clock() - start)
                rows.append({"loss": kind, "precision": precision, "path": label, "peak_mib": round(counter.peak / 2**20, 1),
                             "cuda_peak_mib": cuda_peak,
                             "median_s": statistics.median(times), "grad_hidden_error": errors[0], "grad_weight_error": errors[1]})
                r = rows[-1]
                print(f"{kind:20s} {precision} {label:7s} peak {r['peak_mib']:8.1f} MiB  {r['median_s'] * 1e3:8.1f} ms  "
                      f"error hidden {errors[0]:.2e} weight {errors[1]:.2e}", flush=True)

    shape = f"{args.rows}x{args.hidden}x{args.vocab}"
    out = args.out or RESULTS / f"loss_memory-{shape}{'-cuda' if cuda else ''}{'-' + args.impl.stem if args.impl else ''}.json"
    out.write_text(json.dumps({
        "date": datetime.date.today().isoformat(), "machine": device_name() if cuda else platform.processor() or platform.machine(),
        "torch": torch.__version__, "threads": torch.get_num_threads(), "impl": str(args.impl or "rlft.losses.linear_ce"),
        "rows": args.rows, "hidden": args.hidden, "vocab": args.vocab, "logit_scale": args.logit_scale,
        "weight_mib_fp32": args.vocab * args.hidden * 4 / 2**20, "results": rows,
    }, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
