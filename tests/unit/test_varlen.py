"""SDPA per document (rlft.models.varlen): packed and flattened batches attend within each document on its own, for
the results of the padded rows, and only where a forward asks for it."""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface  # builds the registry with transformers' own SDPA before `calls` patches it
from transformers.integrations import sdpa_attention

from layout_checks import (EAGER_ONLY, assert_same_completion_results, assert_same_grads, completion_results,
                           sft_documents, sft_results, tiny_of_type)
from rlft.config.settings import resolve
from rlft.data.collate import document_bounds, flatten_rows, pad_batch, packed_batch
from rlft.models.masks import with_model_mask
from rlft.models.shared_prompts import SHARED_PROMPT_MODELS
from rlft.models.varlen import DOCUMENTS, KEYWORDS_DROPPED, is_unread


@pytest.fixture
def calls(monkeypatch):
    """The query length of every SDPA call the model makes."""
    seen = []
    real = sdpa_attention.sdpa_attention_forward
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward",
                        lambda module, query, *a, **k: seen.append(query.shape[2]) or real(module, query, *a, **k))
    return seen


def test_document_bounds_by_hand():
    document = torch.tensor([[0, 0, 1, 1, 1, -1], [0, 0, 0, 0, 1, 1]])
    assert document_bounds(document).tolist() == [0, 2, 5, 6, 10, 12]  # a run of padding is one; rows never merge
    assert document_bounds(torch.tensor([[0, 0, 0], [0, 0, 0]])).tolist() == [0, 3, 6]


def _rows(vocab=128):
    g = torch.Generator().manual_seed(4)
    out = []
    for prompt, completion in ((5, 4), (2, 7), (5, 0), (3, 1)):
        ids = torch.randint(1, vocab, (prompt + completion,), generator=g).tolist()
        out.append({"prompt_ids": ids[:prompt], "completion_ids": ids[prompt:], "loss_mask": [1] * completion, "advantage": 1.0})
    return out


@pytest.mark.parametrize("kind", [kind for kind in SHARED_PROMPT_MODELS if kind not in EAGER_ONLY])
def test_every_checked_model_type_attends_per_document_and_gets_the_padded_results(kind, calls):
    """batch_flattening: the flattened rows reach SDPA one document at a time (9, 9, 5, 4 tokens, per layer), with the
    padded rows' log-probs, entropies, sampling log-probs and gradients."""
    from rlft.data.collate import completion_batch

    model = tiny_of_type(kind)  # eval mode: GPT-2's and Seed-OSS's attention dropout would draw differently
    batch = completion_batch(_rows(), pad_id=0)
    valid = batch["attention_mask"][:, -batch["completion_width"]:].bool()
    padded = completion_results(model, batch, valid)
    del calls[:]
    flat = completion_results(model, {**batch, **flatten_rows(batch["input_ids"], batch["attention_mask"], True)}, valid)
    if kind in KEYWORDS_DROPPED:  # its layers do not pass the forward's keywords on: the whole sequence, masked
        assert set(calls) == {27}
    else:
        assert sorted(set(calls)) == [4, 5, 9], calls  # never the whole 27-token sequence
    assert_same_completion_results(flat, padded, grad_atol=1e-5)  # these models' gradients reach about 7


@pytest.mark.parametrize("kind", ["llama", "gemma3_text"])  # Gemma 3 with a 3-token window: each document's mask block
def test_packed_rows_attend_per_document_and_give_the_padded_loss(kind, calls):
    """sample_packing: rows of several documents, one ending in padding; the summed NLL and gradients of the
    documents padded one per row."""
    model = tiny_of_type(kind, window=3 if kind == "gemma3_text" else None).train()
    documents = sft_documents((5, 8, 3, 6), 128)
    results = [sft_results(model, batch)
               for batch in (pad_batch(documents, pad_id=0), packed_batch([documents[:3], documents[3:]], pad_id=0))]
    assert {5, 8, 3, 6} <= set(calls) and 16 not in calls  # the packed rows are 16 tokens wide
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    assert_same_grads(results[1][1], results[0][1], atol=1e-5)


