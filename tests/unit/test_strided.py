"""Strided block-parallel generation: layout, attention rule, and the three properties block-parallel training needs.

(a) the loss reads each generated token's log-prob where sampling read it (Axolotl's strided trainer does not);
(b) each token gets its own block's advantage (Axolotl's does not);
(c) parallel blocks = each block generated alone by a plain causal model on its prefix.
"""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.rollout.strided import (
    deinterleave,
    document_nll,
    gather_generated_logps,
    generate_blocks,
    generated_targets,
    model_attention,
    model_attention_mask,
    strided_attention,
    strided_layout,
    strided_mask_mod,
)

TEMPERATURE = 0.7


def _tiny_llama(attn_implementation: str = "sdpa") -> LlamaForCausalLM:
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=260, max_position_embeddings=128,
                         initializer_range=0.2)  # peaked distributions: a wrong mask or column shows up clearly
    config._attn_implementation = attn_implementation
    torch.manual_seed(0)
    return LlamaForCausalLM(config).float().eval()


@pytest.fixture
def flex_reference(monkeypatch):
    """transformers' flex_attention models run PyTorch's flex_attention unfused (its reference: the mask_mod evaluated
    on the whole score matrix) instead of compiling it. On a CPU inductor's flex_attention kernel is PyTorch's own code,
    which rlft never runs (training falls back to SDPA there), and its AVX2 build returns NaN rows for these masks
    (seen with torch 2.13 on an AVX2-only AMD EPYC, and on an AVX-512 CPU with ATEN_CPU_CAPABILITY=avx2), where the
    AVX-512 build is right; a GPU runs the compiled kernel (bench/gpu_check.py). What these tests prove is rlft's part:
    the BlockMask's mask_mod is the strided rule."""
    from torch.nn.attention.flex_attention import flex_attention
    from transformers.integrations import flex_attention as integration

    monkeypatch.setattr(integration, "compile_friendly_flex_attention",
                        lambda query, key, value, training=False, **kwargs: flex_attention(query, key, value, **kwargs))


@pytest.fixture(scope="module")
def model():
    return _tiny_llama()


@pytest.fixture(scope="module")
def batch():
    """Two right-padded documents (the second has 5 pads), L = 24, stride 3, context 4, G = 3."""
    torch.manual_seed(1)
    doc_ids = torch.randint(3, 260, (2, 24))
    doc_attention = torch.ones(2, 24, dtype=torch.long)
    doc_attention[1, 19:] = 0
    doc_ids[1, 19:] = 0
    layout = strided_layout(doc_attention.sum(-1), 24, stride=3, context_length=4, generate_max_len=3)
    return doc_ids, doc_attention, layout


@pytest.fixture(scope="module")
def rollout(model, batch):
    doc_ids, doc_attention, layout = batch
    return generate_blocks(model, doc_ids, doc_attention, layout, num_samples=2, temperature=TEMPERATURE,
                           generator=torch.Generator().manual_seed(2))


def _forward(model, rollout):
    with torch.no_grad():
        return model(input_ids=rollout.sequences, attention_mask=model_attention_mask(model, rollout.mask),
                     position_ids=rollout.position_ids).logits


# ---------------------------------------------------------------- layout and mask


def test_layout_anchors_and_block_count(batch):
    _, _, layout = batch
    # K = ⌊(24 − 3 − 4)/3⌋ + 1 = 6: anchors 4, 7, ..., 19; row 1 has 19 valid tokens → a_k + 3 ≤ 19
    assert layout.anchors.tolist() == [4, 7, 10, 13, 16, 19]
    assert layout.num_blocks == 6 and layout.total_len == 24 + 18
    assert layout.block_valid.tolist() == [[True] * 6, [True] * 5 + [False]]


