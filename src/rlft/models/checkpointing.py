"""`gradient_checkpointing` and `activation_offloading`: transformers' activation checkpointing of the decoder layers.

With `activation_offloading`, each checkpointed layer's input, the one activation per layer that checkpointing keeps
for the backward, waits in pinned host memory from the forward to the backward (transformers'
`activation_checkpointing_enable(offload=True)`: `torch.autograd.graph.save_on_cpu` around each checkpoint, its copies
on the compute stream, as Axolotl's `legacy`). That frees layers x tokens x hidden size of the GPU's memory, what
dominates at long sequences, for a copy each way. What the layers outside the checkpoints save (the final norm, the
loss) stays: one layer's worth. On a CPU the activations already live in host memory, and nothing moves.
"""

from __future__ import annotations


def offloads(cfg) -> bool:
    """Whether the config asks for activation offloading (Axolotl's `gradient_checkpointing: offload` does too)."""
    return cfg.activation_offloading in (True, "legacy", "hidden_states") or cfg.gradient_checkpointing == "offload"


def enable_checkpointing(model, cfg, device_type: str) -> None:
    """Checkpoint the model's decoder layers (non-reentrant unless `gradient_checkpointing_kwargs` says otherwise), their
    inputs offloaded to host memory when `activation_offloading` asks for it on an accelerator."""
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs=cfg.gradient_checkpointing_kwargs or {"use_reentrant": False},
        offload=offloads(cfg) and device_type != "cpu")
