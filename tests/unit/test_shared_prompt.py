"""share_prompts: each pair's prompt once, both answers after it, gives the log-probs of the padded pairs."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

from layout_checks import (assert_same_completion_results, assert_same_grads, assert_same_sequence_logps, completion_results,
                           parameter_grads, tiny_of_type)
from rlft.config.settings import resolve
from rlft.config.settings.model import model_settings
from rlft.config.settings.training import data_settings
from rlft.config.loading import build_config
from rlft.data.collate import shared_prompt_rows
from rlft.data.preference import pair_batch, shared_pair_inputs
from rlft.errors import ConfigError
from rlft.models import head
from rlft.models.shared_prompts import SHARED_PROMPT_MODELS, prompt_sharing, shared_prompt_problem, sharing_flops
from rlft.train.recipes.preference import pair_collate, sequence_logps


def pairs(vocab: int, shapes=((6, 3, 5), (2, 5, 1), (4, 2, 2))):
    g = torch.Generator().manual_seed(5)
    ids = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    return [{"prompt_ids": ids(p), "chosen_ids": ids(c), "rejected_ids": ids(r)} for p, c, r in shapes]


def tiny(vocab: int = 128, attention: str = "sdpa", **keys) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                        num_key_value_heads=1, intermediate_size=32, attn_implementation=attention, **keys))


def test_the_shared_layout_by_hand():
    """Prompt a b, chosen c, rejected d e: one sequence a b c d e, positions 0 1 2 2 3; d sees a b and itself, not c."""
    example = {"prompt_ids": [11, 12], "chosen_ids": [13], "rejected_ids": [14, 15]}
    batch = pair_batch([example], pad_id=0)  # rows: a b c (padded to 4), a b d e
    shared = shared_pair_inputs([example], batch["input_ids"].shape[1], pad_id=0)
    assert shared["flat_input_ids"].tolist() == [[11, 12, 13, 14, 15]]
    assert shared["flat_position_ids"].tolist() == [[0, 1, 2, 2, 3]]
    assert shared["flat_attention_mask"][0, 0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 0, 1, 1]]
    # chosen row a b c pad -> 0 1 2 2 (padding points at the last token); rejected row a b d e -> 0 1 3 4
    assert shared["flat_index"].tolist() == [[0, 1, 2, 2], [0, 1, 3, 4]]
    assert (batch["num_tokens"], shared["model_tokens"]) == (7, 5)  # trained rows a b c + a b d e; computed a b c d e


@pytest.mark.parametrize("one_sequence", [False, True])
def test_the_shared_mask_is_each_answers_own_row_token_by_token(one_sequence):
    """Groups of 1-3 answers of 0-3 tokens: the mask read token by token from the layout's definition. Query q sees key
    k <= q of its own group where k is on the prompt or on q's own part; a padding token sees only itself."""
    groups = [([1, 2, 3], [[4], [5, 6], [7, 8, 9]]), ([1], [[2, 3], []]), ([1, 2], [[3, 4, 5]])]
    flat, starts = shared_prompt_rows(groups, pad_id=0, one_sequence=one_sequence, multiple=4)
    rows, width = flat["flat_input_ids"].shape
    owner = {}  # flattened position -> (group, part): part 0 the prompt, k answer k
    for number, ((prompt, answers), begins) in enumerate(zip(groups, starts)):
        for part, (begin, tokens) in enumerate(zip(begins, [prompt, *answers])):
            owner.update({begin + i: (number, part) for i in range(len(tokens))})
    assert len(owner) == flat["model_tokens"] == 17
    mask = flat["flat_attention_mask"][:, 0]
    for row in range(rows):
        for q in range(width):
            for k in range(width):
                a, b = owner.get(row * width + q), owner.get(row * width + k)
                sees = q == k or (k < q and a is not None and b is not None and a[0] == b[0] and b[1] in (0, a[1]))
                assert bool(mask[row, q, k]) == sees, (row, q, k)