def test_hand_checked_mask_and_positions():
    # L = 8, stride 2, context 2, G 2 → K = ⌊(8−2−2)/2⌋+1 = 3, anchors 2, 4, 6; T = 14.
    layout = strided_layout(torch.tensor([8]), 8, stride=2, context_length=2, generate_max_len=2)
    mask, positions = strided_attention(layout, torch.ones(1, 8, dtype=torch.long))
    assert layout.anchors.tolist() == [2, 4, 6] and mask.shape == (1, 1, 14, 14)
    # columns 8, 9, 10 = step 0 of blocks 0, 1, 2; columns 11, 12, 13 = step 1
    assert positions[0].tolist() == list(range(8)) + [2, 4, 6, 3, 5, 7]
    expected = {q: set(range(q + 1)) for q in range(8)}  # (a) causal document
    expected.update({
        8: {0, 1, 8}, 9: {0, 1, 2, 3, 9}, 10: {0, 1, 2, 3, 4, 5, 10},  # (b) prefix before a_k, (c) itself
        11: {0, 1, 8, 11}, 12: {0, 1, 2, 3, 9, 12}, 13: {0, 1, 2, 3, 4, 5, 10, 13},  # (d) own earlier token
    })
    for q in range(14):
        assert set(mask[0, 0, q].nonzero().flatten().tolist()) == expected[q], q


def test_generated_positions_equal_the_ground_truth_positions_they_replace(batch):
    _, doc_attention, layout = batch
    _, positions = strided_attention(layout, doc_attention)
    targets = deinterleave(positions[:, 24:], layout.num_blocks)  # (B, K, G) [b, k, t]
    for k, anchor in enumerate(layout.anchors.tolist()):
        for t in range(3):
            assert targets[:, k, t].tolist() == [anchor + t] * 2
            assert positions[0, 24 + t * 6 + k] == anchor + t


def test_padding_no_anchor_in_pads_and_no_attention_to_pads():
    doc_attention = torch.ones(2, 8, dtype=torch.long)
    doc_attention[1, 6:] = 0
    layout = strided_layout(doc_attention.sum(-1), 8, stride=2, context_length=2, generate_max_len=2)
    assert layout.block_valid.tolist() == [[True, True, True], [True, True, False]]  # a=6: 6+2 > 6 valid tokens
    mask, _ = strided_attention(layout, doc_attention)
    others = ~torch.eye(14, dtype=torch.bool)
    assert not (mask[1, 0, :, 6:8] & others[:, 6:8]).any()  # only a pad itself looks at a pad
    assert mask[1, 0].any(-1).all()  # every row attends something: no NaN softmax rows
    with pytest.raises(ValueError, match="right-padded"):
        strided_attention(layout, doc_attention.flip(-1))


def test_padded_row_logits_do_not_depend_on_pad_tokens(model):
    doc_ids = torch.randint(3, 260, (1, 12))
    doc_attention = torch.ones(1, 12, dtype=torch.long)
    doc_attention[0, 9:] = 0
    layout = strided_layout(doc_attention.sum(-1), 12, stride=2, context_length=3, generate_max_len=2)
    out = generate_blocks(model, doc_ids, doc_attention, layout, num_samples=1, temperature=TEMPERATURE,
                          generator=torch.Generator().manual_seed(0))
    other = out.sequences.clone()
    other[0, 9:12] = 7  # different pad tokens
    with torch.no_grad():
        first = model(input_ids=out.sequences, attention_mask=out.mask, position_ids=out.position_ids).logits
        second = model(input_ids=other, attention_mask=out.mask, position_ids=out.position_ids).logits
    keep = torch.ones(out.sequences.size(1), dtype=torch.bool)
    keep[9:12] = False
    torch.testing.assert_close(first[0, keep], second[0, keep], atol=1e-5, rtol=0)


def test_no_blocks_when_the_document_is_too_short(model):
    layout = strided_layout(torch.tensor([8, 8]), 8, stride=2, context_length=6, generate_max_len=4)
    assert layout.num_blocks == 0 and layout.block_valid.shape == (2, 0)
    assert strided_layout(torch.tensor([3, 5]), 16, stride=2, context_length=4, generate_max_len=2).num_blocks == 0
    doc_attention = torch.ones(2, 8, dtype=torch.long)
    mask, positions = strided_attention(layout, doc_attention)
    assert torch.equal(mask[0, 0], torch.ones(8, 8, dtype=torch.bool).tril()) and positions.shape == (2, 8)
    out = generate_blocks(model, torch.randint(3, 260, (2, 8)), doc_attention, layout, num_samples=3, temperature=1.0)
    assert out.generated.shape == (6, 0, 4) and out.sampled_logps.shape == (6, 0, 4) and out.sequences.shape == (6, 8)