def test_packed_rows_under_flash_attention_come_as_one_row_whose_position_ids_give_each_document(config, calls):
    """sample_packing with flash-attention and micro_batch_size 2: transformers finds packed documents from the position
    ids only in a batch of one row, so the recipe's micro-batch is its packed rows in one row. Flash-attention is not
    installed here: its documents are taken as transformers derives them from the position ids
    (`prepare_fa_kwargs_from_position_ids`), and attending within them gives the padded rows' loss."""
    from transformers.modeling_flash_attention_utils import _is_packed_sequence, prepare_fa_kwargs_from_position_ids

    from rlft.data.prepared import PreparedData
    from rlft.train.recipes.sft import SFTRecipe

    documents = sft_documents((5, 8, 3, 6, 9), 128)
    cfg = config(flash_attention=True, sample_packing=True, sequence_len=16, micro_batch_size=2, eval_batch_size=2)
    recipe = SFTRecipe(cfg, resolve(cfg), PreparedData(documents, documents, []), pad_id=0)
    batches = [recipe.train_plan.batch(indices) for indices in recipe.train_plan.epoch_order(0)] + recipe.eval_batches
    assert all(b["input_ids"].shape[0] == 1 and "documents" not in b for b in batches)
    assert any(b["input_ids"].shape[1] == 32 for b in batches)  # two packed rows of 16
    model = tiny_of_type("llama").train()
    padded = sft_results(model, pad_batch(documents, pad_id=0))
    flash_documents = []
    for batch in batches[:len(recipe.train_plan.epoch_order(0))]:
        assert _is_packed_sequence(batch["position_ids"], 1)
        (bounds, _), _ = prepare_fa_kwargs_from_position_ids(batch["position_ids"])
        flash_documents.append(sft_results(model, {**batch, "documents": bounds.long()}))
    torch.testing.assert_close(sum(loss for loss, _ in flash_documents), padded[0], rtol=1e-5, atol=1e-5)
    assert_same_grads({k: sum(g[k] for _, g in flash_documents) for k in padded[1]}, padded[1], atol=1e-5)
    assert 16 not in calls and 32 not in calls  # attention within each document, never over a whole row
    flash = tiny_of_type("llama")
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="one row"):  # two packed rows would each attend across their documents
        with_model_mask(flash, {**batches[0], "input_ids": batches[0]["input_ids"].view(2, 16), "documents": bounds})


def _flat_inputs():
    batch = flatten_rows(torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]]), True)
    return {"input_ids": batch["flat_input_ids"], "position_ids": batch["flat_position_ids"],
            "documents": batch["flat_documents"]}


def test_only_sdpa_uncompiled_checked_models_get_the_documents_and_others_the_block_mask():
    """SDPA on a checked model type: the boundaries and a 2-D mask without padding, no (T, T) mask. Eager attention,
    a compiled forward, a model type whose layers drop the keywords, or a checkpoint's own modeling code of a checked
    type (trust_remote_code): the block-causal mask, as the model reads it."""
    from transformers import LlamaForCausalLM

    from rlft.data.collate import documents_mask

    inputs = with_model_mask(tiny_of_type("llama"), _flat_inputs())
    assert inputs[DOCUMENTS].tolist() == [0, 3, 5] and is_unread(inputs["attention_mask"])
    assert inputs["attention_mask"].shape == (1, 1, 5, 5) and inputs["attention_mask"].untyped_storage().nbytes() == 1
    block = documents_mask(torch.tensor([0, 3, 5]), 1, 5)
    eager = tiny_of_type("llama")
    eager.set_attn_implementation("eager")
    remote = type("Llama", (LlamaForCausalLM,), {"__module__": "transformers_modules.someone.modeling_llama"})
    for model in (eager, torch.compile(tiny_of_type("llama")), tiny_of_type("stablelm"), remote(tiny_of_type("llama").config)):
        inputs = with_model_mask(model, _flat_inputs())
        assert DOCUMENTS not in inputs and "documents" not in inputs
        assert torch.equal(inputs["attention_mask"] == 0 if model is eager else inputs["attention_mask"], block)
    flash = tiny_of_type("llama")
    flash.config._attn_implementation = "flash_attention_2"  # (not run: no flash-attn here) packed rows, position ids only
    inputs = with_model_mask(flash, _flat_inputs())
    assert sorted(inputs) == ["input_ids", "position_ids"] and inputs["position_ids"].tolist() == [[0, 1, 2, 0, 1]]


