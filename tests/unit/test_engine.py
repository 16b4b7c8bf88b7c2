"""The in-process rollout engine: sampled-token log-probs come from the distribution sampled from."""

import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlft.data.tokenizer import byte_tokenizer
from rlft.models.logprobs import process_logits
from rlft.rollout.local import LocalEngine
from rlft.rollout.types import SamplingParams
# The decoder's graphs, guards, caches and recompiles are dynamo's work, the same under every backend: the tests of
# those compile with aot_eager (no C++ code generation). Inductor's own kernels are checked where the numbers are
# the point: test_the_compiled_decode_samples_what_the_eager_one_samples and the CPU pass test below.
DYNAMO_ONLY = "aot_eager"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from rlft.models.tiny import write_tiny_model

    folder = write_tiny_model(tmp_path_factory.mktemp("engine") / "m", "XS", max_positions=64)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).eval()
    tokenizer = byte_tokenizer()
    return LocalEngine(model, tokenizer.pad_token_id, tokenizer), tokenizer


def _teacher_forced(model, prompt, completion, temperature=1.0):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logps = torch.log_softmax(model(ids).logits[0, :-1] / temperature, -1)
    return [float(logps[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


def test_logprobs_match_a_teacher_forced_forward_with_left_padding(engine):
    eng, tok = engine
    prompts = [tok("12+34=")["input_ids"], tok("1+2=")["input_ids"]]  # different lengths: left padding in the batch
    torch.manual_seed(1)
    out = eng.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.7), 3)
    assert len(out.completion_ids) == 6 and out.prompt_ids[3] == prompts[1]
    for row in range(6):
        expected = _teacher_forced(eng.model, out.prompt_ids[row], out.completion_ids[row], temperature=0.7)
        assert out.logprobs[row] == pytest.approx(expected, abs=1e-4)


def test_top_k_logprobs_are_renormalised_over_the_kept_tokens():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    scores = process_logits(logits, None, SamplingParams(max_new_tokens=1, top_k=2))
    logp = torch.log_softmax(scores, -1)[0]
    z = math.exp(2.0) + math.exp(1.0)
    assert float(logp[0]) == pytest.approx(2.0 - math.log(z)) and float(logp[1]) == pytest.approx(1.0 - math.log(z))
    assert torch.isinf(logp[2:]).all()


def test_top_p_and_min_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(process_logits(logits, None, SamplingParams(max_new_tokens=1, top_p=0.8)))[0].tolist()
    assert kept == [True, True, False, False]  # 0.5 + 0.3 reaches 0.8
    kept = torch.isfinite(process_logits(logits, None, SamplingParams(max_new_tokens=1, min_p=0.5)))[0].tolist()
    assert kept == [True, True, False, False]  # p >= 0.5 * 0.5


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    logits = torch.tensor([[2.0, -1.0, 3.0]])
    seen = torch.tensor([[True, True, False]])
    scores = process_logits(logits, seen, SamplingParams(max_new_tokens=1, repetition_penalty=2.0))
    assert scores[0].tolist() == [1.0, -2.0, 3.0]


def test_greedy_stop_tokens_and_truncation(engine):
    eng, tok = engine
    prompt = [tok("7+7=")["input_ids"]]
    greedy = SamplingParams(max_new_tokens=5, temperature=0.0)
    first = eng.generate(prompt, greedy, 2)
    assert first.completion_ids[0] == first.completion_ids[1] and len(first.completion_ids[0]) == 5
    assert first.truncated == [True, True]
    stop_on = first.completion_ids[0][2]
    stopped = eng.generate(prompt, SamplingParams(max_new_tokens=5, temperature=0.0, stop_token_ids=[stop_on]))
    ends = first.completion_ids[0].index(stop_on) + 1
    assert stopped.completion_ids[0] == first.completion_ids[0][:ends] and stopped.truncated == [False]


def test_stop_strings_end_a_sequence(engine):
    eng, tok = engine
    prompt = [tok("7+7=")["input_ids"]]
    free = eng.generate(prompt, SamplingParams(max_new_tokens=6, temperature=0.0))
    text = tok.decode(free.completion_ids[0])
    stop = text[1:3]
    out = eng.generate(prompt, SamplingParams(max_new_tokens=6, temperature=0.0, stop_strings=[stop]))
    assert stop in tok.decode(out.completion_ids[0]) and len(out.completion_ids[0]) < 6 and out.truncated == [False]


@pytest.mark.slow
@pytest.mark.compile
def test_the_compiled_decode_samples_what_the_eager_one_samples(engine):
    """torch_compile: the static-cache, compiled decode step draws the same tokens at the same seed, with the same
    log-probs (to float32 rounding), for greedy and filtered sampling alike; weights loaded later are the ones it
    decodes with (the compiled graph reads the parameters, it does not bake them in)."""
    import copy

    eager, tok = engine
    fast = LocalEngine(copy.deepcopy(eager.model), tok.pad_token_id, tok, compiled=(None, "inductor"))
    prompts = [tok("12+34=")["input_ids"], tok("1+2=")["input_ids"], tok("7+7=")["input_ids"]]
    settings = [SamplingParams(max_new_tokens=12, temperature=0.0),
                SamplingParams(max_new_tokens=12, temperature=0.8, top_k=20, repetition_penalty=1.2),
                SamplingParams(max_new_tokens=70, temperature=1.0)]  # 70 new tokens: a longer cache than the first two
    for params in settings:
        a = eager.decode(prompts * 2, params, top_logprobs=2, generator=torch.Generator().manual_seed(3))
        b = fast.decode(prompts * 2, params, top_logprobs=2, generator=torch.Generator().manual_seed(3))
        assert a.completion_ids == b.completion_ids and a.truncated == b.truncated
        for row_a, row_b in zip(a.logprobs, b.logprobs):
            assert row_b == pytest.approx(row_a, abs=1e-5)
        assert [[[i for i, _ in step] for step in row] for row in a.top_logprobs] == \
               [[[i for i, _ in step] for step in row] for row in b.top_logprobs]
    moved = {name: p + 0.05 * torch.randn_like(p) for name, p in eager.model.named_parameters()}
    other = LocalEngine(copy.deepcopy(eager.model), tok.pad_token_id, tok)
    other.load_weights(moved, version=1)
    fast.load_weights(moved, version=1)
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    a, b = other.decode(prompts, params), fast.decode(prompts, params)
    assert a.completion_ids == b.completion_ids != eager.decode(prompts, params).completion_ids
    for row_a, row_b in zip(a.logprobs, b.logprobs):
        assert row_b == pytest.approx(row_a, abs=1e-5)


@pytest.mark.compile
def test_the_compiled_decode_of_a_sliding_window_model_samples_what_the_eager_one_samples_once_compiled():
    """Gemma 3 with a 3-token window on its first layer: the same tokens and log-probs as the eager engine, from one
    compiled graph. (transformers' sliding cache layer counts tokens in a Python int, which recompiled the step at
    every token until dynamo gave up and ran it eagerly: the decoder keeps every position in those layers too.)"""
    import copy

    from layout_checks import tiny_of_type

    tok = byte_tokenizer()
    model = tiny_of_type("gemma3_text", vocab=len(tok), window=3)
    eager = LocalEngine(model, tok.pad_token_id, tok)
    fast = LocalEngine(copy.deepcopy(model), tok.pad_token_id, tok, compiled=(None, DYNAMO_ONLY))
    prompts = [tok("12+34=")["input_ids"], tok("1+2=")["input_ids"]]
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):  # one graph for every token of both runs
        for params in (SamplingParams(max_new_tokens=12, temperature=0.0), SamplingParams(max_new_tokens=12, temperature=0.8)):
            a = eager.decode(prompts, params, generator=torch.Generator().manual_seed(3))
            b = fast.decode(prompts, params, generator=torch.Generator().manual_seed(3))
            assert a.completion_ids == b.completion_ids
            for row_a, row_b in zip(a.logprobs, b.logprobs):
                assert row_b == pytest.approx(row_a, abs=1e-5)


