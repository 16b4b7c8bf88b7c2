"""The project's texts say what is true now: no diary of rounds, sessions or issues, no dated history, no citations of
files outside the repository, and a README a newcomer can read (short, narrow tables, links that resolve).

README.md, bench/README.md and every docs/*.md page are held to every rule; phrases removed from docs/ because they
contradicted the code (`REMOVED_FROM_DOCS`) must not come back.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
BENCH_README = REPO / "bench" / "README.md"
STRICT = [README, BENCH_README] + sorted((REPO / "docs").glob("*.md"))
# the topic pages a newcomer looks for, each a page of its own
TOPICS = ["getting-started.md", "config.md", "sft.md", "preference.md", "grpo.md", "rollout-server.md", "environments.md",
          "ebft.md", "distributed.md", "checkpoints.md", "training.md", "troubleshooting.md", "architecture.md",
          "cosmos-rl.md"]

ORDINALS = r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|\d+(?:st|nd|rd|th)"
FORBIDDEN = {
    "a numbered round or session of work": re.compile(
        rf"\b(?:{ORDINALS})\s+(?:rounds?|sessions?)\b|\b(?:rounds?|sessions?)\s+\d+\b", re.IGNORECASE),
    "an issue number": re.compile(r"\bissues?\s+#?\d+|(?<![\w&/#])#\d+\b", re.IGNORECASE),
    "dated history": re.compile(r"\buntil\s+20\d\d-", re.IGNORECASE),
    "history words": re.compile(r"\bpreviously\b|\bno longer\b|\bbefore this change\b", re.IGNORECASE),
    "a citation of a file outside the repository": re.compile(r"\bspec/|§"),
}

# Phrases removed from docs/ because they contradicted the code; they must not come back.
REMOVED_FROM_DOCS = {
    "grpo.md": [r"vLLM, the rollout server and asynchronous rollouts are not built",
                r"bench/README\.md#[\w-]*session"],
    "troubleshooting.md": [r"NCCL weight sync, DeepSpeed and context parallelism are not built",
                           r"the reasoning parsers and multi-turn NeMo Gym \(\[environments\.md\]\(environments\.md\)\) are not built"],
    "ebft.md": [r"^\* DeepSpeed\. Several processes run with DDP or FSDP2", r"bench/README\.md#[\w-]*2026-11-28"],
    "preference.md": [r"TRL's `use_weighting` cap it", r"until 2026-11-28 rlft did not cap"],
}


def prose(text: str) -> str:
    """The text without what may hold '#123' or dates legitimately: fenced code, code spans, URLs and link targets."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"\]\([^)\s]*\)", "]", text)
    return re.sub(r"https?://\S+", "", text)


def table_cells(text: str) -> list[str]:
    cells = []
    for line in text.splitlines():
        if line.startswith("|"):
            cells += [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
    return cells


def test_readme_is_short_with_narrow_tables_and_lines():
    text = README.read_text()
    assert len(text.splitlines()) < 250
    wide = [cell[:80] for cell in table_cells(text) if len(cell) > 200]
    assert not wide, f"README.md table cells over 200 characters: {wide}"
    long_lines = [n for n, line in enumerate(text.splitlines(), 1) if len(line) > 400]
    assert not long_lines, f"README.md lines over 400 characters: {long_lines}"


@pytest.mark.parametrize("path", STRICT, ids=lambda p: str(p.relative_to(REPO)))
def test_texts_say_what_is_true_now(path):
    text = prose(path.read_text())
    found = {why: sorted(set(m.group(0) for m in pattern.finditer(text))) for why, pattern in FORBIDDEN.items()}
    found = {why: hits for why, hits in found.items() if hits}
    assert not found, f"{path.relative_to(REPO)}: {found}"


@pytest.mark.parametrize("name", sorted(REMOVED_FROM_DOCS))
def test_docs_keep_out_the_removed_phrases(name):
    text = re.sub(r"[ \t]*\n[ \t]*(?!\*)", " ", (REPO / "docs" / name).read_text())  # one line per paragraph or item
    back = [phrase for phrase in REMOVED_FROM_DOCS[name] if re.search(phrase, text, re.MULTILINE)]
    assert not back, f"docs/{name}: {back}"


def test_docs_exist_as_named():
    for name in set(REMOVED_FROM_DOCS) | set(TOPICS):
        assert (REPO / "docs" / name).is_file(), name


def test_readme_relative_links_resolve():
    text = re.sub(r"^```.*?^```", "", README.read_text(), flags=re.MULTILINE | re.DOTALL)
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (REPO / target.split("#", 1)[0]).exists():
            missing.append(target)
    assert not missing, f"README.md links to files that do not exist: {missing}"
