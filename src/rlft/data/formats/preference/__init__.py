"""Row formats of preference data: a raw row -> a canonical record of rendered strings.

Canonical records (the recipe tokenises them: the prompt with the tokenizer's special tokens unless it
already starts with BOS; the answers without, plus EOS when they do not already end with it):

  pairs (dpo, ipo, simpo, orpo, reward_model)  {"prompt": str, "chosen": str, "rejected": str}
                                               (+ "margin": float for reward models, when the row has one)
  KTO                                          {"prompt": str, "completion": str, "label": bool}

The strings are exactly those of Axolotl's DPO, KTO and ORPO prompt strategies, so users' configs and data give
the same text. `type:` resolves like Axolotl: `X` means `X.default`; the built-in names of the
method first; else a user `module.fn` importable from the working directory; a mapping means
`user_defined.default`; no type means the row already holds the canonical fields.

Deliberate differences from the reference implementation:

* `zephyr.nectar`: chosen = the answer with the best rank (the LOWEST rank number, rank 1 = best in
  Nectar), rejected = the second best. Axolotl takes the two largest rank numbers, which is inverted.
* `chat_template.*` answers (Axolotl's "dummy user" trick): the answer is searched for after the
  dummy message and its assistant header, not from the start of the render (an answer such as "a"
  or "user" would otherwise match a role header), also as its stripped text (templates that `trim` content), and a miss raises
  RowError instead of degenerating to the last character.
* `chatml.argilla` / `llama3.argilla` (documented, gone from Axolotl) are aliases of `*.default`.
* KTO `user_defined`: a `{system}` placeholder with no system in the row renders as "" (or
  `system_prompt`) instead of Axolotl's KeyError; DPO `user_defined` also falls back to `system_prompt`.
* Format strings of `user_defined` are checked once, when the format is resolved, not on every row.
* Reward models, Bradley-Terry rows (`chosen`/`rejected` are whole conversations, no
  `field_messages` column): prompt = the render of the leading messages both conversations share
  (with the generation prompt when both continue with an assistant turn) when that render is a prefix
  of both whole renders; otherwise "" (or the BOS text both renders start with, so BOS is not doubled).
  chosen/rejected = the rest of each render, right-stripped like the DPO `chat_template` answers.
  The model scores prompt + answer as one text, so where the cut falls changes nothing but padding.

Every row problem raises RowError naming the field; the caller adds the dataset and the row index.
A pair whose chosen equals its rejected is not an error here: see `is_degenerate_pair`.
"""