@pytest.mark.compile
def test_compiled_decoders_of_two_models_that_differ_inside_each_sample_what_their_eager_engines_sample():
    """Each compiled decoder keeps its own graphs, guarded by its tensors' shapes and the process's state only: two
    models whose inputs, cache and logits have one shape but whose MLPs differ in width (a graph of one run with the
    other's weights would fail or compute something else) each decode what their eager engine decodes, in one
    process, also when the first decodes again after the second."""
    import copy

    tok = byte_tokenizer()
    prompts = [tok("12+34=")["input_ids"], tok("1+2=")["input_ids"]]
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    models = []
    for width in (64, 96):
        config = AutoConfig.for_model("llama", vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=width, max_position_embeddings=64)
        torch.manual_seed(width)
        models.append(AutoModelForCausalLM.from_config(config).eval())
    pairs = [(LocalEngine(m, tok.pad_token_id, tok), LocalEngine(copy.deepcopy(m), tok.pad_token_id, tok, compiled=(None, DYNAMO_ONLY)))
             for m in models]
    for eager, fast in pairs + pairs[:1]:
        a = eager.decode(prompts, params, generator=torch.Generator().manual_seed(5))
        b = fast.decode(prompts, params, generator=torch.Generator().manual_seed(5))
        assert a.completion_ids == b.completion_ids
        for row_a, row_b in zip(a.logprobs, b.logprobs):
            assert row_b == pytest.approx(row_a, abs=1e-5)


