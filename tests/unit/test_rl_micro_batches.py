"""The GRPO family's micro-batches: packed by a token budget (trl.max_token_len_per_mini_batch) with the same gradient
as fixed micro-batches, the budget's edge cases, Cosmos-RL's balance_dp_token on two fake ranks by hand, and the keys'
config rules. Every hand value is at ratio 1 (old log-probs = the current ones), where each loss token's policy term is
l = -A (no clip acts) and its gradient with respect to the token's log-prob is -A times the token's weight."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.config.settings import resolve
from rlft.losses.policy import policy_loss
from rlft.rollout.scoring import make_scores
from rlft.rollout.types import Rollout
from rlft.train.micro_batches import by_tokens, chunks, split_step


def row(prompt: int, completion: int, advantage: float = 0.0) -> SimpleNamespace:
    """A row with `prompt` prompt tokens and `completion` completion tokens, all of them loss tokens."""
    return SimpleNamespace(prompt_ids=[5] * prompt, completion_ids=[6] * completion, loss_mask=[1] * completion,
                           advantage=advantage)


def length(r) -> int:
    return len(r.prompt_ids) + len(r.completion_ids)


def tokens(r) -> int:
    return sum(r.loss_mask)


# ------------------------------------------------------------------------------------------ packing by tokens


def test_first_fit_packs_in_row_order_and_never_above_the_budget():
    sizes = [3, 2, 1, 2, 4, 1]
    # 3 opens a batch (1 left), 2 opens the next (2 left), 1 fills the first, 2 fills the second, 4 fills one alone,
    # 1 opens the last
    packed = by_tokens(list(range(6)), 4, lambda index: sizes[index])
    assert packed == [[0, 2], [1, 3], [4], [5]]
    assert all(sum(sizes[i] for i in batch) <= 4 for batch in packed)


def test_a_row_longer_than_the_budget_trains_alone_and_the_others_still_pack():
    sizes = [2, 9, 2, 4]
    assert by_tokens(list(range(4)), 4, lambda index: sizes[index]) == [[0, 2], [1], [3]]
    assert by_tokens([], 4, len) == []
    assert by_tokens(["abcd"], 4, len) == [["abcd"]]  # exactly the budget: fits


def test_chunks_without_a_budget_are_micro_batch_size_rows():
    assert chunks(list(range(5)), 2, None, len) == [[0, 1], [2, 3], [4]]


def test_a_step_splits_as_one_process_would():
    """Each process trains its contiguous share of micro_batch_size x accumulation rows, cut as one process would."""
    rows = list(range(16))  # one step of 2 processes x 2 micro-batches x 4 rows

    def fixed(window, rank):
        split = split_step(window, rank, 2, 4, 2, None, len)
        return split.mine, split.padding

    assert fixed(rows, 0) == ([[0, 1, 2, 3], [4, 5, 6, 7]], 0)
    assert fixed(rows, 1) == ([[8, 9, 10, 11], [12, 13, 14, 15]], 0)
    short = list(range(6))  # rows filtered out: rank 1 has none, and runs rank 0's count of padding batches
    assert fixed(short, 0) == ([[0, 1, 2, 3], [4, 5]], 0)
    assert fixed(short, 1) == ([], 2)
    assert fixed([], 0) == ([], 0)


def test_each_process_packs_its_own_share_and_pads_to_the_most_passes():
    """2 processes x 4 rows a step (micro_batch_size 2 x 2 accumulation): rank 0's rows of 4, 4, 4, 4 tokens take 2
    micro-batches of 8, rank 1's of 2, 2, 2, 2 one; rank 1 then runs one padding micro-batch. Without a budget each
    runs micro_batch_size rows at a time."""
    window = [row(2, 2)] * 4 + [row(1, 1)] * 4
    first, second = (split_step(window, rank, 2, 2, 2, 8, length, tokens) for rank in (0, 1))
    assert [len(b) for b in first.mine] == [2, 2] and first.padding == 0
    assert [len(b) for b in second.mine] == [4] and second.padding == 1
    # place 0: 2 rows of 2 loss tokens on rank 0 and 4 rows of 1 on rank 1; place 1: rank 0's second batch alone
    assert first.totals == second.totals == [(6, 8), (2, 4)]
    for rank in (0, 1):
        fixed = split_step(window, rank, 2, 2, 2, None, length)
        start = 4 * rank
        assert (fixed.mine, fixed.padding, fixed.totals) == ([window[start : start + 2], window[start + 2 : start + 4]], 0, [])
    empty = split_step([], 1, 2, 2, 2, 8, length, tokens)  # a skipped step: nothing to run anywhere
    assert (empty.mine, empty.padding, empty.totals) == ([], 0, [])


# ------------------------------------------------------------------------------------------ the same gradient

# four completions after a 2-token prompt: 3, 2, 1 and 2 completion tokens (5, 4, 3, 4 tokens in all)
COMPLETIONS, ADVANTAGES = [3, 2, 1, 2], [1.0, -1.0, 0.5, 2.0]
FIXED, BUDGETED = [[0, 1], [2, 3]], [[0, 2], [1, 3]]  # micro_batch_size 2; a budget of 8 tokens


def step_gradient(split: list[list[int]], loss_type: str) -> tuple[float, list[torch.Tensor]]:
    """The step loss sum(loss_sum) / sum(units) over `split`'s micro-batches (the loop's accumulation), and its
    gradient with respect to each row's log-probs."""
    leaves = [torch.full((n,), -0.5, dtype=torch.float64, requires_grad=True) for n in COMPLETIONS]
    outs = []
    for batch in split:
        width = max(COMPLETIONS[i] for i in batch)
        logps = torch.stack([torch.cat([leaves[i], torch.zeros(width - COMPLETIONS[i], dtype=torch.float64)]) for i in batch])
        mask = torch.tensor([[1.0] * COMPLETIONS[i] + [0.0] * (width - COMPLETIONS[i]) for i in batch], dtype=torch.float64)
        advantages = torch.tensor([ADVANTAGES[i] for i in batch], dtype=torch.float64)
        outs.append(policy_loss(logps, logps.detach(), advantages, mask, loss_type=loss_type, max_completion_length=4))
    loss = sum(out.loss_sum for out in outs) / sum(out.units for out in outs)
    loss.backward()
    return float(loss.detach()), [leaf.grad for leaf in leaves]


