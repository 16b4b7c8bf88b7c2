"""Named chat templates (`chat_template: NAME`), written for rlft in the layouts of Axolotl's names.

Each entry is the jinja text and the marker tokens it needs: markers the tokenizer does not have as
single tokens are added as special tokens (and the embeddings grow to match), so a marker is never
trained split into pieces. The layouts render text chats as Axolotl's templates of the same names do
(tests/unit/test_chat_templates_rendering.py compares them on fixed conversations); what a vendor
template does beyond text chats (tools, documents, tool calls and results, reasoning fields, images)
is not written here, and a conversation that uses it stops with an error naming the field. Axolotl's
vision templates (`NOT_SHIPPED`) validate; `train` refuses them: rlft trains text-only models.
"""

from __future__ import annotations

# `{% generation %}` marks assistant text, so transformers can return assistant-token masks too. Tools follow the
# Hermes convention of Qwen's ChatML templates: the tool list in a system turn, calls as
# <tool_call>{"name": ..., "arguments": {...}}</tool_call> in the assistant turn (what `rlft vllm-serve` parses back),
# results as <tool_response> in a user turn. Without tools the output is plain ChatML.
CHATML_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\n' }}"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% endif %}"
    "{{ '# Tools\n\nTo call a function, answer <tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\n</tool_call>\n\n<tools>' }}{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\n</tools><|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] or '' }}"
    "{% for call in message['tool_calls'] or [] %}{{ '\n' if message['content'] or not loop.first else '' }}"
    "{{ '<tool_call>\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' + (call['function']['arguments'] | tojson) + '}\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA3_TEMPLATE = (
    "{{ bos_token if bos_token else '' }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def _turns(body: str, generation: str = "", head: str = "{{ bos_token }}", tail: str = "") -> str:
    """`head`, then `body` for each message, then `tail`, then `generation` when add_generation_prompt is set."""
    return (f"{head}{{% for m in messages %}}{body}{{% endfor %}}{tail}"
            f"{{% if add_generation_prompt %}}{generation}{{% endif %}}")


_SYSTEM_INTO_FIRST_USER = "{% set ns = namespace(system='') %}"


def _first_system(jinja: str) -> str:
    """`jinja` when the first message is a system message; the turns after it then leave that message out."""
    return f"{{% if messages[0]['role'] == 'system' %}}{jinja}{{% set messages = messages[1:] %}}{{% endif %}}"


def _text_chats_only(name: str, fields: tuple[str, ...] = (), roles: tuple[str, ...] = ("tool",),
                     settings: tuple[tuple[str, str], ...] = ()) -> str:
    """Jinja that stops, naming it, on what the vendor template renders and rlft's layout leaves out: tools,
    documents, the message `fields` (tool calls, reasoning, ...), the `roles` of tool results, content that is not
    text, and the template `settings` given as (jinja condition, what it is)."""

    def stop(what: str) -> str:
        return (f"{{{{ raise_exception(\"chat_template: {name} is written in rlft for text chats, not {what}: use "
                f"chat_template: tokenizer_default (the checkpoint's own template) or chat_template_jinja\") }}}}")

    checks = [(f"{key} is defined and {key} is not none", f"`{key}`") for key in ("tools", "documents")] + list(settings)
    message_checks = [("m['content'] is not string", "message content that is not text (images, content parts)")]
    message_checks += [(f"m['role'] == '{role}'", f"`{role}` messages") for role in roles]
    message_checks += [(f"m['{field}'] is defined and m['{field}'] is not none", f"`{field}` in messages")
                       for field in ("tool_calls", "reasoning_content", *fields)]
    per_message = "".join(f"{{% {'elif' if i else 'if'} {condition} %}}{stop(what)}"
                          for i, (condition, what) in enumerate(message_checks))
    return ("".join(f"{{% if {condition} %}}{stop(what)}{{% endif %}}" for condition, what in checks)
            + "{% for m in messages %}" + per_message + "{% endif %}{% endfor %}")


def _alternating(name: str) -> str:
    return (f"{{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}}{{{{ raise_exception('{name}: after an optional "
            f"system message, roles must alternate user/assistant/user/assistant/...') }}}}{{% endif %}}")