def test_pairs_in_one_sequence_and_padded_pairs():
    examples = pairs(50, ((2, 1, 1), (1, 2, 1)))
    width = pair_batch(examples, pad_id=0)["input_ids"].shape[1]
    padded = shared_pair_inputs(examples, width, pad_id=0, multiple=8)
    assert padded["flat_input_ids"].shape == (2, 8)  # 4 tokens each, rounded up to 8
    assert padded["flat_position_ids"][1].tolist() == [0, 1, 2, 1, 0, 0, 0, 0]
    mask = padded["flat_attention_mask"][1, 0]
    assert mask[4:].int().tolist() == torch.eye(8, dtype=torch.int)[4:].tolist()  # padding attends to itself alone
    flat = shared_pair_inputs(examples, width, pad_id=0, one_sequence=True)
    assert flat["flat_input_ids"].shape == (1, 8)
    # pair 0 = p p c r at 0-3, pair 1 = p c c r at 4-7; rows are 3 wide: chosen rows, then rejected rows
    assert flat["flat_index"].tolist() == [[0, 1, 2], [4, 5, 6], [0, 1, 3], [4, 7, 7]]
    assert not flat["flat_attention_mask"][0, 0, 4:, :4].any()  # the second pair does not see the first
    assert padded["model_tokens"] == flat["model_tokens"] == 8  # the padding is not counted


def _sequence_results(model, batch, weights):
    model.zero_grad()
    out = sequence_logps(model, batch)
    (out.logps * weights).sum().backward()
    return out, parameter_grads(model)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("vocab", [300, 4096], ids=["model-logits", "output-layer"])
@pytest.mark.parametrize("one_sequence", [False, True], ids=["sequence-per-pair", "padding-free"])
def test_shared_prompts_give_the_padded_pairs_log_probs_and_gradients(vocab, attention, one_sequence, monkeypatch):
    monkeypatch.setattr(head, "MIN_VOCAB", 4096)
    model = tiny(vocab, attention)
    examples = pairs(vocab)
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0, 0.25, -1.0])
    plain, grads = _sequence_results(model, pair_collate(0, False, multiple=4)(examples), weights)
    shared, shared_grads = _sequence_results(model, pair_collate(0, True, one_sequence, multiple=4)(examples), weights)
    assert_same_sequence_logps(shared, plain)
    assert_same_grads(shared_grads, grads)


def test_the_whole_sequence_and_per_position_terms_too():
    """ORPO's sequence span (prompt included) and WPO's per-position term read the model's logits of every slot."""
    model = tiny()
    examples = pairs(128)
    with torch.no_grad():
        plain = sequence_logps(model, pair_collate(0, False)(examples), wpo=True, whole_rows=3)
        shared = sequence_logps(model, pair_collate(0, True)(examples), wpo=True, whole_rows=3)
    torch.testing.assert_close(shared.sequence_logps, plain.sequence_logps, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared.log_sum_sq_probs[plain.mask], plain.log_sum_sq_probs[plain.mask], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", SHARED_PROMPT_MODELS)
def test_every_model_type_on_the_list_gives_its_own_rows_log_probs(kind):
    """The list in rlft.models.masks is what this test has checked: a tiny random model of each type."""
    model = tiny_of_type(kind)
    examples = pairs(128)
    assert shared_prompt_problem(model) is None
    with torch.no_grad():
        plain = sequence_logps(model, pair_collate(0, False)(examples)).logps
        shared = sequence_logps(model, pair_collate(0, True)(examples)).logps
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-5)


def test_models_that_cannot_share_say_why():
    assert shared_prompt_problem(tiny()) is None
    assert shared_prompt_problem(tiny_of_type("mistral", window=8)) is None  # windows are kept: test_sliding_windows.py
    holder = torch.nn.Module()
    holder.config = AutoConfig.for_model("qwen3_next")  # linear-attention layers: the rejected answer would read the chosen
    assert "model type qwen3_next is not one rlft has checked" in shared_prompt_problem(holder)


def config(**keys):
    return build_config({"base_model": "m", "datasets": [{"path": "d.jsonl"}], "micro_batch_size": 4, "rl": "dpo", **keys})


@pytest.mark.parametrize("keys, message", [
    ({"rl": "kto"}, "share_prompts: it applies to dpo, ipo, orpo, simpo, reward_model, grpo and gdpo, not kto"),
    ({"flash_attention": True}, "share_prompts: it needs SDPA or eager attention \\(they read the mask that keeps the answers apart\\), not flash_attention_2"),
    ({"pad_to_sequence_len": True}, "pad_to_sequence_len pads every row to sequence_len"),
])
def test_asking_for_shared_prompts_where_they_cannot_be_is_refused(keys, message):
    with pytest.raises(ConfigError, match=message):
        config(share_prompts=True, **keys)


