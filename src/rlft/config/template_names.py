"""The names `chat_template:` takes: rlft's named templates (their text is written in the chat-template module of the
data layer, under the same names), Axolotl's vision templates, which validate and `train` refuses (rlft trains
text-only models), and the special values."""

from __future__ import annotations

# the named templates rlft ships, in the order `rlft validate` lists them
TEMPLATE_NAMES = ("chatml", "llama3", "alpaca", "mistral_v1", "mistral_v2v3", "gemma", "phi_3", "phi_35", "qwen_25",
                  "metharme", "cohere", "deepseek_v2", "exaone", "mistral_v3_tekken", "mistral_v7_tekken", "llama4",
                  "deepseek_v3", "jamba", "qwen3", "qwen3_5", "falcon_h1", "nemotron_h", "exaone4", "gemma3", "gemma3n",
                  "gemma4", "gemma4_unified", "command_a", "command_a_tool_use", "command_a_rag", "aya")
# Axolotl's vision templates: they validate; train refuses them (rlft trains text-only models)
NOT_SHIPPED = ("llama3_2_vision", "pixtral", "llava", "qwen2_vl")
NAMES = ("tokenizer_default", "jinja", *TEMPLATE_NAMES, *NOT_SHIPPED)
