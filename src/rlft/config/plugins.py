"""Axolotl's `plugins:` that rlft implements, and the on/off keys they imply."""

from __future__ import annotations

NEMO_GYM_PLUGIN = "axolotl.integrations.nemo_gym.NemoGymPlugin"
LIGER_PLUGIN = "axolotl.integrations.liger.LigerPlugin"  # its liger_* keys are fields of RlftConfig
CCE_PLUGIN = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"  # rlft's losses do what it does
SWANLAB_PLUGIN = "axolotl.integrations.swanlab.SwanLabPlugin"  # rlft logs to SwanLab through accelerate (use_swanlab)
IMPLEMENTED = (NEMO_GYM_PLUGIN, SWANLAB_PLUGIN, LIGER_PLUGIN, CCE_PLUGIN)


def plugin_switch(cfg, key: str, plugin: str) -> bool:
    """A plugin's on/off key as Axolotl reads it: its value when set, else whether the plugin is listed."""
    value = getattr(cfg, key)
    return bool(value) if value is not None else plugin in (cfg.plugins or [])


def cut_cross_entropy(cfg) -> bool:
    """`cut_cross_entropy`, or (unset) whether the Cut Cross-Entropy plugin is listed: its key defaults to true there."""
    return plugin_switch(cfg, "cut_cross_entropy", CCE_PLUGIN)


def nemo_gym_enabled(cfg) -> bool:
    """`nemo_gym_enabled`, or (unset) whether the NeMo Gym plugin is listed, as Axolotl decides."""
    return plugin_switch(cfg, "nemo_gym_enabled", NEMO_GYM_PLUGIN)