def test_first_anchor_takes_the_batch_max():
    layout = strided_layout(torch.tensor([20, 20]), 20, stride=4, context_length=2, generate_max_len=2,
                            first_anchor=torch.tensor([3, 5]))
    assert layout.first_anchor == 5 and layout.anchors.tolist() == [5, 9, 13, 17]


def test_flex_mask_mod_equals_the_dense_mask(batch):
    # the flex path (CUDA only) evaluates the same mask_mod; here it runs on broadcast indices, with n = 2
    _, doc_attention, layout = batch
    dense, _ = strided_attention(layout, doc_attention)
    index = torch.arange(layout.total_len)
    flex = strided_mask_mod(layout, doc_attention, num_samples=2)(
        torch.arange(4)[:, None, None], None, index[None, :, None], index[None, None, :])
    assert torch.equal(flex, dense[:, 0].repeat_interleave(2, 0))


# ---------------------------------------------------------------- generation and the three properties


def test_rollout_shapes_and_layout(rollout, batch):
    doc_ids, _, layout = batch
    assert rollout.sequences.shape == (4, 42) and rollout.generated.shape == (4, 6, 3)
    assert torch.equal(rollout.sequences[:, :24], doc_ids.repeat_interleave(2, 0))  # samples of a document consecutive
    for k in range(6):
        for t in range(3):
            assert torch.equal(rollout.sequences[:, 24 + t * 6 + k], rollout.generated[:, k, t])
    assert torch.equal(generated_targets(rollout.sequences, layout), rollout.generated)
    assert rollout.block_valid.tolist() == [[True] * 6] * 2 + [[True] * 5 + [False]] * 2
    assert not torch.equal(rollout.generated[0], rollout.generated[1])  # the two samples differ


def test_a_loss_logps_equal_sampling_logps(model, rollout, batch):
    _, _, layout = batch
    logits = _forward(model, rollout)
    loss_logps = gather_generated_logps(logits, rollout.sequences, layout, TEMPERATURE)
    torch.testing.assert_close(loss_logps, rollout.sampled_logps, atol=1e-4, rtol=0)
    # the plain next-token shift over the step-major layout (as Axolotl's strided trainer does) reads other columns: caught here
    shifted = torch.log_softmax(logits[:, 23:-1] / TEMPERATURE, -1).gather(-1, rollout.sequences[:, 24:, None])
    assert (deinterleave(shifted.squeeze(-1), 6) - rollout.sampled_logps).abs().max() > 1e-2