def test_the_flops_estimate_by_hand():
    """Llama, hidden 16, 2 layers of (q 16x16, k and v 16x8, o 16x16, MLP 3 x 16x32, 2 norms of 16), a final norm:
    4,688 weights outside the embeddings and the output layer, 2 FLOPs each per token; attention 2 heads x 8 wide:
    4 x 16 x 2 layers = 128 FLOPs per (query, key) pair."""
    example = {"prompt_ids": [1] * 6, "chosen_ids": [2] * 3, "rejected_ids": [3] * 5}
    once, twice = sharing_flops(tiny(), [example])
    assert once == 14 * 9376 + 14**2 * 128  # prompt + both answers: 14 tokens
    assert twice == 2 * (11 * 9376 + 11**2 * 128)  # two rows of prompt + the longer answer


def test_for_a_7b_llama_the_weights_dominate():
    """The figure in docs/preference.md: Llama-2-7B's shapes (on the meta device, no weights), a 150-token prompt and
    two 300-token answers: 16 % fewer forward FLOPs with the prompt once."""
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                             num_key_value_heads=32, intermediate_size=11008, vocab_size=32000))
    once, twice = sharing_flops(model, [{"prompt_ids": [1] * 150, "chosen_ids": [2] * 300, "rejected_ids": [3] * 300}])
    assert round(1 - once / twice, 2) == 0.16


def test_on_by_default_where_the_model_allows_and_the_plan_says_so():
    examples = pairs(128)
    assert prompt_sharing(data_settings(config()), [tiny(), None], examples) == (
        True, "once per pair, both answers after it (share_prompts; 36% fewer forward FLOPs than twice)")
    assert prompt_sharing(data_settings(config(share_prompts=False)), [tiny()], examples) == (False, "twice per pair (share_prompts: false)")
    on, line = prompt_sharing(data_settings(config(flash_attention=True)), [tiny()], examples)
    assert not on and line == "twice per pair: it needs SDPA or eager attention (they read the mask that keeps the answers apart), not flash_attention_2"
    unchecked = tiny()
    unchecked.config.model_type = "qwen3_next"
    on, line = prompt_sharing(data_settings(config()), [tiny(), unchecked], examples)  # the reference model decides too
    assert not on and "model type qwen3_next is not one rlft has checked" in line
    with pytest.raises(ConfigError, match="share_prompts: model type qwen3_next .* set it to false"):
        prompt_sharing(data_settings(config(share_prompts=True)), [unchecked], examples)


def test_unset_it_stays_off_where_one_sequence_per_pair_would_cost_more():
    """A one-token prompt before two 200-token answers: the pair's 401-token sequence has 4x the attention pairs of a
    201-token row, and the small model's weights do not make up for it."""
    long_answers = [{"prompt_ids": [1], "chosen_ids": [2] * 200, "rejected_ids": [3] * 200}]
    on, line = prompt_sharing(data_settings(config()), [tiny()], long_answers)
    assert not on and line.startswith("twice per pair: once would take 72% more forward FLOPs (the answers are long")
    assert prompt_sharing(data_settings(config(share_prompts=True)), [tiny()], long_answers) == (
        True, "once per pair, both answers after it (share_prompts; 72% more forward FLOPs than twice)")


def group_rows(vocab: int):
    """Two GRPO groups of three completions (prompts of 5 and 2 tokens: left padding) and a row alone; one completion
    is empty."""
    g = torch.Generator().manual_seed(7)
    ids = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    first, second = ids(5), ids(2)
    out = [{"prompt_ids": prompt, "completion_ids": ids(n), "advantage": 1.0}
           for prompt, n in ((first, 4), (second, 6), (first, 1), (second, 0), (first, 7), (second, 3), (ids(3), 2))]
    return [{**row, "loss_mask": [1] * len(row["completion_ids"])} for row in out]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("vocab", [300, 4096], ids=["model-logits", "output-layer"])