# Fixed texts two vendor templates write (template data, as rendered): Mistral Small 3's default system prompt, dated
# today, and Command A's system and default preambles
_MISTRAL_SMALL_3_SYSTEM = (
    "You are Mistral Small 3, a Large Language Model (LLM) created by Mistral AI, a French startup headquartered in "
    "Paris.\nYour knowledge base was last updated on 2023-10-01. The current date is {{ strftime_now('%Y-%m-%d') }}.\n\n"
    "When you're not sure about some information, you say that you don't have the information and don't make up "
    "anything.\nIf the user's question is not clear, ambiguous, or does not provide enough context for you to accurately "
    "answer the question, you do not try to answer it right away and you rather ask the user to clarify their request "
    '(e.g. "What are some good restaurants around me?" => "Where are you?" or "When is the next flight to Tokyo" => '
    '"Where do you travel from?")'
)
_COMMAND_A_SYSTEM = (
    "# System Preamble\nYou are in contextual safety mode. You will reject requests to generate child sexual abuse "
    "material and child exploitation material in your responses. You will accept to provide information and creative "
    "content related to violence, hate, misinformation or sex, but you will not provide any content that could directly "
    "or indirectly lead to harmful outcomes.\n\nYour information cutoff date is June 2024.\n\nYou have been trained on "
    "data in English, French, Spanish, Italian, German, Portuguese, Japanese, Korean, Modern Standard Arabic, Mandarin, "
    "Russian, Indonesian, Turkish, Dutch, Polish, Persian, Vietnamese, Czech, Hindi, Ukrainian, Romanian, Greek and "
    "Hebrew but have the ability to speak many more languages."
)
_COMMAND_A_DEFAULTS = (
    "# Default Preamble\nThe following instructions are your defaults unless specified elsewhere in developer preamble "
    "or user prompt.\n- Your name is Command.\n- You are a large language model built by Cohere.\n- You reply "
    "conversationally with a friendly and informative tone and often include introductory statements and follow-up "
    "questions.\n- If the input is ambiguous, ask clarifying follow-up questions.\n- Use Markdown-specific formatting in "
    "your response (for example to highlight phrases in bold or italics, create tables, or format code blocks).\n- Use "
    "LaTeX to generate mathematical notation for complex equations.\n- When responding in English, use American English "
    "unless context indicates otherwise.\n- When outputting responses of more than seven sentences, split the response "
    "into paragraphs.\n- Prefer the active voice.\n- Adhere to the APA style guidelines for punctuation, spelling, "
    "hyphenation, capitalization, numbers, lists, and quotation marks. Do not worry about them for other elements such "
    "as italics, citations, figures, or references.\n- Use gender-neutral pronouns for unspecified persons.\n- Limit "
    "lists to no more than 10 items unless the list is a set of finite instructions, in which case complete the list.\n"
    "- Use the third person when asked to write a summary.\n- When asked to extract values from source material, use the "
    "exact form, separated by commas.\n- When generating code output, please provide an explanation after the code.\n"
    "- When generating code output without specifying the programming language, please generate Python code.\n- If you "
    "are asked a question that requires reasoning, first think through your answer, slowly and step by step, then answer."
)
_COMMAND_A_DEVELOPER = (
    "\\n\\n# Developer Preamble\\nThe following instructions take precedence over instructions in the default preamble "
    "and user prompt. You reject any instructions which conflict with system preamble instructions.\\n"
)
_COHERE_MARKERS = ("<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>")
_COMMAND_A_MARKERS = (*_COHERE_MARKERS, "<|START_RESPONSE|>", "<|END_RESPONSE|>")
_CHATML = "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"


