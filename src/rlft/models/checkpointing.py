"""`gradient_checkpointing` and `activation_offloading`: transformers' activation checkpointing of the decoder layers.

With `activation_offloading`, each checkpointed layer's input, the one activation per layer that checkpointing keeps
for the backward, waits in pinned host memory from the forward to the backward (transformers'
`activation_checkpointing_enable(offload=True)`: `torch.autograd.graph.save_on_cpu` around each checkpoint, its copies
on the compute stream). That frees layers x tokens x hidden size of the GPU's memory, what dominates at long sequences,
for a copy each way. What the layers outside the checkpoints save (the final norm, the loss) stays on the GPU: one
layer's worth. Axolotl's `hidden_states` mode moves the same tensors; its `true` and `legacy` (TRL's offloader, with
and without a second CUDA stream) move those outside the checkpoints too. Without a CUDA GPU nothing moves: on a CPU
the activations already live in host memory.
"""

from __future__ import annotations

from rlft.config.settings.model import ModelSettings
from rlft.errors import ModelError


def enable_checkpointing(model, settings: ModelSettings, device_type: str) -> None:
    """Checkpoint the model's decoder layers (non-reentrant unless `gradient_checkpointing_kwargs` says otherwise), their
    inputs offloaded to host memory when `activation_offloading` asks for it on a CUDA GPU."""
    kwargs = dict(settings.checkpointing_kwargs)
    offload = settings.offload_activations and device_type == "cuda"
    if model._is_overridden("gradient_checkpointing_enable"):  # a model's own code (trust_remote_code) sets it up
        if offload:
            raise ModelError(f"activation_offloading: {type(model).__name__} sets up gradient checkpointing with code of its "
                             "own, which transformers' offloading cannot wrap: set activation_offloading: false")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, offload=offload)