@pytest.mark.parametrize("one_sequence", [False, True], ids=["sequence-per-group", "one-sequence"])
def test_shared_group_prompts_give_each_completions_own_log_probs_and_gradients(vocab, attention, one_sequence, monkeypatch):
    """GRPO: the completions of one prompt after one copy of it give the padded rows' log-probs, entropies, sampling
    log-probs under top-k and repetition penalty, and gradients."""
    from rlft.data.collate import completion_batch
    from rlft.models.logprobs import shared_completion_inputs

    monkeypatch.setattr(head, "MIN_VOCAB", 4096)
    model = tiny(vocab, attention)
    rows = group_rows(vocab)
    batch = completion_batch(rows, pad_id=0, multiple=4)
    shared = {**batch, **shared_completion_inputs(rows, batch, 0, one_sequence, multiple=4)}
    assert shared["flat_input_ids"].shape[0] == (1 if one_sequence else 3)  # two groups and the row alone
    valid = batch["loss_mask"].bool()
    assert_same_completion_results(completion_results(model, shared, valid), completion_results(model, batch, valid))


def test_rows_without_a_shared_prompt_keep_their_layout():
    from rlft.data.collate import completion_batch
    from rlft.models.logprobs import shared_completion_inputs

    rows = group_rows(50)
    alone = [rows[0], rows[1], rows[-1]]  # three different prompts
    assert shared_completion_inputs(alone, completion_batch(alone, 0), 0) is None
    empty = [{**row, "prompt_ids": []} for row in rows[:2]]
    assert shared_completion_inputs(empty, completion_batch(empty, 0), 0) is None


def test_a_micro_batch_shares_only_where_that_takes_fewer_flops():
    """Per micro-batch, against the rows as they are: four 2-token completions after a 40-token prompt share it; four
    60-token completions after a 2-token prompt would make a 242-token sequence whose attention outweighs the 6
    prompt tokens saved, and stay rows of their own."""
    from rlft.data.collate import completion_batch
    from rlft.models.logprobs import shared_completion_inputs
    from rlft.models.shared_prompts import forward_costs

    costs = forward_costs(tiny())

    def group(prompt: int, completion: int):
        rows = [{"prompt_ids": [5] * prompt, "completion_ids": [6] * completion, "loss_mask": [1] * completion, "advantage": 0.0}] * 4
        return rows, completion_batch(rows, 0)

    assert shared_completion_inputs(*group(40, 2), 0, costs=costs) is not None
    assert shared_completion_inputs(*group(2, 60), 0, costs=costs) is None
    assert shared_completion_inputs(*group(2, 60), 0) is not None  # share_prompts: true
    # batch_flattening: against one sequence under one mask (eager attention), sharing a 10-token prompt pays; against
    # rows that attend each on its own (per-row SDPA), it does not
    assert shared_completion_inputs(*group(10, 60), 0, one_sequence=True, costs=costs) is not None
    assert shared_completion_inputs(*group(10, 60), 0, costs=costs, rows_apart=True) is None
    assert shared_completion_inputs(*group(40, 2), 0, costs=costs, rows_apart=True)["flat_input_ids"].shape == (1, 48)


