"""Fetch the real tokenizer files the mask tests use, from the package registry (no model hub).

  gpt2.tiktoken         GPT-2's byte-level BPE ranks, in the `openai-whisper` sdist (MIT)
  tokenizer.model       the Llama/Mistral SentencePiece model (`tokenizer.model.v1` in the
                        `mistral-common` wheel, Apache-2.0)
  mistral-common-v7/    mistral-common's own files, as `tokenizer_use_mistral_common` loads them: the
  mistral-common-tekken/  v7 SentencePiece instruct model and the v3 tekken file of 2024-09-11, same wheel

Run by `make test` (through `make tokenizers`) once; the files land in tests/.tokenizers/.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

TARGET = Path(__file__).resolve().parent.parent / ".tokenizers"
WHISPER = "openai-whisper==20250625"
MISTRAL_COMMON = "mistral-common==1.13.1"


def download(spec: str, folder: Path, sdist: bool) -> Path:
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(folder), spec]
    if sdist:
        command[5:5] = ["--no-binary", ":all:"]
    subprocess.run(command, check=True, timeout=600)
    name = spec.split("==")[0].replace("-", "_")
    return next(path for path in folder.iterdir() if path.name.lower().startswith(name))


def main() -> None:
    TARGET.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with tarfile.open(download(WHISPER, folder, sdist=True)) as archive:
            member = next(m for m in archive.getmembers() if m.name.endswith("whisper/assets/gpt2.tiktoken"))
            (TARGET / "gpt2.tiktoken").write_bytes(archive.extractfile(member).read())
        with zipfile.ZipFile(download(MISTRAL_COMMON, folder, sdist=False)) as wheel:
            (TARGET / "mistral").mkdir(exist_ok=True)
            (TARGET / "mistral" / "tokenizer.model").write_bytes(wheel.read("mistral_common/data/tokenizer.model.v1"))
            for folder_name, member, name in (("mistral-common-v7", "mistral_instruct_tokenizer_241114.model.v7", "tokenizer.model.v7"),
                                              ("mistral-common-tekken", "tekken_240911.json", "tekken.json")):
                (TARGET / folder_name).mkdir(exist_ok=True)
                (TARGET / folder_name / name).write_bytes(wheel.read(f"mistral_common/data/{member}"))
    print(f"real tokenizer files in {TARGET}")


if __name__ == "__main__":
    main()