@pytest.mark.compile
def test_a_compiled_decode_step_keeps_only_its_tensors_and_the_process_state_as_guards(engine, monkeypatch):
    """The guards dynamo built for a real decode step, filtered: what remains checks the tensors the step is called
    with (never a parameter) and the process's state (grad mode among them); module attributes are not checked."""
    import copy

    import rlft.rollout.compiled as compiled

    seen = []
    real = compiled.decoder_guards
    monkeypatch.setattr(compiled, "decoder_guards", lambda entries: seen.append(list(entries)) or real(entries))
    eager, tok = engine
    fast = LocalEngine(copy.deepcopy(eager.model), tok.pad_token_id, tok, compiled=(None, DYNAMO_ONLY))
    fast.decode([tok("1+2=")["input_ids"]], SamplingParams(max_new_tokens=3, temperature=0.0))
    assert len(seen) == 1 and fast.decoder.whole
    entries, kept = seen[0], real(seen[0])
    kept_types = {entry.guard_type for entry, keep in zip(entries, kept) if keep}
    assert kept_types <= {"TENSOR_MATCH"} | compiled.STATE_GUARDS and "GRAD_MODE" in kept_types
    assert not [entry for entry, keep in zip(entries, kept) if keep and isinstance(entry.value, torch.nn.Parameter)]
    assert {entry.guard_type for entry, keep in zip(entries, kept) if not keep} & {"TYPE_MATCH", "EMPTY_NN_MODULE_HOOKS_DICT"}


@pytest.mark.compile
def test_a_decode_step_that_breaks_into_several_graphs_keeps_dynamos_own_guards(engine):
    """A forward with a graph break in every decoder layer (here a hook; in practice remote code or data-dependent
    experts) compiles each layer's frame on its own: under the narrow guards the second layer would run the first
    layer's graph, cache index included. The decoder compiles it again with dynamo's own guards and samples what
    the eager engine samples."""
    import copy

    eager, tok = engine
    model = copy.deepcopy(eager.model)
    for layer in model.model.layers:
        layer.register_forward_pre_hook(lambda module, args: torch._dynamo.graph_break())
    fast = LocalEngine(model, tok.pad_token_id, tok, compiled=(None, "aot_eager"))  # dynamo's part is the same; no C++
    prompts = [tok("12+34=")["input_ids"], tok("1+2=")["input_ids"]]
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    a = eager.decode(prompts, params, generator=torch.Generator().manual_seed(2))
    b = fast.decode(prompts, params, generator=torch.Generator().manual_seed(2))
    assert not fast.decoder.whole
    assert a.completion_ids == b.completion_ids
    for row_a, row_b in zip(a.logprobs, b.logprobs):
        assert row_b == pytest.approx(row_a, abs=1e-5)


@pytest.mark.compile
def test_the_prefill_computes_the_last_positions_logits_only(engine):
    """No (B, T, V) logits block for a batch of prompts: the output layer sees one position per row, eager and compiled
    (at a real vocabulary, 256 rows of 512-token prompts would otherwise hold tens of GB of logits)."""
    import copy

    eager, tok = engine
    fast = LocalEngine(copy.deepcopy(eager.model), tok.pad_token_id, tok, compiled=(None, DYNAMO_ONLY))
    prompts = [tok("12+34=")["input_ids"], tok("1+2=")["input_ids"]]
    for decoder in (eager, fast):
        widths = []
        hook = decoder.model.get_output_embeddings().register_forward_pre_hook(lambda m, args: widths.append(args[0].shape[1]))
        try:
            decoder.decode(prompts, SamplingParams(max_new_tokens=3, temperature=0.0))
        finally:
            hook.remove()
        assert widths and set(widths) == {1}, widths


@pytest.mark.compile
def test_the_compiled_decoder_keeps_one_cache_per_batch_size_grown_to_the_longest(engine):
    """Prompt widths that need other cache lengths reuse the batch size's cache, or grow it (the old one freed): one
    cache per batch size, not one per length ever seen (a 7B model's cache for 256 rows of 1,536 tokens is ~22 GB).
    The samples are the eager engine's whatever cache length they ran in."""
    import copy

    eager, tok = engine
    fast = LocalEngine(copy.deepcopy(eager.model), tok.pad_token_id, tok, compiled=(None, DYNAMO_ONLY))
    short, long = [tok("1+2=")["input_ids"]] * 2, [tok("12+34=" * 12)["input_ids"]] * 2
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    for prompts in (short, long, short, short[:1]):
        assert fast.decode(prompts, params).completion_ids == eager.decode(prompts, params).completion_ids
    caches = fast.decoder._caches
    assert sorted(caches) == [1, 2] and caches[2][0] == 128 and caches[1][0] == 64  # 72 + 8 tokens needed 128