def test_with_rows_apart_shared_groups_are_one_sequence_each_not_the_micro_batch_in_one(config):
    """batch_flattening / dpo_padding_free on per-row SDPA: flattened rows need no mask, so where prompts are shared
    each group (pair) is a sequence of its own, whose mask covers it alone, not one sequence of the whole micro-batch
    under one (T, T) mask."""
    from types import SimpleNamespace

    from rlft.data.prepared import PreparedData
    from rlft.models.varlen import rows_apart
    from rlft.train.recipes.preference import PairRecipe

    assert rows_apart(model_settings(config()), tiny()) and not rows_apart(model_settings(config(torch_compile=True)), tiny())
    eager = tiny()
    eager.set_attn_implementation("eager")
    assert not rows_apart(model_settings(config()), eager)
    pairs = [{"prompt_ids": [1] * 9, "chosen_ids": [2], "rejected_ids": [3, 3]}, {"prompt_ids": [4] * 7, "chosen_ids": [5], "rejected_ids": [6]}]
    cfg = config(rl="dpo", dpo_padding_free=True, micro_batch_size=2, share_prompts=True)
    for apart, shape in ((True, (2, 12)), (False, (1, 21))):
        recipe = PairRecipe(cfg, resolve(cfg), PreparedData(pairs, [], []), 0, None, sharing=(True, "once"), rows_apart=apart)
        assert recipe.train_plan.batch([0, 1])["flat_input_ids"].shape == shape
    from rlft.config import build_config
    from rlft.models.shared_prompts import forward_costs
    from rlft.data.tokenizer import byte_tokenizer
    from rlft.rollout.types import TrainingRow
    from rlft.train.recipes.grpo import GRPORecipe

    cfg = build_config({"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 8,
                        "batch_flattening": True, "trl": {"num_generations": 4, "reward_funcs": ["r.f"]}})
    grpo = GRPORecipe(cfg, resolve(cfg), SimpleNamespace(train=[], eval=[]), byte_tokenizer(), None, None)
    grpo.share_prompts, grpo.share_costs = True, forward_costs(tiny())
    rows = [TrainingRow(prompt_ids=[first] * 40, completion_ids=[6] * 2, loss_mask=[1, 1], advantage=0.0,
                        sampling_logps=[0.0] * 2, weight_version=0) for first in (3, 4) for _ in range(4)]
    for apart, shape in ((True, (2, 48)), (False, (1, 96))):
        grpo.rows_apart = apart
        assert grpo.micro_batch(rows)["flat_input_ids"].shape == shape


def test_grpo_plan_lines_and_refusals():
    from rlft.models.shared_prompts import group_sharing

    grpo = lambda **keys: config(rl="grpo", trl={"reward_funcs": ["m.f"], "num_generations": 4}, **keys)  # noqa: E731
    assert group_sharing(data_settings(grpo()), [tiny(), None]) == (True, "once per group where that saves forward FLOPs (share_prompts)")
    assert group_sharing(data_settings(grpo(share_prompts=True)), [tiny()]) == (True, "once per group (share_prompts: true)")
    assert group_sharing(data_settings(grpo(share_prompts=False)), [tiny()]) == (False, "once per completion (share_prompts: false)")
    unchecked = tiny()
    unchecked.config.model_type = "qwen3_next"
    assert group_sharing(data_settings(grpo()), [unchecked]) == (False, "once per completion: model type qwen3_next is not one rlft has "
                                                         "checked for it (SHARED_PROMPT_MODELS in rlft/models/shared_prompts.py)")
    with pytest.raises(ConfigError, match="share_prompts: model type qwen3_next"):
        group_sharing(data_settings(grpo(share_prompts=True)), [unchecked])


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("pad_id", [0, 9], ids=["pad", "pad-is-eos"])
def test_reward_scores_with_shared_prompts_are_each_rows_own(attention, pad_id):
    """Reward models: each answer's score at its last token that is not padding, as transformers pools it, and the
    gradients, with the prompt shared. With pad == EOS (answers end with 9 here) the score sits before the trailing
    EOS tokens in both layouts."""
    from transformers import LlamaForSequenceClassification

    from rlft.models.reward import pair_scores

    torch.manual_seed(0)
    model = LlamaForSequenceClassification(LlamaConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=32,
        num_labels=1, pad_token_id=pad_id, attn_implementation=attention))
    examples = [{**e, "chosen_ids": e["chosen_ids"] + [9], "rejected_ids": e["rejected_ids"] + [9]} for e in pairs(64)]
    results = []
    for share in (False, True):
        model.zero_grad()
        scores = pair_scores(model, pair_collate(pad_id, share)(examples), pad_id)
        (scores * torch.tensor([1.0, -2.0, 0.5, 3.0, 0.25, -1.0])).sum().backward()
        results.append((scores.detach(), parameter_grads(model)))
    (plain, grads), (shared, shared_grads) = results
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-5)
    assert_same_grads(shared_grads, grads)