def test_no_mask_is_built_for_sliding_window_layers(monkeypatch):
    """transformers builds a (T, T) mask for sliding-window layers from a 2-D mask (half of a tiny Gemma 3's forward at
    5,000 tokens, and 1 GiB at 32k); the per-row path gives it none to build."""
    from transformers import masking_utils

    def built(*args, **kwargs):
        raise AssertionError("a mask was built")

    for kind in ("gemma3_text", "mistral"):
        model = tiny_of_type(kind, window=3)
        monkeypatch.setitem(masking_utils.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, "sdpa", built)
        with torch.no_grad():
            model(**with_model_mask(model, _flat_inputs()))
        monkeypatch.undo()
        with pytest.raises(AssertionError, match="built"), torch.no_grad():  # a 2-D mask has one built
            monkeypatch.setitem(masking_utils.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, "sdpa", built)
            model(input_ids=torch.tensor([[1, 2, 3, 4, 5]]), attention_mask=torch.ones(1, 5, dtype=torch.long))
        monkeypatch.undo()


def test_a_layer_that_drops_the_boundaries_stops_the_forward():
    """A model whose layers do not hand the forward's keywords on to attention (remote code, a patched forward): the
    layer gets the stand-in mask without the boundaries, and the run stops with the fix rather than attending across
    documents."""
    model = tiny_of_type("llama")
    attention = model.model.layers[1].self_attn
    forward = attention.forward
    attention.forward = lambda *args, **kwargs: forward(*args, **{k: v for k, v in kwargs.items() if k != DOCUMENTS})
    from rlft.errors import ModelError

    with pytest.raises(ModelError, match="without its document boundaries.*KEYWORDS_DROPPED"), torch.no_grad():
        model(**with_model_mask(model, _flat_inputs()))


def test_forwards_without_documents_get_transformers_sdpa(calls):
    """With the wrapper installed, padded rows and a KV-cache decode: one SDPA call per layer over the whole rows, as
    without rlft."""
    from rlft.models.varlen import install

    assert install()
    model = tiny_of_type("llama")
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 2, 3, 4]]))
        model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2, do_sample=False)
    assert calls == [4, 4, 3, 3, 1, 1]


def test_another_librarys_sdpa_is_left_in_place(monkeypatch):
    """If something else (a kernel library) has replaced transformers' "sdpa" entry, rlft does not wrap it: the batch
    runs under its block mask."""
    from rlft.models.varlen import documents_attention

    foreign = lambda *a, **k: None  # noqa: E731
    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", foreign)
    inputs = with_model_mask(tiny_of_type("llama"), _flat_inputs())
    assert DOCUMENTS not in inputs and inputs["attention_mask"].shape == (1, 1, 5, 5)
    assert AttentionInterface._global_mapping["sdpa"] is foreign is not documents_attention


def test_a_lora_model_attends_per_document_too(calls):
    """rlft's adapters go through PEFT, whose forward must hand the boundaries on: the per-row path is taken and the
    gradients of the LoRA weights are the padded rows'."""
    from peft import LoraConfig, get_peft_model

    from rlft.data.collate import completion_batch

    model = get_peft_model(tiny_of_type("llama"), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                              init_lora_weights=False))
    batch = completion_batch(_rows(), pad_id=0)
    valid = batch["attention_mask"][:, -batch["completion_width"]:].bool()
    padded = completion_results(model, batch, valid)
    del calls[:]
    flat = completion_results(model, {**batch, **flatten_rows(batch["input_ids"], batch["attention_mask"], True)}, valid)
    assert sorted(set(calls)) == [4, 5, 9], calls
    assert_same_completion_results(flat, padded, grad_atol=1e-5)