def test_a_policy_whose_logits_are_nan_stops_sampling_with_the_fix(engine):
    """The inverse CDF draws some token from NaN probabilities, with a NaN log-prob: the engine stops with its error,
    which names the fix."""
    import copy

    from rlft.errors import RolloutError

    eager, tok = engine
    broken = copy.deepcopy(eager.model)
    with torch.no_grad():
        broken.get_output_embeddings().weight.fill_(float("nan"))
    with pytest.raises(RolloutError, match="held NaN while sampling.*Lower learning_rate"):
        LocalEngine(broken, tok.pad_token_id, tok).decode([tok("1+2=")["input_ids"]], SamplingParams(max_new_tokens=3),
                                                          generator=torch.Generator().manual_seed(0))


@pytest.mark.compile
def test_on_a_cpu_the_compiled_step_stores_a_query_row_once_before_its_product_with_the_cache():
    """inductor computes a batched (1 x d) by (d x L) product on a CPU as a multiply and a sum over d in a loop over
    L, and inlines the row's producers into that loop: a decode step recomputed its query's rotary sine and cosine for
    every cached key. Compiled as a decoder's step (`compile_step`), the rotated row is stored in a buffer of its own
    before the product (two buffers); compiled without the decoder's pass, the product alone is (one). The values
    are eager's."""
    import re

    from torch._inductor.utils import run_and_get_code

    from rlft.rollout.compiled import compile_step

    def scores(query, angle, keys):
        rotated = query * torch.cos(angle) + query.flip(-1) * torch.sin(angle)
        return torch.bmm(rotated, keys.transpose(1, 2))

    query, angle, keys = torch.randn(4, 1, 16), torch.randn(4, 1, 16), torch.randn(4, 64, 16)
    plain = torch.compile(scores, dynamic=False, fullgraph=True, options={"cpp_wrapper": True})
    for step, stored in ((compile_step(scores, None, "inductor", cpu=True, whole=True), 2), (plain, 1)):
        out, code = run_and_get_code(step, query, angle, keys)  # (it resets dynamo first)
        assert torch.allclose(out, scores(query, angle, keys), atol=1e-5)
        assert len(set(re.findall(r"\bbuf\d+\b", "\n".join(code)))) == stored, code


@pytest.mark.compile
def test_the_compiled_decode_ends_rows_where_the_eager_one_does(engine):
    """A stop token ends some rows early, a stop string others, the rest run to max_new_tokens: the compiled decoder,
    whose step keeps the finished rows itself, returns the eager engine's completions and truncation flags, and its
    mask of a decode set once gives the eager engine's log-probs (whose mask grows a column per token)."""
    import copy

    eager, tok = engine
    fast = LocalEngine(copy.deepcopy(eager.model), tok.pad_token_id, tok, compiled=(None, DYNAMO_ONLY))
    prompts = [tok("12+34=")["input_ids"], tok("1+2=")["input_ids"], tok("7+7=")["input_ids"]]
    free = eager.decode(prompts, SamplingParams(max_new_tokens=8, temperature=0.0))
    stop_on = free.completion_ids[0][2]  # row 0 ends at its third token
    stop_text = tok.decode(free.completion_ids[1][3:5])
    cases = [SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=[stop_on]),
             SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=[stop_on], stop_strings=[stop_text]),
             SamplingParams(max_new_tokens=8, temperature=1.0, stop_token_ids=[stop_on])]
    for params in cases:
        a = eager.decode(prompts, params, generator=torch.Generator().manual_seed(1))
        b = fast.decode(prompts, params, generator=torch.Generator().manual_seed(1))
        assert a.completion_ids == b.completion_ids and a.truncated == b.truncated
        for row_a, row_b in zip(a.logprobs, b.logprobs):
            assert row_b == pytest.approx(row_a, abs=1e-5)
    # greedy, the stop token alone: each row is its free completion up to its first stop token, or all 8 tokens
    b = fast.decode(prompts, cases[0])
    assert b.completion_ids == [row[: row.index(stop_on) + 1] if stop_on in row else row for row in free.completion_ids]
    assert b.truncated == [stop_on not in row for row in free.completion_ids] and b.truncated[0] is False