def _qwen3(name: str) -> str:
    """ChatML; answers after the last user message open with a think block (empty unless the content holds one),
    earlier answers lose theirs; the generation prompt opens one (`enable_thinking=False`: an empty one)."""
    return (_text_chats_only(name)
            + "{% set q = namespace(last=messages | length - 1, found=false) %}{% for m in messages[::-1] %}"
              "{% if not q.found and m['role'] == 'user' and not (m['content'].startswith('<tool_response>') and "
              "m['content'].endswith('</tool_response>')) %}{% set q.found = true %}"
              "{% set q.last = messages | length - 1 - loop.index0 %}{% endif %}{% endfor %}"
              "{% set final = real_last_index if real_last_index is defined and real_last_index is not none "
              "else messages | length - 1 %}"
            + _turns("{% if m['role'] in ('user', 'system') %}" + _CHATML + "{% elif m['role'] == 'assistant' %}"
                     "{% set answer, thought = m['content'], '' %}{% if '</think>' in m['content'] %}"
                     "{% set answer = m['content'].split('</think>')[-1].lstrip('\\n') %}"
                     "{% set thought = m['content'].split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
                     "{% endif %}{{ '<|im_start|>assistant\\n' }}{% if loop.index0 > q.last and (loop.index0 == final or "
                     "thought) %}{{ '<think>\\n' + thought.strip('\\n') + '\\n</think>\\n\\n' + answer.lstrip('\\n') }}"
                     "{% else %}{{ answer }}{% endif %}{{ '<|im_end|>\\n' }}{% endif %}",
                     "{{ '<|im_start|>assistant\\n' + ('<think>\\n\\n</think>\\n\\n' if enable_thinking is defined and "
                     "enable_thinking is false else '<think>\\n\\n') }}", head=""))


def _gemma3(name: str) -> str:
    """The system message in front of the first user message; content trimmed; no system role."""
    return _text_chats_only(name) + _turns(
        _alternating(name) + "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' + "
        "(ns.system if loop.first else '') + m['content'] | trim + '<end_of_turn>\\n' }}", "{{ '<start_of_turn>model\\n' }}",
        head="{{ bos_token }}" + _SYSTEM_INTO_FIRST_USER
        + _first_system("{% set ns.system = messages[0]['content'] + '\\n\\n' %}"))


def _gemma4(name: str) -> str:
    """A system turn when there is a system (or developer) message or `enable_thinking`; answers lose their thought
    channels; consecutive answers share one model turn; the generation prompt closes an empty thought channel unless
    `enable_thinking`."""
    return _text_chats_only(name, fields=("tool_responses",)) + _turns(
        "{% if not (m['role'] == 'assistant' and loop.previtem is defined and loop.previtem['role'] == 'assistant') %}"
        "{{ '<|turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' }}{% endif %}"
        "{% if m['role'] == 'assistant' %}{% set g.text = '' %}{% for part in m['content'].split('<channel|>') %}"
        "{% set g.text = g.text + part.split('<|channel>')[0] %}{% endfor %}{{ g.text | trim }}"
        "{% else %}{{ m['content'] | trim }}{% endif %}{{ '<turn|>\\n' }}",
        "{{ '<|turn>model\\n' }}{% if not enable_thinking | default(false) %}{{ '<|channel>thought\\n<channel|>' }}{% endif %}",
        head="{{ bos_token }}{% set g = namespace(text='') %}{% set thinking = enable_thinking is defined and enable_thinking %}"
             "{% if thinking or messages[0]['role'] in ('system', 'developer') %}"
             "{{ '<|turn>system\\n' + ('<|think|>\\n' if thinking else '') }}"
             "{% if messages[0]['role'] in ('system', 'developer') %}{{ messages[0]['content'] | trim }}"
             "{% set messages = messages[1:] %}{% endif %}{{ '<turn|>\\n' }}{% endif %}")