def test_the_budget_packs_these_rows_otherwise_than_micro_batch_size():
    assert chunks(list(range(4)), 2, None, len) == FIXED
    assert by_tokens(list(range(4)), 8, lambda i: 2 + COMPLETIONS[i]) == BUDGETED


@pytest.mark.parametrize("loss_type,weight", [
    ("dapo", lambda i: 1 / 8),  # one token mean over the step's 8 loss tokens
    ("cispo", lambda i: 1 / 8),  # -sg(r) A logp: the same gradient at r = 1
    ("grpo", lambda i: 1 / (4 * COMPLETIONS[i])),  # mean over 4 completions of each one's token mean
    ("dr_grpo", lambda i: 1 / (4 * 4)),  # sum / (4 completions x max_completion_length 4)
])
def test_token_budget_micro_batches_give_the_gradient_of_fixed_ones(loss_type, weight):
    fixed_loss, fixed = step_gradient(FIXED, loss_type)
    packed_loss, packed = step_gradient(BUDGETED, loss_type)
    for i, n in enumerate(COMPLETIONS):
        by_hand = torch.full((n,), -ADVANTAGES[i] * weight(i), dtype=torch.float64)
        assert torch.allclose(fixed[i], by_hand, rtol=1e-12, atol=0) and torch.allclose(packed[i], by_hand, rtol=1e-6, atol=0)
    assert packed_loss == pytest.approx(fixed_loss, rel=1e-6)


def test_token_mean_and_bnpo_average_per_micro_batch_so_the_budget_changes_them():
    """What docs/grpo.md#batching says: Cosmos-RL's token-mean (and TRL's bnpo) take a token mean per micro-batch, so a
    different split is a different loss. Fixed: (2 / 4) * (-3 + 2) / 5 + (2 / 4) * (-0.5 - 4) / 3 = -0.85; packed:
    (2 / 4) * (-3 - 0.5) / 4 + (2 / 4) * (2 - 4) / 4 = -0.6875."""
    assert step_gradient(FIXED, "token-mean")[0] == pytest.approx(-0.85, abs=1e-12)
    assert step_gradient(BUDGETED, "token-mean")[0] == pytest.approx(-0.6875, abs=1e-12)


