"""Rules on NeMo Gym environments (`plugins`, `nemo_gym_*`)."""

from __future__ import annotations

from rlft.config.methods import method_spec
from rlft.config.plugins import NEMO_GYM_PLUGIN, nemo_gym_enabled
from rlft.config.rl import trl_options


def nemo_gym_problems(cfg):
    unknown = [name for name in cfg.plugins or [] if not name.startswith("axolotl.integrations.")]
    if unknown:
        yield (f"plugins: {', '.join(unknown)} is not one of Axolotl's plugins (axolotl.integrations.*); the one rlft runs is "
               f"{NEMO_GYM_PLUGIN} (NeMo Gym environments): remove the others")
    if not nemo_gym_enabled(cfg):
        if cfg.nemo_gym_datasets:
            yield (f"nemo_gym_datasets is set but NeMo Gym is off: add plugins: [{NEMO_GYM_PLUGIN}] (or nemo_gym_enabled: "
                   "true), or remove nemo_gym_datasets")
        return
    if not method_spec(cfg.method).reward_functions:
        yield f"NeMo Gym environments score online-RL rollouts: set rl: grpo (or gdpo), not {cfg.rl or 'sft'}"
    if cfg.dataset_exact_deduplication:
        yield ("dataset_exact_deduplication applies to datasets:, not to NeMo Gym's task files (nemo_gym_datasets): "
               "remove it, or deduplicate the JSONL tasks")
    evaluation = [key for key in ("test_datasets", "val_set_size") if getattr(cfg, key)]
    if evaluation:
        yield (f"{' and '.join(evaluation)} with NeMo Gym: evaluation on Gym tasks is not built yet (the task files "
               "replace datasets:); remove them")
    if not cfg.nemo_gym_datasets:
        yield ("NeMo Gym is on and nemo_gym_datasets is empty: list the task files, e.g. "
               "[{path: resources_servers/reasoning_gym/data/example.jsonl, server_name: reasoning_gym}]")
    if cfg.nemo_gym_auto_start and not cfg.nemo_gym_config_paths:
        yield ("nemo_gym_auto_start is true (the default) but nemo_gym_config_paths is empty: list the Gym server configs "
               "ng_run should start, e.g. [resources_servers/reasoning_gym/configs/resources_only.yaml], or start the "
               "servers yourself and set nemo_gym_auto_start: false")
    if not cfg.nemo_gym_multi_turn:
        if cfg.nemo_gym_max_turns is not None:
            yield "nemo_gym_max_turns limits multi-turn episodes: set nemo_gym_multi_turn: true, or remove it"
        return
    if not cfg.trl.use_vllm or trl_options(cfg)["vllm_mode"] != "server":
        yield ("nemo_gym_multi_turn: true: the Gym agent calls the policy over HTTP, so it needs rlft's rollout server: set "
               "trl.use_vllm: true and trl.vllm_mode: server, and start `rlft vllm-serve <config>` (docs/environments.md)")
    verify = [name for name in cfg.trl.reward_funcs or [] if str(name).endswith("reward_nemo_gym_verify")]
    if verify:
        yield (f"trl.reward_funcs: {verify[0]} scores single answers, but with nemo_gym_multi_turn the agent's /run "
               "verifies each episode: use axolotl.integrations.nemo_gym.rewards.reward_env (the /run reward)")
    if cfg.trl.rollout_func:
        yield "trl.rollout_func and nemo_gym_multi_turn both produce the episodes: keep one of them"
    # the Gym agent asks the rollout server with temperature and top_p only: other filters would not sample, but the
    # trainer's log-probs (and so its importance-sampling ratios) would assume them
    filters = (("top_k", cfg.trl.top_k, (None, 0, -1)), ("min_p", cfg.trl.min_p, (None, 0.0)),
               ("repetition_penalty", cfg.trl.repetition_penalty, (None, 1.0)))
    unsent = [f"trl.{key}: {value}" for key, value, off in filters if value not in off]
    if unsent:
        yield (f"{', '.join(unsent)} with nemo_gym_multi_turn: the Gym agent sends the rollout server temperature and top_p "
               "only, so the episodes would not be sampled with it while the trainer's log-probs assume it: remove it")