def reference_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                          enable_gqa=False):
    """torch.nn.attention.varlen.varlen_attn as its documentation states it (the kernel is CUDA-only): documents
    between the cumulative lengths, each query attends the keys from `window_size[0]` positions before it (-1: all)
    to `window_size[1]` after it, in its own document; key/value heads shared by groups of query heads (GQA)."""
    assert cu_seq_q.dtype == torch.int32 and torch.equal(cu_seq_q, cu_seq_k) and max_q == max_k
    assert query.dtype == key.dtype == value.dtype, "the kernel takes one precision"
    assert max_q == int((cu_seq_q[1:] - cu_seq_q[:-1]).max()) and enable_gqa == (key.shape[1] != query.shape[1])
    if enable_gqa:
        key, value = (x.repeat_interleave(query.shape[1] // x.shape[1], dim=1) for x in (key, value))
    out = torch.empty_like(query)
    for start, end in zip(cu_seq_q[:-1].tolist(), cu_seq_q[1:].tolist()):
        q, k, v = (x[start:end].transpose(0, 1) for x in (query, key, value))  # (h, L, d)
        offset = torch.arange(end - start)[None, :] - torch.arange(end - start)[:, None]  # key minus query position
        allowed = (offset <= window_size[1] if window_size[1] >= 0 else True) & (
            offset >= -window_size[0] if window_size[0] >= 0 else True)
        scores = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
        out[start:end] = (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v).transpose(0, 1)
    return out


@pytest.mark.parametrize("window", [None, 5])
def test_one_flash_varlen_call_gives_what_the_documents_grouped_through_sdpa_give(monkeypatch, window):
    """On a CUDA GPU in bf16/fp16 every document runs through one call of PyTorch's variable-length flash-attention
    (the grouped SDPA calls' gathers cost more than the attention there). Its inputs as rlft passes them (cumulative
    lengths, longest document, causal window, GQA), to the kernel as documented, give the grouped path's outputs and
    gradients; the kernel itself is compared with the grouped path on a GPU (bench/gpu_check.py --only varlen)."""
    import torch.nn.attention.varlen as torch_varlen
    from types import SimpleNamespace

    from rlft.models import varlen

    monkeypatch.setattr(torch_varlen, "varlen_attn", reference_varlen_attn)
    bounds = torch.tensor([0, 7, 9, 12, 20, 21, 28])  # documents of 7, 2, 3, 8, 1, 7 tokens over 2 rows of 14
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True)
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(2, heads, 14, 8, generator=g, dtype=torch.float64) for heads in (4, 2, 2)]
    results = {}
    for flash in (True, False):
        monkeypatch.setattr(varlen, "flash_dtype", lambda *a, flash=flash: torch.float64 if flash else None)
        inputs = [x.clone().requires_grad_() for x in base]
        out, _ = varlen.documents_attention(module, *inputs, None, scaling=0.3, rlft_documents=bounds, sliding_window=window)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        results[flash] = [out] + [x.grad for x in inputs]
    assert out.shape == (2, 14, 4, 8)
    for flash_tensor, grouped in zip(results[True], results[False]):
        torch.testing.assert_close(flash_tensor, grouped)


def test_flash_varlen_gets_queries_keys_and_values_in_one_precision(monkeypatch):
    """Under autocast the rotary embedding leaves queries and keys in float32 and the values in bf16; the kernel gets
    all three in the precision flash_dtype chose (here float64, for an exact comparison on a CPU)."""
    import torch.nn.attention.varlen as torch_varlen
    from types import SimpleNamespace

    from rlft.models import varlen

    monkeypatch.setattr(torch_varlen, "varlen_attn", reference_varlen_attn)
    monkeypatch.setattr(varlen, "flash_dtype", lambda *a: torch.float64)
    bounds, module = torch.tensor([0, 5, 12]), SimpleNamespace(num_key_value_groups=1, is_causal=True)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=torch.Generator().manual_seed(i), dtype=torch.float64) for i in range(3))
    out, _ = varlen.documents_attention(module, q.float(), k.float(), v, None, rlft_documents=bounds, sliding_window=None)
    expected = reference_varlen_attn(*(x[0].transpose(0, 1) for x in (q.float().double(), k.float().double(), v)),
                                     bounds.int(), bounds.int(), 7, 7, window_size=(-1, 0))
    assert out.dtype == torch.float64
    torch.testing.assert_close(out[0], expected)