# ------------------------------------------------------------------------------------------ balance_dp_token by hand


def two_ranks() -> list[SimpleNamespace]:
    """A step of 6 rows on 2 ranks (micro_batch_size 3, budget 6 tokens): rank 0 packs [a, b] and [c], rank 1 [d, e]
    and [f]. Loss tokens and advantages: a 1 (+1), b 3 (+1), c 2 (-1); d 1 (-1), e 1 (+0.5), f 4 (+0.5)."""
    return [row(1, 1, 1.0), row(1, 3, 1.0), row(1, 2, -1.0), row(1, 1, -1.0), row(1, 1, 0.5), row(1, 4, 0.5)]


def rank_losses(balance: bool):
    """Each rank's micro-batches through policy_loss; the step loss sum(loss_sum) / sum(units) over both ranks, as the
    loop takes it (DDP's average over ranks and its own x world cancel); and the gradient of every row's log-probs."""
    window = two_ranks()
    outs, leaves = [], []
    for rank in (0, 1):
        split = split_step(window, rank, 2, 3, 1, 6, length, tokens if balance else None)
        assert [len(b) for b in split.mine] == [2, 1] and split.padding == 0
        for place, batch in enumerate(split.mine):
            width = max(len(r.completion_ids) for r in batch)
            mine = [torch.full((len(r.completion_ids),), -0.7, dtype=torch.float64, requires_grad=True) for r in batch]
            leaves += mine
            logps = torch.stack([torch.cat([leaf, torch.zeros(width - len(leaf), dtype=torch.float64)]) for leaf in mine])
            mask = torch.tensor([[1.0] * len(r.loss_mask) + [0.0] * (width - len(r.loss_mask)) for r in batch], dtype=torch.float64)
            advantages = torch.tensor([r.advantage for r in batch], dtype=torch.float64)
            outs.append(policy_loss(logps, logps.detach(), advantages, mask, loss_type="token-mean",
                                    across_ranks=split.totals[place] if balance else None))
    loss = sum(out.loss_sum for out in outs) / sum(out.units for out in outs)
    loss.backward()
    return float(loss.detach()), [leaf.grad for leaf in leaves], split.totals


def test_balance_dp_token_divides_each_place_by_the_tokens_of_both_ranks():
    """Token sums S (of l = -A) and loss tokens T per micro-batch: rank 0 [a, b] S = -4, T = 4; [c] S = 2, T = 2;
    rank 1 [d, e] S = 0.5, T = 2; [f] S = -2, T = 4. Place 0 holds 4 rows and 6 tokens of both ranks, place 1 2 rows
    and 6 tokens.

    balance_dp_token: true: sum_k (rows_k / 6) * (S of place k on both ranks) / T_k
        = (4 / 6) * (-4 + 0.5) / 6 + (2 / 6) * (2 - 2) / 6 = -7/18.
    Cosmos-RL's own form, each rank's loss sum_k (rows of its k-th / its 3 rows) * S / T_k * 2 ranks, averaged over
    ranks by DDP: ((2/3)(-4/6) + (1/3)(2/6) + (2/3)(0.5/6) + (1/3)(-2/6)) = -7/18 too.
    false: each rank's own token mean per micro-batch, weighted by rows: (2 (-4/4) + 1 (2/2) + 2 (0.5/2) + 1 (-2/4)) / 6
        = -1/6 (Cosmos-RL's ((2/3)(-1) + (1/3)(1) + (2/3)(0.25) + (1/3)(-0.5)) / 2 = -1/6)."""
    balanced, gradients, totals = rank_losses(balance=True)
    assert totals == [(4, 6), (2, 6)]
    assert balanced == pytest.approx(-7 / 18, abs=1e-12)
    cosmos = sum(rows / 3 * s / t for rows, s, t in [(2, -4, 6), (1, 2, 6), (2, 0.5, 6), (1, -2, 6)])
    assert balanced == pytest.approx(cosmos, abs=1e-12)
    # a token's gradient: -A * rows_k / (T_k * 6): place 0 4 / 36, place 1 2 / 36
    weights = [4 / 36, 4 / 36, 2 / 36, 4 / 36, 4 / 36, 2 / 36]
    for grad, r, weight in zip(gradients, two_ranks(), weights):
        assert torch.allclose(grad, torch.full_like(grad, -r.advantage * weight), rtol=1e-12, atol=0)
    per_rank, gradients, _ = rank_losses(balance=False)
    assert per_rank == pytest.approx(-1 / 6, abs=1e-12)
    weights = [2 / 24, 2 / 24, 1 / 12, 2 / 12, 2 / 12, 1 / 24]  # rows_k / (T_k * 6) with each rank's own T_k
    for grad, r, weight in zip(gradients, two_ranks(), weights):
        assert torch.allclose(grad, torch.full_like(grad, -r.advantage * weight), rtol=1e-12, atol=0)


