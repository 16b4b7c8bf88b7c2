"""Which tokens carry the loss, with two real tokenizers and several chat templates.

GPT-2's byte-level BPE and the Llama/Mistral SentencePiece model both put the space before a word
into the word's token (`ĠParis`, `▁Paris`). Templates that separate the answer from the header with a
space (`[/INST] Paris`, `ASSISTANT: Paris`) therefore start the answer's first token with template
text; it must still be trained. Prompt + answer records must give the ids of the whole text.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlft.data.preference import tokenize_kto, tokenize_pair
from rlft.data.tokenize import IGNORE, tokenize_record

MISTRAL_V1 = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ ' [INST] ' + m['content'] + ' [/INST]' }}"
              "{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}{% endfor %}")
LLAMA2 = ("{% for m in messages %}{% if m['role'] == 'user' %}{{ bos_token + '[INST] ' + m['content'] + ' [/INST]' }}"
          "{% else %}{{ ' ' + m['content'] + ' ' + eos_token }}{% endif %}{% endfor %}")
VICUNA = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ 'USER: ' + m['content'] + ' ' }}"
          "{% else %}{{ 'ASSISTANT: ' + m['content'] + eos_token }}{% endif %}{% endfor %}")
ALPACA = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '### Instruction:\n' + m['content'] + '\n\n' }}"
          "{% else %}{{ '### Response:\n' + m['content'] + eos_token + '\n\n' }}{% endif %}{% endfor %}")
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

CHAT = [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris"},
        {"role": "user", "content": "And of Italy?"}, {"role": "assistant", "content": "Rome, of course."}]


def with_template(tokenizer, template: str):
    tokenizer = copy.deepcopy(tokenizer)  # the fixture is shared by the session
    if "<|im_start|>" in template:
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = template
    return tokenizer


def trained(tokenizer, example) -> list[str]:
    return tokenizer.convert_ids_to_tokens([t for t, label in zip(example["input_ids"], example["labels"]) if label != IGNORE])


# the exact tokens each pair trains on (assistant turns and their end-of-turn marker)
MISTRAL_CASES = {
    "mistral_v1": (MISTRAL_V1, ["▁Paris", "</s>", "▁Rome", ",", "▁of", "▁course", ".", "</s>"]),
    "llama2": (LLAMA2, ["▁Paris", "</s>", "▁Rome", ",", "▁of", "▁course", ".", "</s>"]),
    "vicuna": (VICUNA, ["▁Paris", "</s>", "▁Rome", ",", "▁of", "▁course", ".", "</s>"]),
    "alpaca": (ALPACA, ["Par", "is", "</s>", "R", "ome", ",", "▁of", "▁course", ".", "</s>"]),
    "chatml": (CHATML, ["Par", "is", "<|im_end|>", "R", "ome", ",", "▁of", "▁course", ".", "<|im_end|>"]),
}
GPT2_CASES = {
    "mistral_v1": (MISTRAL_V1, ["ĠParis", "<|endoftext|>", "ĠRome", ",", "Ġof", "Ġcourse", ".", "<|endoftext|>"]),
    "vicuna": (VICUNA, ["ĠParis", "<|endoftext|>", "ĠRome", ",", "Ġof", "Ġcourse", ".", "<|endoftext|>"]),
    "alpaca": (ALPACA, ["Paris", "<|endoftext|>", "R", "ome", ",", "Ġof", "Ġcourse", ".", "<|endoftext|>"]),
    "chatml": (CHATML, ["Paris", "<|im_end|>", "R", "ome", ",", "Ġof", "Ġcourse", ".", "<|im_end|>"]),
}


@pytest.mark.parametrize("name", sorted(MISTRAL_CASES))
def test_sentencepiece_trains_every_assistant_token(mistral_tokenizer, name):
    template, expected = MISTRAL_CASES[name]
    tokenizer = with_template(mistral_tokenizer, template)
    assert trained(tokenizer, tokenize_record({"messages": CHAT}, tokenizer, False, ["assistant"], "turn")) == expected


@pytest.mark.parametrize("name", sorted(GPT2_CASES))
def test_gpt2_bpe_trains_every_assistant_token(gpt2_tokenizer, name):
    template, expected = GPT2_CASES[name]
    tokenizer = with_template(gpt2_tokenizer, template)
    assert trained(tokenizer, tokenize_record({"messages": CHAT}, tokenizer, False, ["assistant"], "turn")) == expected


def test_user_turns_trained_when_asked(mistral_tokenizer):
    tokenizer = with_template(mistral_tokenizer, MISTRAL_V1)
    example = tokenize_record({"messages": CHAT}, tokenizer, False, ["user"], "none")
    assert trained(tokenizer, example) == ["▁What", "▁is", "▁the", "▁capital", "▁of", "▁France", "?", "▁And", "▁of", "▁Italy", "?"]


def test_sft_prompt_completion_ids_are_those_of_the_whole_text(mistral_tokenizer):
    # SentencePiece encodes "Paris" alone as ▁Paris, but after a newline as Par + is
    prompt = "### Instruction:\nWhat is the capital of France?\n\n### Response:\n"
    example = tokenize_record({"prompt": prompt, "completion": "Paris"}, mistral_tokenizer, False, [], "turn")
    whole = mistral_tokenizer(prompt + "Paris")["input_ids"]
    assert example["input_ids"] == whole + [mistral_tokenizer.eos_token_id]
    assert trained(mistral_tokenizer, example) == ["Par", "is", "</s>"]


@pytest.mark.parametrize("fixture", ["mistral_tokenizer", "gpt2_tokenizer"])
def test_pair_answers_are_cut_from_the_whole_text(request, fixture):
    tokenizer = request.getfixturevalue(fixture)
    prompt = tokenizer.bos_token + " [INST] What is the capital of France? [/INST]"
    example = tokenize_pair({"prompt": prompt, "chosen": " Paris" + tokenizer.eos_token, "rejected": " Lyon" + tokenizer.eos_token}, tokenizer)
    for side, answer in (("chosen", " Paris"), ("rejected", " Lyon")):
        whole = tokenizer(prompt + answer + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        assert example["prompt_ids"] + example[f"{side}_ids"] == whole
    space = "▁" if fixture == "mistral_tokenizer" else "Ġ"
    assert tokenizer.convert_ids_to_tokens(example["chosen_ids"]) == [space + "Paris", tokenizer.eos_token]
    assert tokenizer.convert_ids_to_tokens(example["prompt_ids"])[-1] == "]"


def test_pair_prompt_stops_before_a_token_the_answers_merge_into(gpt2_tokenizer):
    # "capital" + "ize" / "capital" + "s": BPE merges the prompt's last word with each answer
    example = tokenize_pair({"prompt": "The word is capital", "chosen": "ize", "rejected": "s"}, gpt2_tokenizer)
    for answer, side in (("ize", "chosen"), ("s", "rejected")):
        whole = gpt2_tokenizer("The word is capital" + answer)["input_ids"] + [gpt2_tokenizer.eos_token_id]
        assert example["prompt_ids"] + example[f"{side}_ids"] == whole
    assert gpt2_tokenizer.decode(example["prompt_ids"]) in ("The word is", "The word is capital")


def test_kto_completion_in_context(mistral_tokenizer):
    example = tokenize_kto({"prompt": "Q: 2+2?\nA:", "completion": "\n4", "label": True}, mistral_tokenizer)
    assert example["prompt_ids"] + example["completion_ids"] == mistral_tokenizer("Q: 2+2?\nA:\n4")["input_ids"] + [2]


def test_prompt_strings_that_hold_bos_do_not_get_a_second_one(mistral_tokenizer):
    from rlft.data.prompts import tokenize_prompt

    rendered = tokenize_prompt({"prompt": "<s> [INST] hi [/INST]"}, mistral_tokenizer, None)["prompt_ids"]
    plain = tokenize_prompt({"prompt": "[INST] hi [/INST]"}, mistral_tokenizer, None)["prompt_ids"]
    assert rendered.count(mistral_tokenizer.bos_token_id) == 1 and plain.count(mistral_tokenizer.bos_token_id) == 1


def test_chat_prompt_ids_are_the_start_of_the_training_ids(mistral_tokenizer):
    from rlft.data.prompts import tokenize_prompt

    tokenizer = with_template(mistral_tokenizer, CHATML)
    prompt = tokenize_prompt({"prompt": CHAT[:1]}, tokenizer, None)["prompt_ids"]
    assert tokenize_record({"messages": CHAT[:2]}, tokenizer, False, ["assistant"], "turn")["input_ids"][: len(prompt)] == prompt


def test_ebft_ground_truth_is_tokenised_after_its_prompt(mistral_tokenizer):
    from rlft.data.formats.ebft import tokenize_structured

    tokenizer = with_template(mistral_tokenizer, CHATML)
    example = tokenize_structured({"prompt": CHAT[:1], "ground_truth": "Paris"}, tokenizer, None)
    assert tokenizer.convert_ids_to_tokens(example["ground_truth_ids"]) == ["Par", "is", "</s>"]  # alone it would be ▁Paris


class RecordingModel(torch.nn.Module):
    """Stands in for a causal LM in generate_texts: records the ids it is given, generates nothing."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list[int]] = []

    def generate(self, input_ids, attention_mask, **_):
        self.seen += [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask)]
        return input_ids


