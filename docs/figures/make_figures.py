"""Draw the pictures of the docs from the repository's own data.

    .venv/bin/python docs/figures/make_figures.py          # all three; needs matplotlib (pip install matplotlib)

* architecture.svg: the layers of src/rlft, bottom to top, with the files and lines of each (counted now), and the
  path of one GRPO step through them.
* async-timeline.svg: one trainer step, synchronous and asynchronous, drawn to scale from the median phase times that
  bench/async_grpo.py measured (bench/results/async_grpo-S.json).
* example-curves.svg: the held-out curves of the examples, from docs/example-results.json (docs/example_results.py).

The SVGs are written without dates or random ids, so a re-run with unchanged data changes no byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
plt.rcParams.update({"svg.hashsalt": "rlft", "svg.fonttype": "none", "font.size": 9})

LAYERS = [  # bottom to top, as tests/unit/test_layers.py orders them
    (("errors", "usercode", "heap", "phase_ranges"), "error classes, loading a user's module.fn, GC pauses, phase ranges"),
    (("config",), "YAML front end, schema, rules, method table, resolved settings"),
    (("losses",), "pure tensor functions: SFT, preference, policy, advantages, EBFT"),
    (("data",), "rows, formats, tokenizers, chat templates, collation, packing"),
    (("models",), "policy/reference/reward loading, adapters, log-probs, compile"),
    (("tasks",), "built-in tasks and their scorers"),
    (("rollout",), "engines, rollout server and client, rewards, producer, NeMo Gym"),
    (("train",), "Trainer, one recipe per method, checkpoints, metrics, weight sync"),
    (("quickstart",), "the offline demo"),
    (("cli",), "parser, one module per command, exit codes and signals"),
]
GRPO_PATH = [("cli", "rlft train"), ("config", "resolve(cfg) -> Settings"), ("train", "Trainer.step, GRPORecipe"),
             ("rollout", "producer: sample, score"), ("losses", "advantages, policy_loss"), ("train", "optimizer, weight sync")]


def save(fig, name: str) -> None:
    fig.savefig(OUT / name, metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {(OUT / name).relative_to(ROOT)}")


def size_of(names: tuple[str, ...]) -> tuple[int, int]:
    files = []
    for name in names:
        package = ROOT / "src" / "rlft" / name
        files += sorted(package.rglob("*.py")) if package.is_dir() else [package.with_suffix(".py")]
    return len(files), sum(len(path.read_text().splitlines()) for path in files)


def architecture() -> None:
    fig, ax = plt.subplots(figsize=(9, 6.2))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.6, len(LAYERS))
    ax.axis("off")
    rows = {}
    for row, (names, role) in enumerate(LAYERS):
        files, lines = size_of(names)
        ax.add_patch(FancyBboxPatch((0.1, row + 0.12), 6.2, 0.76, boxstyle="round,pad=0.02", fc="#e8eef7", ec="#4a6a9a"))
        ax.text(0.3, row + 0.62, " · ".join(names), weight="bold", va="center")
        ax.text(0.3, row + 0.33, role, va="center", fontsize=8, color="#333")
        ax.text(6.15, row + 0.62, f"{files} files, {lines:,} lines", va="center", ha="right", fontsize=7.5, color="#555")
        for name in names:
            rows[name] = row
    ax.annotate("", xy=(0.05, len(LAYERS) - 0.1), xytext=(0.05, 0.1), arrowprops={"arrowstyle": "<-", "color": "#999"})
    ax.text(0.1, -0.35, "imports only go down: a layer uses those below it (checked by tests/unit/test_layers.py)",
            fontsize=8, color="#555")
    ax.text(6.6, len(LAYERS) - 0.05, "one GRPO step", weight="bold", color="#d9822b")
    labels: dict[int, list[str]] = {}
    for i, (name, what) in enumerate(GRPO_PATH, 1):
        labels.setdefault(rows[name], []).append(f"{i}. {what}")
    for row, texts in labels.items():
        ax.plot([6.3, 6.55], [row + 0.5, row + 0.5], color="#d9822b", lw=1)
        ax.text(6.6, row + 0.5, "\n".join(texts), va="center", fontsize=8, color="#333")
    save(fig, "architecture.svg")


def async_timeline() -> None:
    runs = json.loads((ROOT / "bench" / "results" / "async_grpo-S.json").read_text())["runs"]
    sync, overlap = runs["sync"], runs["async"]
    fig, ax = plt.subplots(figsize=(9, 2.9))
    colours = {"generate": "#6a9fd4", "train": "#d9822b", "wait": "#bbbbbb", "weights": "#7bb274"}
    ms = 1000.0

    def bar(lane: float, start: float, length: float, kind: str, label: str = "") -> float:
        ax.broken_barh([(start * ms, length * ms)], (lane - 0.32, 0.64), fc=colours[kind], ec="white", lw=0.8)
        if label and length * ms > 14:
            ax.text((start + length / 2) * ms, lane, label, ha="center", va="center", fontsize=7)
        return start + length

    steps = 4
    gen, fb = sync["median_generate_s"], sync["median_forward_backward_s"] + sync["median_optimizer_s"]
    t = 0.0
    for k in range(steps):  # synchronous: generate, then train, one after the other
        t = bar(3, t, gen, "generate", f"gen {k}")
        t = bar(3, t, fb, "train", f"train {k}")
    gen_a = overlap["median_generate_s"]
    fb_a = overlap["median_forward_backward_s"] + overlap["median_optimizer_s"]
    load, step_a = overlap["median_weight_load_s"], overlap["median_step_s"]
    engine = bar(1.9, 0.0, gen_a, "generate", "gen 0")
    trainer = engine
    for k in range(steps):  # asynchronous: the server generates batch k+1 while the trainer trains on batch k
        if k + 1 < steps + 1:
            engine = bar(1.9, max(engine, trainer - gen_a if k else engine), gen_a, "generate", f"gen {k + 1}")
        start = trainer
        trainer = bar(1.0, start, fb_a, "train", f"train {k}")
        if k % 2 == 1:  # weights pushed every second step (sync_interval 2)
            bar(1.9, max(engine, trainer), load, "weights")
            engine = max(engine, trainer) + load
        trainer = max(trainer, start + step_a)
    ax.set_yticks([3, 1.9, 1.0], ["synchronous\n(one process)", "async: rollout\nserver", "async: trainer"])
    ax.set_xlabel("milliseconds (median phase times of bench/async_grpo.py, size S, on the machine in bench/README.md)")
    ax.set_ylim(0.4, 3.6)
    ax.spines[["top", "right", "left"]].set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, fc=c) for c in colours.values()]
    ax.legend(handles, ["generate a batch", "train on a batch", "wait", "load new weights"], ncols=4, fontsize=7,
              loc="upper right", bbox_to_anchor=(1, 1.18), frameon=False)
    save(fig, "async-timeline.svg")


PANELS = [  # title, metric, how it is drawn (as logged, minus its step-0 value, or divided by it), examples
    ("Online RL: held-out reward gain over step 0", "eval/reward", "minus", ["grpo", "gdpo", "dapo", "gspo", "dr-grpo", "rloo"]),
    ("Preference: held-out loss / its step-0 value", "eval/loss", "divided", ["dpo", "dpo-lora", "ipo", "kto", "orpo", "simpo"]),
    ("Reward model: held-out pair accuracy", "eval/accuracy", "as logged", ["reward-model"]),
    ("EBFT: held-out cross-entropy / its step-0 value", "eval/ce_loss", "divided", ["ebft-structured", "ebft-strided"]),
]


def example_curves() -> None:
    results = json.loads((ROOT / "docs" / "example-results.json").read_text())
    fig, axes = plt.subplots(2, 2, figsize=(9, 6))
    for ax, (title, key, drawn, names) in zip(axes.flat, PANELS):
        for name in names:
            points = sorted((int(step), values[key]) for step, values in results[name].items() if key in values)
            first = points[0][1]
            ys = {"minus": [y - first for _, y in points], "divided": [y / first for _, y in points]}.get(drawn, [y for _, y in points])
            ax.plot([x for x, _ in points], ys, marker="o", ms=3, label=name)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.legend(fontsize=7, frameon=False)
        ax.grid(alpha=0.3)
    fig.suptitle(f"examples/ on a 2-core CPU; quickstart accuracy {results['quickstart']['before']:.2f} -> "
                 f"{results['quickstart']['after']:.2f} (docs/example_results.py)", fontsize=9)
    fig.tight_layout()
    save(fig, "example-curves.svg")


if __name__ == "__main__":
    architecture()
    async_timeline()
    example_curves()