@pytest.mark.compile
def test_the_compiled_decoder_draws_every_token_but_the_last_inside_its_step(engine, monkeypatch):
    """The eager engine draws each token with its own operators (`next_tokens`, once per token); the compiled decoder
    draws inside its step's graph, so per decode only the last token (which feeds no forward) is drawn outside it.
    The tokens are the eager engine's, greedy and sampled."""
    import copy

    from rlft.rollout import local

    eager, tok = engine
    fast = LocalEngine(copy.deepcopy(eager.model), tok.pad_token_id, tok, compiled=(None, DYNAMO_ONLY))
    prompts = [tok("12+34=")["input_ids"], tok("1+2=")["input_ids"]]
    outside = []
    real = local.next_tokens
    monkeypatch.setattr(local, "next_tokens", lambda *args: outside.append(1) or real(*args))
    for params in (SamplingParams(max_new_tokens=7, temperature=0.0), SamplingParams(max_new_tokens=7, temperature=1.0)):
        fast.decode(prompts, params, generator=torch.Generator().manual_seed(5))  # compiles
        completions = {}
        for decoder, draws in ((fast, 1), (eager, 7)):
            outside.clear()
            completions[draws] = decoder.decode(prompts, params, generator=torch.Generator().manual_seed(5)).completion_ids
            assert len(outside) == draws
        assert completions[1] == completions[7]


def test_distinct_prompts_by_hand():
    from rlft.rollout.prefill import distinct_prompts

    a, b, c = [1, 2], [3], [1, 2, 4]
    distinct, rows = distinct_prompts([a, b, a, c, b, a])
    assert distinct == [a, b, c] and rows.tolist() == [0, 1, 0, 2, 1, 0]
    assert distinct_prompts([a, b, c]) == ([a, b, c], None)  # no two the same: every row computes its own


@pytest.mark.compile
@pytest.mark.parametrize("copyable", [True, False])
def test_the_prefill_computes_each_distinct_prompt_once_and_every_row_samples_from_its_own_prompt(engine, monkeypatch,
                                                                                                  copyable):
    """A batch holding prompts several times, interleaved and of different lengths (left padding), runs one prefill
    row per distinct prompt, eager and compiled, and each row's log-probs are those of a teacher-forced forward of its
    own prompt and completion: a row given another prompt's keys and values would fail that. Where the cache cannot be
    copied row by row (`rows_copyable` False: layers other than plain keys and values), every row is computed again."""
    import copy

    from rlft.rollout import local

    eager, tok = engine
    fast = LocalEngine(copy.deepcopy(eager.model), tok.pad_token_id, tok, compiled=(None, DYNAMO_ONLY))
    monkeypatch.setattr(local, "rows_copyable", lambda cache: copyable)
    a, b, c = tok("12+34=")["input_ids"], tok("1+2=")["input_ids"], tok("7+77=")["input_ids"]
    prompts = [a, b, a, c, b, a]
    params = SamplingParams(max_new_tokens=6, temperature=0.9)
    for decoder in (eager, fast):
        rows = []
        hook = decoder.model.get_input_embeddings().register_forward_hook(lambda m, args, out: rows.append(out.shape))
        try:
            out = decoder.decode(prompts, params, generator=torch.Generator().manual_seed(2))
        finally:
            hook.remove()
        prefills = [shape[0] for shape in rows if shape[1] > 1]
        assert prefills == ([3] if copyable else [3, 6]) and rows[0][1] == len(a)  # distinct prompts; widest first
        assert all(shape[:2] == (6, 1) for shape in rows[len(prefills):])  # then one token for every row
        for prompt, completion, logps in zip(prompts, out.completion_ids, out.logprobs):
            assert logps == pytest.approx(_teacher_forced(eager.model, prompt, completion, temperature=0.9), abs=1e-4)


def test_only_models_whose_layers_are_all_attention_share_a_prompts_prefill():
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    from rlft.rollout.prefill import rows_copyable, shares_prompts

    holder = torch.nn.Module()
    holder.config = AutoConfig.for_model("qwen3_next")  # linear-attention layers keep a recurrent state per row
    assert not shares_prompts(holder)
    holder.config = AutoConfig.for_model("llama")
    assert shares_prompts(holder)

    def cache(*layers):
        for layer in layers:
            layer.lazy_initialization(torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4))
        return type("Cache", (), {"layers": list(layers)})()

    assert rows_copyable(cache(DynamicLayer(), DynamicLayer()))
    assert not rows_copyable(cache(DynamicLayer(), DynamicSlidingWindowLayer(sliding_window=2)))
    assert not rows_copyable(cache())