def test_across_ranks_belongs_to_token_mean_only():
    logps = torch.zeros(1, 2, requires_grad=True)
    with pytest.raises(ValueError, match="across_ranks balances loss_type 'token-mean'"):
        policy_loss(logps, None, torch.ones(1), torch.ones(1, 2), loss_type="dapo", across_ranks=(1, 2))


# ------------------------------------------------------------------------------------------ the recipe, a real model


class VaryingEngine:
    """Completion j of each prompt has LENGTHS[j] tokens (no stop token: truncated), so rows of one step differ."""

    LENGTHS = (5, 1, 3, 2)

    def generate(self, prompt_ids, params, num_samples=1, seed=None):
        expanded = [p for p in prompt_ids for _ in range(num_samples)]
        completions = [[(p[0] + 3 * t + j) % 50 + 10 for t in range(self.LENGTHS[j % num_samples])]
                       for j, p in enumerate(expanded)]
        return Rollout(expanded, completions, [[-1.0] * len(c) for c in completions], [True] * len(expanded))

    def load_weights(self, weights, version):
        pass

    def health(self):
        return {"ok": True, "version": 0}


class LengthScorer:
    """Reward = the completion's length (varies within every group)."""

    needs_policy = False
    names, weights = ["length"], [1.0]

    def score(self, prompts, rollout, group, extra=None):
        return make_scores(torch.tensor([[float(len(c))] for c in rollout.completion_ids]), self.names, self.weights)

    def close(self):
        pass


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=260, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                                        pad_token_id=256, eos_token_id=259))  # the byte tokenizer's


def recipe_step(tok, model, trl: dict):
    """A GRPO recipe's first step (2 prompts x 4 completions, micro_batch_size 2 x 4 accumulation, 2 passes over the
    batch so the old log-probs are computed and cached): its micro-batches, the gradient the loop would step with, and
    the queued rows."""
    from rlft.config import build_config
    from rlft.train.recipes.grpo import GRPORecipe

    cfg = build_config({"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 2,
                        "gradient_accumulation_steps": 4, "trl": {"num_generations": 4, "reward_funcs": ["r.f"],
                                                                  "max_completion_length": 5, "num_iterations": 2, **trl}})
    prompts = [{"prompt_ids": [first, 7, 9], "prompt": f"p{first}", "columns": {}} for first in (3, 5)]
    recipe = GRPORecipe(cfg, resolve(cfg), SimpleNamespace(train=prompts, eval=[]), tok, LengthScorer(), None,
                        make_engine=lambda policy, version: VaryingEngine())
    recipe.start(model)
    batches = recipe.prepare_step(model)
    rows = [r for window in recipe.queue.windows for r in window]
    model.zero_grad()
    outs = []
    for batch in batches:
        out = recipe.loss(model, batch.inputs)
        out.loss_sum.backward()
        outs.append(out)
    units = sum(out.units for out in outs)
    gradient = torch.cat([p.grad.flatten() / units for p in model.parameters() if p.grad is not None])
    return batches, gradient, rows, recipe