def test_c_parallel_blocks_equal_each_block_generated_alone(model, rollout, batch):
    doc_ids, _, layout = batch
    logits = _forward(model, rollout)
    read = layout.read_positions()
    parallel = torch.log_softmax(logits[:, read.reshape(-1)] / TEMPERATURE, -1).view(4, 6, 3, -1)
    checked = 0
    for row in range(4):
        for k, anchor in enumerate(layout.anchors.tolist()):
            if not rollout.block_valid[row, k]:
                continue
            alone = torch.cat([doc_ids[row // 2, :anchor], rollout.generated[row, k]])[None]
            with torch.no_grad():
                causal = torch.log_softmax(model(input_ids=alone).logits[0] / TEMPERATURE, -1)
            for t in range(3):
                torch.testing.assert_close(parallel[row, k, t], causal[anchor - 1 + t], atol=1e-4, rtol=0)
                token = rollout.generated[row, k, t]
                assert abs(float(causal[anchor - 1 + t, token] - rollout.sampled_logps[row, k, t])) < 1e-4
            checked += 1
    assert checked == 22  # 2 × 6 + 2 × 5 valid blocks


def test_top_p_logps_are_renormalised(model, batch):
    doc_ids, doc_attention, layout = batch
    out = generate_blocks(model, doc_ids, doc_attention, layout, num_samples=1, temperature=1.0, top_p=0.5,
                          generator=torch.Generator().manual_seed(3))
    logits = _forward(model, out)
    plain = gather_generated_logps(logits, out.sequences, layout, 1.0)
    nucleus = gather_generated_logps(logits, out.sequences, layout, 1.0, top_p=0.5)
    torch.testing.assert_close(nucleus, out.sampled_logps, atol=1e-4, rtol=0)
    assert (out.sampled_logps >= plain - 1e-5).all() and (out.sampled_logps > plain + 1e-3).any()
    # renormalised: log p − log Σ_{nucleus} p, with the nucleus the smallest set of mass ≥ 0.5
    probs = torch.softmax(logits[:, layout.read_positions().reshape(-1)], -1).view(2, 6, 3, -1)
    ordered = probs.sort(-1, descending=True).values
    kept = (ordered.cumsum(-1) - ordered < 0.5)
    mass = (ordered * kept).sum(-1)
    torch.testing.assert_close(out.sampled_logps, plain - mass.log(), atol=1e-4, rtol=0)


def test_a_sampled_token_outside_the_training_forwards_nucleus_gets_its_temperature_log_prob(model, batch):
    """The training forward's logits differ from sampling's in the last bits (another width, train mode, bf16), so a
    token sampled at the nucleus' edge can fall outside it there: its log-prob is then the temperature one, finite,
    and the loss and its gradient stay finite (minus infinity made the loss inf or NaN)."""
    doc_ids, doc_attention, layout = batch
    out = generate_blocks(model, doc_ids, doc_attention, layout, num_samples=1, temperature=1.0,
                          generator=torch.Generator().manual_seed(3))  # sampled from the whole distribution
    logits = _forward(model, out).detach().requires_grad_(True)
    plain = gather_generated_logps(logits, out.sequences, layout, 1.0)
    tiny = gather_generated_logps(logits, out.sequences, layout, 1.0, top_p=1e-6)  # a nucleus of the top token alone
    outside = tiny != 0  # a token inside a one-token nucleus has log-prob 0
    assert outside.any() and torch.isfinite(tiny).all()
    torch.testing.assert_close(tiny[outside], plain[outside])
    tiny.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_greedy_and_eager_attention_agree_with_sdpa(model, batch):
    doc_ids, doc_attention, layout = batch
    eager = _tiny_llama("eager")
    first = generate_blocks(model, doc_ids, doc_attention, layout, num_samples=1, temperature=0.0)
    second = generate_blocks(eager, doc_ids, doc_attention, layout, num_samples=1, temperature=0.0)
    assert torch.equal(first.generated, second.generated)
    torch.testing.assert_close(first.sampled_logps, second.sampled_logps, atol=1e-4, rtol=0)


def test_flex_attention_block_mask_samples_and_scores_what_sdpa_does(model, rollout, batch, flex_reference):
    """A flex_attention model reads the strided rule as a BlockMask (every generation step's prefix, the full
    sequence, the frozen network's features) and gives SDPA's tokens, log-probs, logits and features. Forward only:
    a CPU has no flex_attention backward (a GPU run trains through it, bench/gpu_check.py)."""
    from rlft.models.features import hidden_features

    doc_ids, doc_attention, layout = batch
    flex = _tiny_llama("flex_attention")
    out = generate_blocks(flex, doc_ids, doc_attention, layout, num_samples=2, temperature=TEMPERATURE,
                          generator=torch.Generator().manual_seed(2))
    assert type(out.attention).__name__ == "BlockMask" and out.attention.shape == (4, 1, 42, 42)
    assert torch.equal(out.sequences, rollout.sequences)
    torch.testing.assert_close(out.sampled_logps, rollout.sampled_logps, atol=1e-5, rtol=0)
    with torch.no_grad():
        logits = flex(input_ids=out.sequences, attention_mask=out.attention, position_ids=out.position_ids).logits
    torch.testing.assert_close(logits, _forward(model, rollout), atol=1e-4, rtol=0)
    features = [hidden_features(network, rollout.sequences, None, [1, 2], position_ids=rollout.position_ids,
                                attention_4d=attention) for network, attention in ((flex, out.attention), (model, rollout.mask))]
    torch.testing.assert_close(features[0], features[1], atol=1e-4, rtol=0)


def test_document_nll_excludes_pads_and_matches_a_causal_forward(model, rollout, batch):
    doc_ids, doc_attention, _ = batch
    logits = _forward(model, rollout)
    nll, mask = document_nll(logits, doc_ids.repeat_interleave(2, 0), doc_attention.repeat_interleave(2, 0))
    assert nll.shape == (4, 23) and mask[:2].all() and mask[2:, :18].all() and not mask[2:, 18:].any()
    assert (nll[2:, 18:] == 0).all()
    with torch.no_grad():
        causal = torch.log_softmax(model(input_ids=doc_ids[:1]).logits[0, :-1], -1)
    expected = -causal.gather(-1, doc_ids[0, 1:, None]).squeeze(-1)
    torch.testing.assert_close(nll[0], expected, atol=1e-4, rtol=0)


def test_axolotl_strided_transforms_by_name(config):
    """Axolotl's strided examples name their transforms: ebft_pretrain.transform reads `question`, else `text`;
    ebft_strided_structured.transform reads a prompt and a completion; anything else is refused by name."""
    from rlft.data.formats.ebft import resolve_strided
    from rlft.errors import DataError

    cfg = config(rl="ebft", ebft={"mode": "strided"}, datasets=[{"path": "x.jsonl", "type": "ebft_pretrain.transform"}])
    pretrain = resolve_strided(cfg.datasets[0], cfg, 0, "datasets[0]", None)
    assert pretrain({"question": "def f(): pass", "text": "other"}) == {"text": "def f(): pass"}
    assert pretrain({"text": "x = 1"}) == {"text": "x = 1"}
    cfg = config(rl="ebft", ebft={"mode": "strided"}, datasets=[{"path": "x.jsonl", "type": "ebft_strided_structured.transform"}])
    structured = resolve_strided(cfg.datasets[0], cfg, 0, "datasets[0]", None)
    assert structured({"input": "q", "output": "a"}) == {"prompt": "q", "completion": "a"}
    cfg = config(rl="ebft", ebft={"mode": "strided"}, datasets=[{"path": "x.jsonl", "type": "alpaca"}])
    with pytest.raises(DataError, match="ebft_pretrain.transform"):
        resolve_strided(cfg.datasets[0], cfg, 0, "datasets[0]", None)


@pytest.mark.parametrize("kind", ["mistral", "gemma3_text"])  # every layer windowed; windowed and full layers mixed
def test_c_with_a_sliding_window_parallel_blocks_equal_each_block_alone(batch, kind):
    """A sliding-window model: the strided mask is limited to each layer's window (counted in position ids), so the
    parallel blocks still give what each block's own causal forward gives, which transformers windows itself; the
    flex_attention BlockMasks per layer type give the same logits."""
    from layout_checks import tiny_of_type

    doc_ids, doc_attention, layout = batch
    model = tiny_of_type(kind, vocab=260, window=5)
    out = generate_blocks(model, doc_ids, doc_attention, layout, num_samples=1, temperature=TEMPERATURE,
                          generator=torch.Generator().manual_seed(2))
    assert isinstance(out.attention, dict) == (kind == "gemma3_text")
    with torch.no_grad():
        logits = model(input_ids=out.sequences, attention_mask=out.attention, position_ids=out.position_ids).logits
    read = layout.read_positions()
    parallel = torch.log_softmax(logits[:, read.reshape(-1)] / TEMPERATURE, -1).view(2, 6, 3, -1)
    for row in range(2):
        for k, anchor in enumerate(layout.anchors.tolist()):
            if out.block_valid[row, k]:
                alone = torch.cat([doc_ids[row, :anchor], out.generated[row, k]])[None]
                with torch.no_grad():
                    causal = torch.log_softmax(model(input_ids=alone).logits[0] / TEMPERATURE, -1)
                torch.testing.assert_close(parallel[row, k], causal[anchor - 1: anchor + 2], atol=1e-4, rtol=0)
                torch.testing.assert_close(out.sampled_logps[row, k], causal[anchor - 1: anchor + 2].gather(
                    -1, out.generated[row, k, :, None])[:, 0], atol=1e-4, rtol=0)
    flex = tiny_of_type(kind, vocab=260, window=5)
    flex.set_attn_implementation("flex_attention")
    attention = model_attention(flex, layout, doc_attention, out.mask, 1)
    with torch.no_grad():
        flex_logits = flex(input_ids=out.sequences, attention_mask=attention, position_ids=out.position_ids).logits
    torch.testing.assert_close(flex_logits, logits, atol=1e-4, rtol=0)