def test_flash_varlen_only_where_its_kernel_applies(monkeypatch):
    """bf16/fp16 on CUDA with head sizes flash-attention takes, in autocast's precision where autocast is on (the
    rotary embedding leaves queries and keys in float32 there, values in bf16); float32, CPU tensors, dropout, other
    head sizes and SDPA's extras (a bias, sinks, soft-capping) stay on the grouped SDPA path."""
    from rlft.models.varlen import flash_dtype

    class OnCuda(torch.Tensor):
        is_cuda = property(lambda self: True)

    def tensor(size=64, dtype=torch.bfloat16, cuda=True):
        x = torch.zeros(1, 4, 3, size, dtype=dtype)
        return x.as_subclass(OnCuda) if cuda else x

    kernel_runs = []  # PyTorch's own check (GPU generation, ROCm, head sizes): what it was asked, what it says
    monkeypatch.setattr(torch.backends.cuda, "can_use_flash_attention",
                        lambda params, debug: kernel_runs.append((params.query.dtype, params.key.shape, params.enable_gqa)) or True)
    bf16, fp16, fp32 = tensor(), tensor(dtype=torch.float16), tensor(dtype=torch.float32)
    assert flash_dtype(bf16, bf16, bf16, 0.0, {"sliding_window": 4, "softcap": None}) == torch.bfloat16
    assert kernel_runs == [(torch.bfloat16, (1, 4, 1, 64), False)]
    gqa = tensor()[:, :2]
    assert flash_dtype(bf16, gqa, gqa, 0.0, {}) == torch.bfloat16 and kernel_runs[-1] == (torch.bfloat16, (1, 2, 1, 64), True)
    assert flash_dtype(fp16, fp16, fp16, 0.0, {}) == torch.float16
    assert flash_dtype(fp32, fp32, fp32, 0.0, {}) is None
    assert flash_dtype(fp32, fp32, bf16, 0.0, {}) is None  # mixed without autocast: not what SDPA would compute
    cpu = tensor(cuda=False)
    assert flash_dtype(cpu, cpu, cpu, 0.0, {}) is None
    assert flash_dtype(bf16, bf16, bf16, 0.1, {}) is None
    assert flash_dtype(tensor(512), tensor(512), tensor(512), 0.0, {}) is None
    assert flash_dtype(bf16, bf16, tensor(32), 0.0, {}) is None
    for extra in ("position_bias", "s_aux", "sinks", "softcap"):
        assert flash_dtype(bf16, bf16, bf16, 0.0, {extra: torch.zeros(1)}) is None
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device="cpu": device == "cuda")  # CUDA autocast, as training
    for dtype in (torch.bfloat16, torch.float16):
        monkeypatch.setattr(torch, "get_autocast_dtype", lambda device, dtype=dtype: dtype)
        assert flash_dtype(fp32, fp32, tensor(dtype=dtype), 0.0, {}) == dtype
        assert flash_dtype(fp32, fp32, fp32, 0.0, {}) == dtype
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda device: torch.float32)
    assert flash_dtype(fp32, fp32, fp32, 0.0, {}) is None
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda device: torch.bfloat16)
    monkeypatch.setattr(torch.backends.cuda, "can_use_flash_attention", lambda params, debug: False)  # e.g. a T4, V100
    assert flash_dtype(fp32, fp32, fp32, 0.0, {}) is None
    monkeypatch.setattr(torch.backends.cuda, "can_use_flash_attention", lambda params, debug: True)
    monkeypatch.setattr(torch.version, "hip", "6.4")  # ROCm: not taken
    assert flash_dtype(fp32, fp32, fp32, 0.0, {}) is None


def test_attention_both_ways_is_refused_for_packed_rows():
    """Packed or flattened rows attend causally within each row; a model whose attention is bidirectional (Gemma 3
    with use_bidirectional_attention, EmbeddingGemma) would be trained causally without a word: refused."""
    from types import SimpleNamespace

    from rlft.errors import ModelError
    from rlft.models.varlen import documents_attention

    q = torch.zeros(1, 2, 4, 8)
    for module, is_causal in ((SimpleNamespace(is_causal=False), None), (SimpleNamespace(is_causal=True), False)):
        with pytest.raises(ModelError, match="attends both ways"):
            documents_attention(module, q, q, q, None, is_causal=is_causal, rlft_documents=torch.tensor([0, 4]))