def test_a_grpo_step_packed_by_tokens_has_the_gradient_of_fixed_micro_batches(tok):
    """8 rows of 3-token prompts and 5, 1, 3, 2 completion tokens (8, 4, 6, 5, 8, 4, 6, 5 tokens): 4 micro-batches of 2
    rows, or with a budget of 16 tokens first fit in 3: rows 1, 2, 6 (16 tokens), 3, 4, 8 (16) and 5, 7 (14), the
    sixth row moved ahead of the fifth. The same gradient to float rounding, and the old log-probs of the budgeted
    passes are the fixed ones, row for row."""
    model = tiny_llama()
    fixed, fixed_gradient, fixed_rows, _ = recipe_step(tok, model, {})
    packed, packed_gradient, packed_rows, recipe = recipe_step(tok, model, {"max_token_len_per_mini_batch": 16})
    assert [b.inputs["input_ids"].shape[0] for b in fixed] == [2, 2, 2, 2]
    assert [(b.inputs["input_ids"].shape[0], b.num_tokens) for b in packed] == [(3, 16), (3, 16), (2, 14)]
    relative = float((packed_gradient - fixed_gradient).norm() / fixed_gradient.norm())
    assert fixed_gradient.norm() > 0 and relative < 1e-6, relative
    assert recipe.metrics.take_step()["batching/micro_batches"] == len(packed)
    for a, b in zip(fixed_rows, packed_rows):
        assert a.completion_ids == b.completion_ids
        assert a.old_logps == pytest.approx(b.old_logps, abs=1e-5)


def test_a_row_above_the_budget_trains_alone_with_one_warning(tok):
    model = tiny_llama()
    packed, _, _, recipe = recipe_step(tok, model, {"max_token_len_per_mini_batch": 6})
    assert [b.num_tokens for b in packed if b.num_tokens > 6] == [8, 8]  # the two 5-token completions, each alone
    assert [b.inputs["input_ids"].shape[0] for b in packed if b.num_tokens > 6] == [1, 1]
    [warning] = recipe.messages()
    assert "a row of 8 tokens (prompt + completion) is longer than trl.max_token_len_per_mini_batch = 6" in warning
    recipe.prepare_step(model)  # the second pass over the batch: no second warning
    assert recipe.messages() == []


# ------------------------------------------------------------------------------------------ config


def test_the_keys_resolve_into_the_rl_settings(config):
    settings = resolve(config(rl="grpo", micro_batch_size=8, trl={"reward_funcs": ["m.r"], "loss_type": "token-mean",
                                              "balance_dp_token": True, "max_token_len_per_mini_batch": 4096})).rl
    assert (settings.max_token_len_per_mini_batch, settings.balance_dp_token) == (4096, True)
    defaults = resolve(config(rl="grpo", micro_batch_size=8, trl={"reward_funcs": ["m.r"]})).rl
    assert (defaults.max_token_len_per_mini_batch, defaults.balance_dp_token) == (None, False)
    off = resolve(config(rl="grpo", micro_batch_size=8, trl={"reward_funcs": ["m.r"], "max_token_len_per_mini_batch": 0})).rl
    assert off.max_token_len_per_mini_batch is None  # Cosmos-RL's 0: no budget


@pytest.mark.parametrize("overrides,message", [
    ({"rl": "grpo", "trl": {"reward_funcs": ["m.r"], "balance_dp_token": True}},
     "trl.balance_dp_token balances Cosmos-RL's loss_type token-mean across processes; loss_type dapo already divides"),
    ({"rl": "grpo", "trl": {"reward_funcs": ["m.r"], "balance_dp_token": True, "loss_type": "seq-mean-token-mean"}},
     "loss_type grpo (as trl.loss_type: seq-mean-token-mean runs) averages each completion's own token mean"),
    ({"rl": "grpo", "balance_dp_token": True, "trl": {"reward_funcs": ["m.r"]}},
     "balance_dp_token at the top level is Cosmos-RL's SFT key; the GRPO family's is trl.balance_dp_token"),
    ({"trl": {"max_token_len_per_mini_batch": 512}},
     "trl.max_token_len_per_mini_batch is read only where a rollout engine generates (rl: grpo, gdpo, or ebft in "
     "structured mode), not by sft: remove it"),
    ({"rl": "dpo", "trl": {"max_token_len_per_mini_batch": 512, "balance_dp_token": True}},
     "trl.max_token_len_per_mini_batch, trl.balance_dp_token are read only where a rollout engine generates"),
])
def test_the_rules_on_the_keys(config_problems, overrides, message):
    assert any(message in text for _, text in config_problems(**overrides)), config_problems(**overrides)


def test_token_mean_with_balance_and_a_budget_is_a_clean_config(config):
    config(rl="grpo", micro_batch_size=8, trl={"reward_funcs": ["m.r"], "loss_type": "token-mean", "balance_dp_token": True,
                                               "max_token_len_per_mini_batch": 2048})
