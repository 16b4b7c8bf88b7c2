"""Shared fixtures: offline environment, a tiny model folder, addition data, config files, the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["TRANSFORMERS_VERBOSITY"] = "error"
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs several test processes on the machine's two cores: one torch thread in each, and in every process a test
    # starts (they inherit it), or OpenMP's spinning threads of one stall the other's
    os.environ["OMP_NUM_THREADS"] = "1"

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """An XS Llama folder (config + byte tokenizer, no weights): train it with random_init."""
    from rlft.models.tiny import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-xs", "XS", max_positions=128)


@pytest.fixture(scope="session")
def tiny_moe_dir(tmp_path_factory) -> Path:
    """A tiny Mixtral folder (config + byte tokenizer, no weights; 4 experts, 2 per token): train it with random_init.
    transformers 5 holds each layer's experts as one 3D tensor per projection."""
    from transformers import MixtralConfig

    from rlft.data.tokenizer import byte_tokenizer

    folder = tmp_path_factory.mktemp("models") / "tiny-moe"
    tokenizer = byte_tokenizer()
    MixtralConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=tokenizer.eos_token_id, bos_token_id=None, router_aux_loss_coef=0.02).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def two_revisions(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """A local Hugging Face cache holding someorg/tiny at main (2 layers) and at tag v2 (1 layer, a chat template of its
    own, token 5 as a second end of answer in its generation config), as `hf download` leaves it: a snapshot folder per
    commit, and refs naming the commit of each revision."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from rlft.models.tiny import write_tiny_model

    repo = tmp_path / "hub" / "models--someorg--tiny"
    main, v2 = repo / "snapshots" / ("a" * 40), repo / "snapshots" / ("b" * 40)
    write_tiny_model(main, "XS", max_positions=64)
    write_tiny_model(v2, "XS", max_positions=64)
    config = json.loads((v2 / "config.json").read_text())
    (v2 / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    for snapshot in (main, v2):  # seeded weights, so that base_model loads without random_init
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(snapshot)).save_pretrained(snapshot)
    tokenizer = AutoTokenizer.from_pretrained(v2)
    tokenizer.chat_template = "{{ 'revision v2' }}"
    tokenizer.save_pretrained(v2)
    GenerationConfig(eos_token_id=[tokenizer.eos_token_id, 5]).save_pretrained(v2)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(main.name)
    (repo / "refs" / "v2").write_text(v2.name)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    return main, v2


@pytest.fixture(scope="session")
def addition_files(tmp_path_factory) -> dict[str, Path]:
    from rlft.tasks.addition import split_rows, write_jsonl

    folder = tmp_path_factory.mktemp("addition")
    train, held_out = split_rows()
    write_jsonl(train, folder / "train.jsonl")
    write_jsonl(held_out[:64], folder / "heldout.jsonl")
    return {"train": folder / "train.jsonl", "heldout": folder / "heldout.jsonl"}


@pytest.fixture
def make_config(tmp_path, tiny_model_dir, addition_files):
    """Write a small SFT config (overridable) to tmp_path and return its path."""

    def make(**overrides) -> Path:
        config = {
            "base_model": str(tiny_model_dir),
            "random_init": True,
            "datasets": [{"path": str(addition_files["train"])}],
            "sequence_len": 32,
            "micro_batch_size": 16,
            "max_steps": 6,
            "learning_rate": 3e-3,
            "lr_scheduler": "cosine",
            "warmup_steps": 1,
            "logging_steps": 1,
            "seed": 3,
            "output_dir": str(tmp_path / "out"),
        }
        config.update(overrides)
        path = tmp_path / f"config-{len(list(tmp_path.glob('config-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    return make


@pytest.fixture
def cli():
    """Run `rlft ...` in-process through the real entry point; returns the exit code."""
    from rlft.cli import main

    return lambda *args: main([str(a) for a in args])


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory, tiny_model_dir, addition_files):
    """An XS model after a short SFT on addition: it half-knows the sums, so preferences can move it. Trained once
    per test session: under `make test` the first test process to need it trains it, the others wait and read it."""
    from filelock import FileLock

    from rlft.cli import main

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the folder above every test process's own
    out = shared / "warm-model" / "sft"
    with FileLock(str(shared / "warm-model.lock")):
        if not (out / "model.safetensors").exists():
            _train_warm_model(main, out, tiny_model_dir, addition_files)
    return out


def _train_warm_model(main, out: Path, tiny_model_dir: Path, addition_files) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    config = out.parent / "sft.yaml"
    config.write_text(yaml.safe_dump({
        "base_model": str(tiny_model_dir), "random_init": True, "datasets": [{"path": str(addition_files["train"])}],
        "sequence_len": 32, "micro_batch_size": 64, "max_steps": 150, "learning_rate": 3e-3, "warmup_steps": 10,
        "logging_steps": 50, "seed": 0, "output_dir": str(out),
    }))
    assert main(["train", str(config)]) == 0


# ------------------------------------------------------------------ real tokenizers (files fetched by `make test`)

TOKENIZER_FILES = REPO / "tests" / ".tokenizers"
# GPT-2's pre-tokenizer split (its tokenizer.json regex)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _tokenizer_file(name: str) -> Path:
    path = TOKENIZER_FILES / name
    if not path.exists():
        pytest.fail(f"{path} is missing: `make test` fetches it once (or run `.venv/bin/python tests/assets/fetch_tokenizers.py`)")
    return path


@pytest.fixture(scope="session")
def gpt2_tokenizer():
    """GPT-2's byte-level BPE built from its tiktoken ranks; `<|endoftext|>` is BOS, EOS and padding."""
    import base64

    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class Gpt2Ranks(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(path):  # tiktoken's file format: "base64(token) rank" per line
            lines = Path(path).read_bytes().splitlines()
            return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines if line)}

    core = Gpt2Ranks(vocab_file=str(_tokenizer_file("gpt2.tiktoken")), pattern=GPT2_PATTERN,
                     extra_special_tokens=["<|endoftext|>"]).converted()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")


@pytest.fixture(scope="session")
def mistral_tokenizer():
    """The Llama/Mistral v1 SentencePiece tokenizer (32000 pieces, `<s>` added in front, `</s>` EOS)."""
    from transformers import LlamaTokenizer

    _tokenizer_file("mistral/tokenizer.model")
    return LlamaTokenizer.from_pretrained(str(TOKENIZER_FILES / "mistral"), add_bos_token=True)


@pytest.fixture(scope="session")
def mistral_common_v7():
    """mistral-common's v7 SentencePiece instruct tokenizer (32768 pieces, [SYSTEM_PROMPT] and [INST] control tokens)
    through transformers' MistralCommonBackend, as `tokenizer_use_mistral_common: true` loads it."""
    from rlft.data.mistral_common import load_mistral_tokenizer

    _tokenizer_file("mistral-common-v7/tokenizer.model.v7")
    return load_mistral_tokenizer(str(TOKENIZER_FILES / "mistral-common-v7"))


@pytest.fixture(scope="session")
def mistral_common_tekken():
    """mistral-common's v3 tekken tokenizer (tekken_240911.json, 131072 entries): the system prompt joins the last user turn."""
    from rlft.data.mistral_common import load_mistral_tokenizer

    _tokenizer_file("mistral-common-tekken/tekken.json")
    return load_mistral_tokenizer(str(TOKENIZER_FILES / "mistral-common-tekken"))