@pytest.mark.compile
def test_a_compiled_forward_on_a_cpu_attends_short_rows_through_sdpas_math_path(monkeypatch):
    """A compiled forward on a CPU over at most MATH_KEYS keys runs SDPA's math path, which inductor fuses into the
    graph, not the CPU flash-attention kernel; eager forwards and longer rows keep SDPA's choice. The compiled
    forward and backward of left-padded short rows give the eager model's loss and gradients."""
    from torch.profiler import profile

    from layout_checks import tiny_of_type
    from rlft.models.varlen import MATH_KEYS, install, short_rows_kernel

    def math_only(keys: int) -> bool:
        q = torch.zeros(1, 2, 1, 8)
        with short_rows_kernel(q, torch.zeros(1, 2, keys, 8)):
            return not torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()

    assert not math_only(4)  # eager
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert math_only(MATH_KEYS) and not math_only(MATH_KEYS + 1)
    monkeypatch.undo()

    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", AttentionInterface._global_mapping["sdpa"])  # restored after
    assert install()
    # what an earlier test of this process left: a max-autotune compile turns the math path off, and dynamo keeps the
    # graphs it traced on transformers' shared code objects
    import rlft.models.varlen as varlen

    monkeypatch.setattr(varlen, "SHORT_ROWS_MATH", True)
    torch._dynamo.reset()
    model = tiny_of_type("llama").train()
    ids = torch.randint(0, 128, (4, 12))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0

    def loss_and_grads(forward):
        model.zero_grad()
        logits = forward(input_ids=ids, attention_mask=mask).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        return float(loss), {name: p.grad.clone() for name, p in model.named_parameters()}

    eager_loss, eager_grads = loss_and_grads(model)
    compiled = torch.compile(model)
    loss_and_grads(compiled)  # compiles
    with profile() as prof:
        loss, grads = loss_and_grads(compiled)
    assert not [e.key for e in prof.key_averages() if "flash_attention" in e.key]
    assert loss == pytest.approx(eager_loss, abs=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=1e-4, atol=1e-6)


@pytest.mark.compile
def test_a_forward_compiled_to_autotune_gemms_keeps_sdpas_kernel_for_short_rows(monkeypatch, config):
    """`torch_compile_mode: max-autotune` on a CPU: inductor's C++ batched-GEMM template fixes one batch size into the
    graph compiled for any (torch 2.13: an SFT run at size S failed at the epoch's last, smaller batch with "Expected
    size for first two dimensions of batch2 tensor"), so short rows keep SDPA's own kernel under the modes that
    autotune, or where inductor's settings autotune GEMMs; the other modes route them through the math path."""
    from layout_checks import tiny_of_type
    from rlft.models import varlen
    from rlft.train.wrap import compiled_forward

    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", AttentionInterface._global_mapping["sdpa"])  # restored after
    monkeypatch.setattr(varlen, "SHORT_ROWS_MATH", True)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    model = tiny_of_type("llama")
    q = torch.zeros(1, 2, 9, 8)
    for mode, math in (("max-autotune", False), (None, True), ("max-autotune-no-cudagraphs", False), ("default", True),
                       ("reduce-overhead", True)):
        compiled = compiled_forward(resolve(config(torch_compile=True, torch_compile_mode=mode)).model, model)
        assert compiled is not model and varlen.SHORT_ROWS_MATH is math
        with varlen.short_rows_kernel(q, q):
            assert torch.backends.cuda.flash_sdp_enabled() is not math, mode
    from torch._inductor import config as inductor

    for key in ("max_autotune", "max_autotune_gemm"):  # as TORCHINDUCTOR_MAX_AUTOTUNE(_GEMM)=1 sets them
        with inductor.patch({key: True}):
            compiled_forward(resolve(config(torch_compile=True)).model, model)
            assert not varlen.SHORT_ROWS_MATH, key