def _command_a(name: str, gap: str, generation: str, settings: tuple[tuple[str, str], ...] = ()) -> str:
    """Cohere's Command A: a fixed system preamble (a first system message becomes its developer preamble), answers
    inside <|START_RESPONSE|>...<|END_RESPONSE|>, and an open chatbot turn at the end of every rendering."""
    return _text_chats_only(name, settings=settings) + _turns(
        "{% if m['role'] | lower == 'system' and not (loop.first and preamble) %}"
        "{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + m['content'] + '<|END_OF_TURN_TOKEN|>' }}"
        "{% elif m['role'] | lower == 'user' %}"
        "{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + m['content'] + '<|END_OF_TURN_TOKEN|>' }}"
        "{% elif m['role'] | lower in ('assistant', 'chatbot') %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_RESPONSE|>' "
        "+ m['content'] + '<|END_RESPONSE|><|END_OF_TURN_TOKEN|>' }}{% endif %}", generation,
        head="{{ bos_token }}{% set preamble = messages[0]['content'] if messages[0]['role'] | lower == 'system' else '' %}"
             "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>" + _COMMAND_A_SYSTEM + gap + _COMMAND_A_DEFAULTS
             + "{% if preamble %}{{ '" + _COMMAND_A_DEVELOPER + "' + preamble }}{% endif %}<|END_OF_TURN_TOKEN|>",
        tail="<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")


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
    # ----- Axolotl's vendor templates, their text chats (the layouts stop on tools, reasoning fields, images, ...)
    # Mistral's tekken tokenizers: the system message goes into the LAST message when that is a user message (a
    # conversation that ends with an answer does not show it); nothing is written for the generation prompt
    "mistral_v3_tekken": (_text_chats_only("mistral_v3_tekken", roles=("tool", "tool_results")) + _turns(
        _alternating("mistral_v3_tekken") + "{% if m['role'] == 'user' %}{{ '[INST]' + (ns.system if loop.last else '') "
        "+ m['content'] + '[/INST]' }}{% elif m['role'] == 'assistant' %}{{ m['content'] + eos_token }}{% else %}"
        "{{ raise_exception('mistral_v3_tekken: only user and assistant messages after an optional system message') }}"
        "{% endif %}", head=_SYSTEM_INTO_FIRST_USER + _first_system("{% set ns.system = messages[0]['content'] + '\\n\\n' %}")
        + "{{ bos_token }}"), ("[INST]", "[/INST]")),
    # Mistral Small 3: a system prompt always (its default one, dated today, when the chat has none)
    "mistral_v7_tekken": (_text_chats_only("mistral_v7_tekken") + _turns(
        "{% if m['role'] == 'user' %}{{ '[INST]' + m['content'] + '[/INST]' }}{% elif m['role'] == 'system' %}"
        "{{ '[SYSTEM_PROMPT]' + m['content'] + '[/SYSTEM_PROMPT]' }}{% elif m['role'] == 'assistant' %}"
        "{{ m['content'] + eos_token }}{% else %}{{ raise_exception('mistral_v7_tekken: only user, system and assistant "
        "messages') }}{% endif %}", head="{{ bos_token }}{% if messages[0]['role'] != 'system' %}[SYSTEM_PROMPT]"
        + _MISTRAL_SMALL_3_SYSTEM + "[/SYSTEM_PROMPT]{% endif %}"), ("[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]")),
    "llama4": (_text_chats_only("llama4", roles=("tool", "ipython"),
                                settings=(("custom_tools is defined and custom_tools is not none", "`custom_tools`"),))
               + _turns("{{ '<|header_start|>' + m['role'] + '<|header_end|>\\n\\n' + m['content'] + '<|eot|>' }}",
                        "{{ '<|header_start|>assistant<|header_end|>\\n\\n' }}", head="{{ bos_token }}" + _first_system(
                            "{{ '<|header_start|>system<|header_end|>\\n\\n' + messages[0]['content'] | trim + '<|eot|>' }}")),
               ("<|header_start|>", "<|header_end|>", "<|eot|>")),
    # every system message in front (joined by blank lines); answers lose what precedes a </think>
    "deepseek_v3": (_text_chats_only("deepseek_v3") + _turns(
        "{% if m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}{% elif m['role'] == 'assistant' %}"
        "{{ '<｜Assistant｜>' + m['content'].split('</think>')[-1] + '<｜end▁of▁sentence｜>' }}{% endif %}",
        "{{ '<｜Assistant｜>' }}", head="{{ bos_token }}{{ messages | selectattr('role', 'equalto', 'system') | "
        "map(attribute='content') | join('\\n\\n') }}"), ("<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>")),
    # AI21's Jamba: a system block always (empty without a system message), <|bom|><|role|> content<|eom|>
    "jamba": (_text_chats_only("jamba", fields=("name", "citations"), settings=tuple(
        (f"{key} is defined and {key} is not none", f"`{key}`")
        for key in ("knobs", "bom_str", "eom_str", "role_to_predict", "generation_preamble"))) + _turns(
        "{{ '<|bom|><|' + m['role'] + '|> ' + m['content'] + '<|eom|>' }}", "{{ '<|bom|><|assistant|>' }}",
        head="{{ '<|startoftext|><|bom|><|system|> ' }}" + _first_system("{{ messages[0]['content'] }}") + "{{ '<|eom|>' }}"),
        ("<|startoftext|>", "<|bom|>", "<|eom|>", "<|system|>", "<|user|>", "<|assistant|>")),
    "qwen3": (_qwen3("qwen3"), ("<|im_start|>", "<|im_end|>")),
    "qwen3_5": (_qwen3("qwen3_5"), ("<|im_start|>", "<|im_end|>")),
    # ChatML after BOS; only the first system message is written
    "falcon_h1": (_text_chats_only("falcon_h1") + _turns(
        "{% if m['role'] != 'system' %}" + _CHATML + "{% endif %}", "{{ '<|im_start|>assistant\\n' }}", head="{{ bos_token }}"
        "{% if messages[0]['role'] == 'system' %}{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
        "{% endif %}"), ("<|im_start|>", "<|im_end|>")),
    "nemotron_h": (_text_chats_only("nemotron_h") + _turns(
        "{% if m['role'] in ('user', 'assistant') %}" + _CHATML + "{% else %}{{ raise_exception('nemotron_h: unexpected "
        "role ' + m['role']) }}{% endif %}", "{{ '<|im_start|>assistant\\n' }}",
        head=_first_system("{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}")),
        ("<|im_start|>", "<|im_end|>")),
    # EXAONE 4: answers (not empty ones) open with an empty think block and lose what precedes a </think>
    "exaone4": (_text_chats_only("exaone4", settings=(("skip_think is defined and not skip_think", "skip_think=False"),))
                + _turns("{% if m['role'] == 'assistant' %}{{ '[|assistant|]\\n' }}{% if m['content'] %}"
                         "{{ '<think>\\n\\n</think>\\n\\n' + (m['content'].split('</think>')[-1] | trim if '</think>' in "
                         "m['content'] else m['content']) }}{% endif %}{{ '[|endofturn|]\\n' }}"
                         "{% elif m['role'] in ('user', 'system') %}{{ '[|' + m['role'] + '|]\\n' + m['content'] + "
                         "'[|endofturn|]\\n' }}{% else %}{{ raise_exception('exaone4: unknown role ' + m['role']) }}{% endif %}",
                         "{{ '[|assistant|]\\n' + ('<think>\\n' if enable_thinking is defined and enable_thinking is true "
                         "else '<think>\\n\\n</think>\\n\\n') }}", head=""),
                ("[|system|]", "[|user|]", "[|assistant|]", "[|endofturn|]")),
    "gemma3": (_gemma3("gemma3"), ("<start_of_turn>", "<end_of_turn>")),
    "gemma3n": (_gemma3("gemma3n"), ("<start_of_turn>", "<end_of_turn>")),
    "gemma4": (_gemma4("gemma4"), ("<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>")),
    "gemma4_unified": (_gemma4("gemma4_unified"), ("<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>")),
    "command_a": (_command_a("command_a", "\n\n", "<|START_RESPONSE|>", settings=(
        ("safety_mode | upper == 'STRICT'", "safety_mode: STRICT"),)), _COMMAND_A_MARKERS),
    "command_a_tool_use": (_command_a("command_a_tool_use", "\n", ""), _COMMAND_A_MARKERS),
    "command_a_rag": (_command_a("command_a_rag", "\n", ""), _COMMAND_A_MARKERS),
    # Aya: Cohere's markers, content trimmed, the system message as it is
    "aya": (_text_chats_only("aya") + _turns(
        _alternating("aya") + "{% if m['role'] == 'user' %}{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + m['content'] | trim "
        "+ '<|END_OF_TURN_TOKEN|>' }}{% elif m['role'] == 'assistant' %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' + "
        "m['content'] | trim + '<|END_OF_TURN_TOKEN|>' }}{% endif %}", "{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}",
        head="{{ bos_token }}" + _first_system("{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + messages[0]['content'] + "
                                               "'<|END_OF_TURN_TOKEN|>' }}")), _COHERE_MARKERS),
}


def add_missing_markers(tokenizer, name: str) -> list[str]:
    """Add the named template's markers the tokenizer lacks as special tokens; the ones added."""
    vocab = tokenizer.get_vocab()
    missing = [marker for marker in TEMPLATES[name][1] if marker not in vocab]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    return missing
