"""The Axolotl guide's rollout_func form: signatures, how generation_config is handed over, and that the log-probs
rlft computes for the returned texts are those of the distribution `generate` sampled them from."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.errors import RolloutError
from rlft.rollout.types import SamplingParams
from rlft.rollout.user_rollouts import call_user, completions_arguments, completions_rollout, rollout_form


def trl_form(prompts, trainer): ...
def guide(model, processing_class, prompts, generation_config=None): ...
def guide_kw(model, processing_class, prompts, **kwargs): ...
def guide_kwonly(model, processing_class, prompts, *, generation_config=None): ...
def guide_no_config(model, processing_class, prompts): ...
def guide_extra(model, processing_class, prompts, generation_config=None, extra=None): ...
def one(prompts): ...


@pytest.mark.parametrize("fn,form", [(trl_form, "trainer"), (guide, "completions"), (guide_kw, "completions"),
                                     (guide_kwonly, "completions"), (guide_no_config, "completions"),
                                     (guide_extra, "completions")])
def test_forms_are_told_apart_by_signature(fn, form):
    assert rollout_form(fn, "m.f") == form


def test_neither_form_shows_both():
    with pytest.raises(RolloutError, match=r"m.one\(prompts\) takes neither accepted form: write rollout_func\(prompts, trainer\)"):
        rollout_form(one, "m.one")


@pytest.mark.parametrize("fn,expected", [(guide, ((1,), {})), (guide_kw, ((), {"generation_config": 1})),
                                         (guide_kwonly, ((), {"generation_config": 1})), (guide_no_config, ((), {}))])
def test_generation_config_is_handed_over_as_the_function_takes_it(fn, expected):
    assert completions_arguments(fn, 1) == expected


def test_an_error_in_user_code_names_the_users_line():
    def broken(prompts):
        import json

        return json.loads("{")  # raises inside the standard library: the place reported is this line

    with pytest.raises(RolloutError, match=r"raised JSONDecodeError: .* at .*test_user_rollouts.py:\d+"):
        call_user(broken, "m.broken", [])


class Bytes:
    """A tokenizer whose ids are bytes (ids < 64 here), so decode and encode round-trip."""

    pad_token_id, eos_token_id = 0, 1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(text.encode("latin-1"))}

    def decode(self, ids, skip_special_tokens=False):
        return bytes(int(i) for i in ids).decode("latin-1")


@pytest.mark.parametrize("params", [
    SamplingParams(max_new_tokens=6, temperature=1.0, stop_token_ids=(1,)),  # generate must not add its top_k=50
    SamplingParams(max_new_tokens=6, temperature=0.7, top_k=5, stop_token_ids=(1,)),
    SamplingParams(max_new_tokens=6, temperature=1.0, top_p=0.8, repetition_penalty=1.3, stop_token_ids=(1,)),
], ids=["plain", "top_k", "top_p_repetition"])
def test_the_log_probs_are_those_generate_sampled_from(params):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                                         pad_token_id=0, eos_token_id=1)).eval()
    sampled: list[tuple[list[int], list[float]]] = []

    def rollout(model, processing_class, prompts, generation_config=None):
        texts = []
        for prompt in prompts:
            ids = torch.tensor([prompt["prompt_ids"]])
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=generation_config,
                                 output_scores=True, return_dict_in_generate=True)
            new = out.sequences[0, ids.shape[1]:].tolist()
            sampled.append((new, [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, new)]))
            texts.append(processing_class.decode([t for t in new if t != 1]))
        return texts

    prompts = [{"prompt": "ab", "prompt_ids": [20, 30, 40], "columns": {}}, {"prompt": "c", "prompt_ids": [50], "columns": {}}]
    out = completions_rollout(rollout, "m.rollout", model, Bytes(), prompts, 2, params, version=3)
    assert out.weight_versions == [3] * 4 and out.prompt_ids[1] == [20, 30, 40]
    for (ids, lps), completion, logprobs in zip(sampled, out.completion_ids, out.logprobs):
        assert completion[: len(ids)] == ids  # an EOS generate produced is the EOS rlft closes the text with
        assert torch.allclose(torch.tensor(logprobs[: len(ids)]), torch.tensor(lps), atol=1e-4)


@pytest.mark.parametrize("settings,words", [
    ({"use_vllm": True}, "generates with a local model, and trl.use_vllm samples on a server"),
    ({"ignore_eos": True}, "ignore_eos / stop cannot reach it"),
    ({"stop_strings": ("\n",)}, "ignore_eos / stop cannot reach it"),
])
def test_the_guide_form_is_refused_where_it_cannot_run(tmp_path, monkeypatch, settings, words):
    from types import SimpleNamespace

    from rlft.rollout.user_rollouts import load_rollout_func

    monkeypatch.chdir(tmp_path)
    (tmp_path / "guide_roll.py").write_text("def roll(model, processing_class, prompts, generation_config=None):\n    return []\n")
    base = {"use_vllm": False, "ignore_eos": False, "stop_strings": ()}
    assert load_rollout_func("guide_roll.roll", SimpleNamespace(**base))
    with pytest.raises(RolloutError, match=words):
        load_rollout_func("guide_roll.roll", SimpleNamespace(**{**base, **settings}))


def test_with_an_moe_routers_loss_on_a_failing_generate_is_told_to_turn_it_off(tiny_moe_dir):
    """The guide form gets the training model. With model_config: {output_router_logits: true} its forward computes the
    router's loss from a mask as wide as the sequence, which a generate step's router logits do not fit: the error
    says to pass output_router_logits=False to generate, with which the same function samples."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_moe_dir)
    config.output_router_logits = True
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()

    def rollout(model, processing_class, prompts, generation_config=None, **extra):  # the prompts left-padded together
        width = max(len(prompt["prompt_ids"]) for prompt in prompts)
        ids = torch.tensor([[0] * (width - len(p["prompt_ids"])) + p["prompt_ids"] for p in prompts])
        out = model.generate(input_ids=ids, attention_mask=(ids > 0).long(), generation_config=generation_config, **extra)
        return [processing_class.decode([t for t in row[width:].tolist() if t > 1]) for row in out]

    prompts = [{"prompt": "ab", "prompt_ids": [20, 30, 40], "columns": {}}, {"prompt": "c", "prompt_ids": [50], "columns": {}}]
    params = SamplingParams(max_new_tokens=4, temperature=1.0, stop_token_ids=(1,))
    with pytest.raises(RolloutError, match=r"m.rollout raised RuntimeError: .*The model's config sets output_router_logits "
                                           r"\(model_config\).* call model.generate\(\.\.\., output_router_logits=False\)"):
        completions_rollout(rollout, "m.rollout", model, Bytes(), prompts, 2, params, version=0)

    def turned_off(model, processing_class, prompts, generation_config=None):
        return rollout(model, processing_class, prompts, generation_config, output_router_logits=False)

    out = completions_rollout(turned_off, "m.turned_off", model, Bytes(), prompts, 2, params, version=0)
    assert len(out.completion_ids) == 4 and all(out.completion_ids)