def test_reward_models_share_unless_compiled():
    from transformers import LlamaForSequenceClassification

    from rlft.models.shared_prompts import reward_sharing

    model = LlamaForSequenceClassification(LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                       num_key_value_heads=1, intermediate_size=32, num_labels=1))
    rm = lambda **keys: build_config({"base_model": "m", "datasets": [{"path": "d.jsonl"}], "reward_model": True, **keys})  # noqa: E731
    on, line = reward_sharing(data_settings(rm()), model, pairs(64), compiled=False)
    assert on and line.startswith("once per pair, both answers after it (share_prompts;")
    assert reward_sharing(data_settings(rm()), model, pairs(64), compiled=True) == (
        False, "twice per pair: torch_compile: the scores are read from the score head during the forward, which a "
               "compiled forward would retrace every step")
    with pytest.raises(ConfigError, match="share_prompts: torch_compile"):
        reward_sharing(data_settings(rm(share_prompts=True)), model, pairs(64), compiled=True)


@pytest.mark.parametrize("share", [False, True], ids=["prompt-twice", "prompt-once"])
def test_sequence_log_probs_through_the_output_layer_under_bf16_autocast(share, monkeypatch):
    """bf16 autocast with a real-size output layer (the DPO family's path on a GPU): the mean-logit metric's product
    stays float32 (it once came out bf16 and stopped every bf16 DPO run at its first step), and the values are
    fp32's to bf16 rounding."""
    monkeypatch.setattr(head, "MIN_VOCAB", 4096)
    model = tiny(4096)
    batch = pair_collate(0, share)(pairs(4096))
    plain = sequence_logps(model, batch)
    with torch.autocast("cpu", torch.bfloat16):
        low = sequence_logps(model, batch)
    assert low.mean_logits.dtype == torch.float32
    torch.testing.assert_close(low.logps, plain.logps, rtol=0.05, atol=0.3)
    torch.testing.assert_close(low.mean_logits, plain.mean_logits, rtol=0.05, atol=0.05)


def test_a_mixture_of_experts_costs_the_experts_a_token_is_routed_to():
    """Mixtral with 4 experts, 2 per token: the expert weights count half in the per-token FLOPs (all of them tilted
    the estimate towards sharing)."""
    from layout_checks import tiny_of_type

    from rlft.models.shared_prompts import forward_costs

    model = tiny_of_type("mixtral")
    assert (model.config.num_local_experts, model.config.num_experts_per_tok) == (4, 2)
    embeddings = {id(p) for p in model.get_input_embeddings().parameters()} | {id(p) for p in model.get_output_embeddings().parameters()}
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    rest = sum(p.numel() for p in model.parameters() if id(p) not in embeddings) - experts
    assert experts > 0 and forward_costs(model)[0] == 2 * rest + experts


def test_take_rows_gives_advanced_indexings_values_and_gradients():
    """`take_rows` (index_select) against `flat[index]`: the same rows, and the same gradient where rows are taken
    several times (a group's shared prompt, padding slots pointing at a real token)."""
    from rlft.models.logprobs import take_rows

    torch.manual_seed(0)
    flat = torch.randn(12, 5, requires_grad=True)
    index = torch.tensor([[0, 0, 3, 3, 11], [4, 4, 4, 7, 0]])
    weights = torch.randn(2, 5, 5)
    got = take_rows(flat, index)
    assert got.shape == (2, 5, 5) and torch.equal(got, flat[index])
    (grad,) = torch.autograd.grad((got * weights).sum(), flat)
    (want,) = torch.autograd.grad((flat[index] * weights).sum(), flat)
    torch.testing.assert_close(grad, want)
    assert torch.equal(take_rows(flat, index[0]), flat[index[0]])


def test_masked_rows_gives_boolean_indexings_values_and_gradients():
    from rlft.models.logprobs import masked_rows

    torch.manual_seed(0)
    values = torch.randn(3, 6, 4, requires_grad=True)
    mask = torch.rand(3, 6) > 0.4
    weights = torch.randn(int(mask.sum()), 4)
    got = masked_rows(values, mask)
    assert torch.equal(got, values[mask])
    (grad,) = torch.autograd.grad((got * weights).sum(), values)
    (want,) = torch.autograd.grad((values[mask] * weights).sum(), values)
    torch.testing.assert_close(grad, want)
    sliced = values[:, 1:]  # not contiguous: indexed as it is, not copied to be flattened
    assert torch.equal(masked_rows(sliced, mask[:, 1:]), sliced[mask[:, 1:]])