def test_generate_chat_sees_the_ids_training_saw(mistral_tokenizer):
    """`rlft generate --chat` renders the template (which holds BOS): no second BOS from the tokenizer."""
    from rlft.models.generation import generate_texts

    tokenizer = with_template(mistral_tokenizer, MISTRAL_V1)
    tokenizer.pad_token = tokenizer.unk_token
    rendered = tokenizer.apply_chat_template(CHAT[:1], tokenize=False, add_generation_prompt=True)
    model = RecordingModel()
    generate_texts(model, tokenizer, [rendered], max_new_tokens=1, add_special_tokens=False)
    training = tokenize_record({"messages": CHAT[:2]}, tokenizer, False, ["assistant"], "turn")["input_ids"]
    assert model.seen == [training[: len(model.seen[0])]]
    assert model.seen[0].count(tokenizer.bos_token_id) == 1
    assert tokenizer.convert_ids_to_tokens(training[len(model.seen[0])]) == "▁Paris"


@pytest.mark.parametrize("name", sorted(__import__("rlft.data.chat_templates", fromlist=["TEMPLATES"]).TEMPLATES))
def test_named_templates_add_their_markers_and_train_only_the_answers(mistral_tokenizer, name):
    """Every shipped named template on the SentencePiece tokenizer: markers become single tokens (added as special
    tokens where missing), the answers and the end-of-turn marker are trained, nothing of the user turns is."""
    from rlft.data.chat_templates import TEMPLATES
    from rlft.data.tokenizer import apply_chat_template_setting, end_of_turn_token

    tokenizer = copy.deepcopy(mistral_tokenizer)
    apply_chat_template_setting(tokenizer, name, None)
    for marker in TEMPLATES[name][1]:
        assert len(tokenizer(marker, add_special_tokens=False)["input_ids"]) == 1, marker
    # gemma has no system role; mistral_v3_tekken writes the system message only into a last user message
    chat = CHAT if name in ("gemma", "mistral_v3_tekken") else [{"role": "system", "content": "Be brief."}, *CHAT]
    example = tokenize_record({"messages": chat}, tokenizer, False, ["assistant"], "turn")
    ids = [t for t, label in zip(example["input_ids"], example["labels"]) if label != IGNORE]
    eot = end_of_turn_token(tokenizer)
    # SentencePiece decodes ▁ as a space, in added tokens too (deepseek_v3's <｜end▁of▁sentence｜>)
    assert tokenizer.decode(ids).replace(" ", "") == f"Paris{eot}Rome,ofcourse.{eot}".replace("▁", "")


def test_a_template_the_tokenizer_has_wins_over_the_fallback(mistral_tokenizer):
    from rlft.data.tokenizer import apply_chat_template_setting

    tokenizer = copy.deepcopy(mistral_tokenizer)
    apply_chat_template_setting(tokenizer, "tokenizer_default_fallback_chatml", None)
    assert tokenizer.chat_template == __import__("rlft.data.chat_templates", fromlist=["TEMPLATES"]).TEMPLATES["chatml"][0]
    tokenizer.chat_template = MISTRAL_V1
    apply_chat_template_setting(tokenizer, "tokenizer_default_fallback_chatml", None)
    assert tokenizer.chat_template == MISTRAL_V1
