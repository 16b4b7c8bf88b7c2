"""Cosmos-RL's shared-prefix filter (`trl.min_filter_prefix_tokens`): completions of one group that begin with the same
tokens and score differently push those tokens up through one completion and down through another, so the filter
takes the shared tokens out of their loss.

Within a group, a *maximal shared prefix* is a token sequence that two or more completions begin with (all the
completions that begin with it share it), no two of which share a longer one: in a trie of the group's completions,
a node that two or more completions pass or end at, none of whose children two or more pass. One of at least
`min_tokens` tokens whose completions' rewards differ leaves the loss mask of each of them, except of a completion
that is the prefix itself (give or take its end token), which would have nothing left to train on. As in Cosmos-RL,
only the deepest shared prefixes count: with completions [1 2 3 4], [1 2 3 5] and [1 2 6], the first two lose
[1 2 3] and the third keeps [1 2].
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def maximal_prefixes(completions: list[list[int]], min_tokens: int) -> list[tuple[int, list[int]]]:
    """(prefix length, the completions that share it) of each maximal shared prefix of at least `min_tokens` tokens."""
    found: list[tuple[int, list[int]]] = []
    stack = [(0, list(range(len(completions))))] if len(completions) > 1 else []
    while stack:  # each entry: completions sharing their first `depth` tokens, two or more of them
        depth, members = stack.pop()
        children: dict[int, list[int]] = {}
        for member in members:
            if len(completions[member]) > depth:
                children.setdefault(completions[member][depth], []).append(member)
        deeper = [child for child in children.values() if len(child) > 1]
        if deeper:
            stack.extend((depth + 1, child) for child in deeper)
        elif depth >= min_tokens:
            found.append((depth, members))
    return found


def shared_prefix_lengths(completions: list[list[int]], rewards: list[float], group: int, min_tokens: int,
                          ends: Iterable[int] = ()) -> list[int]:
    """Per row (groups of `group` consecutive rows), how many leading completion tokens leave the loss; `rewards`: each
    row's total reward (NaN = unscorable, equal to another NaN); `ends`: the ids that end a completion. `min_tokens` < 1:
    the filter is off (all 0)."""
    lengths = [0] * len(completions)
    if min_tokens < 1:
        return lengths
    ends = set(ends)
    for start in range(0, len(completions), group):
        rows = list(range(start, min(start + group, len(completions))))
        for length, members in maximal_prefixes([completions[row] for row in rows], min_tokens):
            if len({None if math.isnan(rewards[rows[m]]) else rewards[rows[m]] for m in members}) < 2:
                continue
            for member in members:
                row = rows[member]
                if _without_end(completions[row], ends) != _without_end(completions[row][:length], ends):
                    lengths[row] = length
    return lengths


def _without_end(ids: list[int], ends: set[int]) -> list[int]:
    return ids[:-1] if ids and ids[-1] in ends else ids
