"""Named chat templates (`chat_template: NAME`), written for rlft in the layouts of Axolotl's names.

Each entry is the jinja text and the marker tokens it needs: markers the tokenizer does not have as
single tokens are added as special tokens (and the embeddings grow to match), so a marker is never
trained split into pieces. Axolotl names whose templates rlft does not ship (the long vendor
templates with tools, thinking or images) validate; `train` says to use the checkpoint's own
template (`tokenizer_default`) or `chat_template_jinja`.
"""

from __future__ import annotations

from rlft.models.tokenizer import CHATML_TEMPLATE, LLAMA3_TEMPLATE


def _turns(body: str, generation: str = "", head: str = "{{ bos_token }}") -> str:
    """`head`, then `body` for each message, then `generation` when add_generation_prompt is set."""
    return f"{head}{{% for m in messages %}}{body}{{% endfor %}}{{% if add_generation_prompt %}}{generation}{{% endif %}}"


_SYSTEM_INTO_FIRST_USER = "{% set ns = namespace(system='') %}"

TEMPLATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "chatml": (CHATML_TEMPLATE, ("<|im_start|>", "<|im_end|>")),
    "llama3": (LLAMA3_TEMPLATE, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    "alpaca": (_turns("{% if m['role'] == 'system' %}{{ m['content'] + '\\n\\n' }}"
                      "{% elif m['role'] == 'user' %}{{ '### Instruction:\\n' + m['content'] + '\\n\\n' }}"
                      "{% elif m['role'] == 'assistant' %}{{ '### Response:\\n' + m['content'] + eos_token + '\\n\\n' }}{% endif %}",
                      "{{ '### Response:\\n' }}"), ()),
    # Mistral v1 / Llama-2 style: the system message goes in front of the first user message
    "mistral_v1": (_turns("{% if m['role'] == 'system' %}{% set ns.system = m['content'] + '\\n\\n' %}"
                          "{% elif m['role'] == 'user' %}{{ ' [INST] ' + ns.system + m['content'] + ' [/INST]' }}{% set ns.system = '' %}"
                          "{% elif m['role'] == 'assistant' %}{{ ' ' + m['content'] + eos_token }}{% endif %}",
                          head="{{ bos_token }}" + _SYSTEM_INTO_FIRST_USER), ()),
    "mistral_v2v3": (_turns("{% if m['role'] == 'system' %}{% set ns.system = m['content'] + '\\n\\n' %}"
                            "{% elif m['role'] == 'user' %}{{ '[INST] ' + ns.system + m['content'] + '[/INST]' }}{% set ns.system = '' %}"
                            "{% elif m['role'] == 'assistant' %}{{ ' ' + m['content'] + eos_token }}{% endif %}",
                            head="{{ bos_token }}" + _SYSTEM_INTO_FIRST_USER), ()),
    "gemma": (_turns("{% if m['role'] == 'system' %}{{ raise_exception('gemma has no system role') }}{% endif %}"
                     "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' + m['content'] | trim"
                     " + '<end_of_turn>\\n' }}", "{{ '<start_of_turn>model\\n' }}"), ("<start_of_turn>", "<end_of_turn>")),
    "phi_3": (_turns("{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}", "{{ '<|assistant|>\\n' }}"),
              ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")),
    "phi_35": (_turns("{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}", "{{ '<|assistant|>\\n' }}", head=""),
               ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")),
    # ChatML with Qwen 2.5's default system message
    "qwen_25": ("{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
                "You are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
                + _turns("{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}", "{{ '<|im_start|>assistant\\n' }}",
                         head=""), ("<|im_start|>", "<|im_end|>")),
    "metharme": (_turns("{% if m['role'] == 'system' %}{{ '<|system|>' + m['content'] }}{% elif m['role'] == 'user' %}"
                        "{{ '<|user|>' + m['content'] | trim }}{% elif m['role'] == 'assistant' %}{{ '<|model|>' + m['content'] | trim"
                        " + eos_token }}{% endif %}", "{{ '<|model|>' }}"), ("<|system|>", "<|user|>", "<|model|>")),
    "cohere": (_turns("{{ '<|START_OF_TURN_TOKEN|>' + {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>', "
                      "'assistant': '<|CHATBOT_TOKEN|>'}[m['role']] + m['content'] | trim + '<|END_OF_TURN_TOKEN|>' }}",
                      "{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}"),
               ("<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>")),
    "deepseek_v2": (_turns("{% if m['role'] == 'system' %}{{ m['content'] + '\\n\\n' }}{% elif m['role'] == 'user' %}"
                           "{{ '<｜User｜>' + m['content'] }}{% elif m['role'] == 'assistant' %}{{ '<｜Assistant｜>' + m['content']"
                           " + eos_token }}{% endif %}", "{{ '<｜Assistant｜>' }}"), ("<｜User｜>", "<｜Assistant｜>")),
    "exaone": ("{% if messages[0]['role'] != 'system' %}{{ '[|system|][|endofturn|]\\n' }}{% endif %}"
               + _turns("{{ '[|' + m['role'] + '|]' + m['content'] }}{{ '\\n' if m['role'] == 'user' else '[|endofturn|]\\n' }}",
                        "{{ '[|assistant|]' }}", head=""), ("[|system|]", "[|user|]", "[|assistant|]", "[|endofturn|]")),
}

# Axolotl's other names: they validate; train asks for the checkpoint's own template instead
NOT_SHIPPED = ("mistral_v3_tekken", "mistral_v7_tekken", "llama3_2_vision", "llama4", "deepseek_v3", "jamba", "qwen3", "qwen3_5",
               "falcon_h1", "nemotron_h", "exaone4", "pixtral", "llava", "qwen2_vl", "gemma3", "gemma3n", "gemma4", "gemma4_unified",
               "command_a", "command_a_tool_use", "command_a_rag", "aya")
NAMES = ("tokenizer_default", "jinja", *TEMPLATES, *NOT_SHIPPED)


def add_missing_markers(tokenizer, name: str) -> list[str]:
    """Add the named template's markers the tokenizer lacks as special tokens; the ones added."""
    vocab = tokenizer.get_vocab()
    missing = [marker for marker in TEMPLATES[name][1] if marker not in vocab]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    return missing
