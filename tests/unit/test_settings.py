"""`rlft.config.settings.resolve`: the settings a run reads, resolved once from the validated config."""

import dataclasses

import pytest

from rlft.config.parallel import rows_per_step
from rlft.config.settings import Settings, resolve


def test_every_part_is_frozen(config):
    settings = resolve(config())
    assert isinstance(settings, Settings)
    for part in (settings, settings.model, settings.model.adapter, settings.data, settings.optim, settings.rl,
                 settings.server, settings.nemo_gym, settings.loss, settings.run, settings.parallel):
        assert dataclasses.is_dataclass(part)
        field = dataclasses.fields(part)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, field, None)


def test_rows_per_step_counts_the_launched_processes(config, monkeypatch):
    cfg = config(micro_batch_size=2, gradient_accumulation_steps=3)
    monkeypatch.setenv("WORLD_SIZE", "4")
    parallel = resolve(cfg).parallel
    assert (parallel.processes, parallel.rows_per_step) == (4, 24)
    assert rows_per_step(cfg, processes=2) == 12


def test_online_rl_settings_share_the_step_rows(config, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    settings = resolve(config(rl="grpo", micro_batch_size=4, sequence_len=640,
                              trl={"num_generations": 4, "max_completion_length": 128, "reward_funcs": ["m.f"]}))
    assert settings.rl.prompts_per_step * settings.rl.num_generations == settings.parallel.rows_per_step == 8
    assert settings.data.prompt_budget == 512


def test_server_defaults_are_resolved_once(config):
    settings = resolve(config(adapter="lora", lora_r=16))
    assert settings.server.model is settings.model
    assert settings.server.max_lora_rank == 16
    assert resolve(config()).server.max_lora_rank == 8  # lora_r's default
    assert settings.model.torch_compile_backend == "inductor" and settings.model.tokenizer_type == "AutoTokenizer"
