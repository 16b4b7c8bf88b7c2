"""Learning-rate schedules (values by hand) and the optimizer's parameter groups."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.config.settings.training import optim_settings
from rlft.errors import ConfigError, NotImplementedYet
from rlft.train.optim import build_optimizer, build_scheduler, warmup_steps

# total 14 steps, 4 warm-up steps. transformers' curves: warm-up s/W = 0, 0.25, 0.5, 0.75; then decay over steps 4..14
TOTAL, WARMUP = 14, 4
MIDPOINT = WARMUP + (TOTAL - WARMUP) // 2  # step 9, progress 0.5


def rates(config, steps=TOTAL + 1, **overrides) -> list[float]:
    """The learning rate of each optimizer step with learning_rate 1 (the schedule's factor)."""
    cfg = config(learning_rate=1.0, **overrides)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_scheduler(optim_settings(cfg), optimizer, TOTAL)
    seen = []
    for _ in range(steps):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return seen


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant_with_warmup"])
def test_warmup_is_linear_from_zero_like_transformers(config, kind):
    assert rates(config, WARMUP, warmup_steps=WARMUP, lr_scheduler=kind) == pytest.approx([0.0, 0.25, 0.5, 0.75])


def test_constant_ignores_warmup_like_transformers(config):
    assert rates(config, WARMUP, warmup_steps=WARMUP, lr_scheduler="constant") == [1.0] * WARMUP


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant", "constant_with_warmup"])
def test_peak_right_after_warmup(config, kind):
    assert rates(config, warmup_steps=WARMUP, lr_scheduler=kind)[WARMUP] == pytest.approx(1.0)


def test_cosine_midpoint_quarter_and_end(config):
    seen = rates(config, warmup_steps=WARMUP, lr_scheduler="cosine")
    assert seen[MIDPOINT] == pytest.approx(0.5)
    assert seen[7] == pytest.approx(0.5 * (1 + math.cos(0.3 * math.pi)))  # progress 0.3
    assert seen[TOTAL] == pytest.approx(0.0)


def test_cosine_min_lr_ratio_is_transformers_cosine_with_min_lr(config):
    seen = rates(config, warmup_steps=WARMUP, lr_scheduler="cosine", cosine_min_lr_ratio=0.1)
    assert seen[WARMUP] == pytest.approx(1.0)
    assert seen[MIDPOINT] == pytest.approx(0.1 + 0.9 * 0.5)  # 0.55
    assert seen[TOTAL] == pytest.approx(0.1)


def test_linear_midpoint_and_end(config):
    seen = rates(config, warmup_steps=WARMUP, lr_scheduler="linear")
    assert [seen[MIDPOINT], seen[TOTAL - 1], seen[TOTAL]] == pytest.approx([0.5, 0.1, 0.0])


def test_no_warmup_starts_at_peak(config):
    assert rates(config, 1, warmup_steps=0, lr_scheduler="cosine") == pytest.approx([1.0])


def test_schedule_kwargs_reach_transformers(config):
    # cosine_with_restarts with 2 cycles over 10 decay steps: back at the peak after 5 of them
    seen = rates(config, warmup_steps=WARMUP, lr_scheduler="cosine_with_restarts", lr_scheduler_kwargs={"num_cycles": 2})
    assert seen[WARMUP + 5] == pytest.approx(1.0) and seen[WARMUP + 2] < 1.0


def test_warmup_steps_count_as_axolotl_counts_them(config):
    """Axolotl (core/builders/base.py) for SFT and the preference methods, which count steps: warmup_steps, else
    int(warmup_ratio x steps), else min(int(0.03 x steps), 100); a count of 1 becomes 2."""
    assert warmup_steps(optim_settings(config(warmup_ratio=0.1)), 25) == 2  # 2.5, rounded down
    assert warmup_steps(optim_settings(config(warmup_ratio=0.1)), 30) == 3
    assert warmup_steps(optim_settings(config(warmup_ratio=0.0)), 400) == 0
    assert warmup_steps(optim_settings(config(warmup_ratio=0.05)), 20) == 2  # 1 -> 2
    assert warmup_steps(optim_settings(config(warmup_steps=7)), 25) == 7
    assert warmup_steps(optim_settings(config(warmup_steps=0)), 400) == 0
    assert warmup_steps(optim_settings(config(warmup_steps=1)), 400) == 2
    # neither key: 3 % of the steps, at most 100
    assert [warmup_steps(optim_settings(config()), total) for total in (25, 33, 34, 66, 67, 400, 3333, 3334, 100_000)] == [
        0, 0, 2, 2, 2, 12, 99, 100, 100]
    assert [warmup_steps(optim_settings(config(rl="dpo")), total) for total in (33, 34, 400, 100_000)] == [0, 2, 12, 100]


def test_warmup_counts_the_steps_axolotl_counts(config):
    """Axolotl counts SFT's steps as min(the epochs' steps, max_steps) and the preference methods' as the epochs' steps
    alone (common/datasets.py); it counts none for GRPO and EBFT and hands transformers the ratio, which rounds up
    (ceil(ratio x steps), no cap, no 1 -> 2)."""
    # SFT, max_steps 1500 over 36 steps of data: 3 % of 36 = 1 -> 2 (of the 1500 steps trained)
    assert warmup_steps(optim_settings(config(max_steps=1500)), 1500, epoch_steps=36) == 2
    assert warmup_steps(optim_settings(config(max_steps=100)), 100, epoch_steps=4000) == 3  # max_steps below the epochs' steps
    assert warmup_steps(optim_settings(config(reward_model=True, max_steps=1500)), 1500, epoch_steps=36) == 2
    # DPO ignores max_steps: 3 % of the epochs' 1250 steps although the run stops at 1000
    assert warmup_steps(optim_settings(config(rl="dpo", max_steps=1000)), 1000, epoch_steps=1250) == 37
    assert warmup_steps(optim_settings(config(rl="dpo", warmup_ratio=0.1, max_steps=20)), 20, epoch_steps=100) == 10
    grpo = dict(rl="grpo", micro_batch_size=8, trl={"reward_funcs": ["m.f"]})
    assert [warmup_steps(optim_settings(config(**grpo)), total) for total in (10, 33, 34, 67, 200, 400, 5000)] == [1, 1, 2, 3, 6, 12, 150]
    assert warmup_steps(optim_settings(config(**grpo, warmup_ratio=0.05)), 30, epoch_steps=7) == 2  # ceil(1.5)
    assert warmup_steps(optim_settings(config(**grpo, warmup_steps=1)), 400) == 2
    ebft = dict(rl="ebft", micro_batch_size=8, ebft={"mode": "structured"})
    assert warmup_steps(optim_settings(config(**ebft)), 10) == 1


def test_an_unset_warmup_shapes_the_schedule(config):
    """400 steps and no warm-up key: 12 steps of linear warm-up, then the cosine from 1."""
    cfg = config(learning_rate=1.0)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_scheduler(optim_settings(cfg), optimizer, 400)
    seen = []
    for _ in range(14):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen[:13] == pytest.approx([s / 12 for s in range(12)] + [1.0])
    assert seen[13] == pytest.approx(0.5 * (1 + math.cos(math.pi / 388)))


# ---------------------------------------------------------------- optimizer


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=260, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=64, attention_bias=True, tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def group_names(model, optimizer) -> list[set[str]]:
    names = {id(param): name for name, param in model.named_parameters()}
    return [{names[id(p)] for p in group["params"]} for group in optimizer.param_groups]


def test_biases_and_norms_get_no_weight_decay(config, tiny_model):
    optimizer = build_optimizer(optim_settings(config(weight_decay=0.01)), tiny_model)
    decay, no_decay = group_names(tiny_model, optimizer)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0]
    assert no_decay == {n for n, _ in tiny_model.named_parameters() if n.endswith("bias") or "norm" in n}
    assert "model.layers.0.self_attn.q_proj.bias" in no_decay
    assert "model.layers.1.post_attention_layernorm.weight" in no_decay
    assert "model.norm.weight" in no_decay
    assert "model.layers.0.self_attn.q_proj.weight" in decay
    assert "model.embed_tokens.weight" in decay
    assert len(decay) + len(no_decay) == len(list(tiny_model.parameters()))


def test_frozen_parameters_are_left_out(config, tiny_model):
    tiny_model.model.embed_tokens.weight.requires_grad_(False)
    try:
        decay, no_decay = group_names(tiny_model, build_optimizer(optim_settings(config()), tiny_model))
    finally:
        tiny_model.model.embed_tokens.weight.requires_grad_(True)
    assert "model.embed_tokens.weight" not in decay | no_decay


EXPECTED_CLASS = {
    "adamw_torch": torch.optim.AdamW,
    "adamw_torch_fused": torch.optim.AdamW,
    "adamw": torch.optim.AdamW,
    "adam": torch.optim.Adam,
    "sgd": torch.optim.SGD,
    "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad,
    "adafactor": __import__("transformers").optimization.Adafactor,
}


@pytest.mark.parametrize("name", sorted(EXPECTED_CLASS))
def test_optimizers_build_and_step(config, tiny_model, name):
    optimizer = build_optimizer(optim_settings(config(optimizer=name, learning_rate=1e-3)), tiny_model)
    assert type(optimizer) is EXPECTED_CLASS[name]
    assert all(group["lr"] == 1e-3 for group in optimizer.param_groups)
    before = tiny_model.lm_head.weight.detach().clone()
    ids = torch.tensor([[1, 2, 3, 4]])
    tiny_model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    assert not torch.equal(before, tiny_model.lm_head.weight)


def test_optimizer_whose_package_is_missing_is_a_clear_error(config, tiny_model):
    with pytest.raises(ConfigError, match=r"optimizer: adamw_bnb_8bit cannot be built here: .*bitsandbytes"):
        build_optimizer(optim_settings(config(optimizer="adamw_bnb_8bit")), tiny_model)


def test_unknown_optimizer_suggests_a_name(config_problems):
    [(where, what)] = config_problems(optimizer="adamw_troch")
    assert where == "optimizer" and "did you mean 'adamw_torch'" in what


def test_axolotl_optimizers_validate_but_train_names_an_alternative(config):
    from rlft.errors import NotImplementedYet
    from rlft.train.unbuilt import refuse_unbuilt

    with pytest.raises(NotImplementedYet, match="optimizer: muon is one of Axolotl's own optimizers"):
        refuse_unbuilt(config(optimizer="muon"))


def test_adam_hyperparameters_from_config(config, tiny_model):
    optimizer = build_optimizer(optim_settings(config(adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6)), tiny_model)
    assert optimizer.defaults["betas"] == (0.8, 0.95)
    assert optimizer.defaults["eps"] == 1e-6


def test_the_default_optimizer_is_axolotls_and_transformers(config, tiny_model):
    """A config without `optimizer:` trains with the fused AdamW kernel, as in Axolotl and the HF Trainer."""
    import dataclasses

    from transformers import TrainingArguments

    default = next(f.default for f in dataclasses.fields(TrainingArguments) if f.name == "optim")
    assert config().optimizer == "adamw_torch_fused" == default
    assert build_optimizer(optim_settings(config()), tiny_model).defaults["fused"] is True


def test_fused_flag_only_for_fused_adamw(config, tiny_model):
    assert build_optimizer(optim_settings(config(optimizer="adamw_torch_fused")), tiny_model).defaults["fused"] is True
    assert not build_optimizer(optim_settings(config(optimizer="adamw_torch")), tiny_model).defaults["fused"]


@pytest.mark.parametrize("name", ["adamw_torch", "adamw_torch_fused", "adamw"])
def test_torchs_adamw_is_what_transformers_gives(config, name):
    """rlft answers these names itself (importing transformers' Trainer costs seconds of start-up): the same class
    and keyword arguments as the HF Trainer's."""
    import dataclasses
    from types import SimpleNamespace

    from transformers import Trainer, TrainingArguments

    from rlft.config.optimizers import ALIASES
    from rlft.train.optim import optimizer_class

    cfg = config(optimizer=name, learning_rate=2e-4, adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6, weight_decay=0.1)
    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments) if f.default is not dataclasses.MISSING}
    args = SimpleNamespace(**{**defaults, "optim": ALIASES.get(name, name), "learning_rate": 2e-4, "adam_beta1": 0.8,
                              "adam_beta2": 0.95, "adam_epsilon": 1e-6, "weight_decay": 0.1})
    assert optimizer_class(optim_settings(cfg)) == Trainer.get_optimizer_cls_and_kwargs(args)


def test_a_step_the_fp16_scaler_skipped_is_seen():
    """fp16's loss scaler skips a step whose gradients overflowed; the loop then leaves the learning-rate schedule where
    it is (transformers' Trainer does the same). accelerate's optimizer with a real scaler (CPU's, as CUDA's behaves)."""
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.state import AcceleratorState, GradientState

    from rlft.train.optim import step_was_skipped

    Accelerator()  # the process state accelerate's optimizer reads
    try:
        weight, scaler = torch.nn.Parameter(torch.ones(2)), torch.amp.GradScaler("cpu")
        optimizer = AcceleratedOptimizer(torch.optim.SGD([weight], lr=0.1), device_placement=False, scaler=scaler)
        for factor, skipped in ((float("inf"), True), (1.0, False)):
            optimizer.zero_grad()
            scaler.scale((weight * factor).sum()).backward()
            before = weight.detach().clone()
            optimizer.step()
            assert step_was_skipped(optimizer) is skipped and torch.equal(weight.detach(), before) is skipped
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    assert step_was_skipped(torch.optim.SGD([weight], lr=0.1)) is False  # no scaler: never skipped


def test_the_loop_steps_the_torch_optimizer_itself_unless_accelerates_wrapper_scales(config):
    """Without a gradient scaler accelerate's optimizer step only calls the torch optimizer's (after looking for the
    LOMO package on disk), so the loop steps that one and the schedule follows it without a warning; with fp16's
    scaler the wrapper stays, since it is what unscales and skips, and for an optimizer without a step of its own
    (LOMO updates in the backward), whose step the wrapper skips."""
    import warnings

    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.state import AcceleratorState, GradientState

    from rlft.train.optim import stepping_optimizer

    weight = torch.nn.Parameter(torch.ones(2))
    try:
        inner = torch.optim.SGD([weight], lr=0.1)
        wrapped = Accelerator(cpu=True).prepare(inner)
        assert stepping_optimizer(wrapped) is inner and stepping_optimizer(inner) is inner
        stepping = stepping_optimizer(wrapped)
        scheduler = build_scheduler(optim_settings(config(lr_scheduler="linear", warmup_steps=0, learning_rate=0.1)), stepping, 4)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. "Detected call of `lr_scheduler.step()` before `optimizer.step()`"
            for _ in range(2):
                weight.sum().backward()
                stepping.step()
                scheduler.step()
                stepping.zero_grad(set_to_none=True)
        assert weight.grad is None and torch.allclose(weight.detach(), torch.full((2,), 1 - 0.1 - 0.075))
        assert wrapped.param_groups[0]["lr"] == pytest.approx(0.05)
        scaled = AcceleratedOptimizer(torch.optim.SGD([weight], lr=0.1), device_placement=False,
                                      scaler=torch.amp.GradScaler("cpu"))
        assert stepping_optimizer(scaled) is scaled

        class UpdatesInBackward(torch.optim.Optimizer):  # as LOMO: no step of its own, the wrapper skips it
            def __init__(self, params):
                super().__init__(params, {})

        backward_only = Accelerator(cpu=True).prepare(UpdatesInBackward([weight]))
        assert stepping_optimizer(backward_only) is backward_only
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()


def test_a_checkpoint_keeps_the_fp16_loss_scale(tmp_path, tok):
    """fp16's loss scaler is saved with the checkpoint and restored on resume: a resumed run goes on at the scale it
    had found (here halved by an overflow and counting towards growth), not at the initial 65536."""
    from rlft.train.checkpoint import TrainState, load_checkpoint
    from rlft.train.checkpoint_save import save_checkpoint

    config = LlamaConfig(vocab_size=300, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=16)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scaler = torch.amp.GradScaler("cpu", growth_interval=10)
    weight = torch.nn.Parameter(torch.ones(2))
    for factor in (float("inf"), 1.0):  # an overflow halves the scale; the finite step counts towards growth
        probe = torch.optim.SGD([weight], lr=0.1)
        scaler.scale((weight * factor).sum()).backward()
        scaler.step(probe)
        scaler.update()
        probe.zero_grad()
    saved = scaler.state_dict()
    assert saved["scale"] == 32768.0 and saved["_growth_tracker"] == 1
    folder = save_checkpoint(tmp_path, TrainState(global_step=3), model, tok, optimizer, scheduler, None, scaler=scaler)
    resumed = torch.amp.GradScaler("cpu", growth_interval=10)
    load_checkpoint(folder, model, optimizer, scheduler, resumed)
    assert resumed.state_dict() == saved
    plain = save_checkpoint(tmp_path, TrainState(global_step=4), model, tok, optimizer, scheduler, None)
    assert not (plain / "scaler.pt").exists()  # fp32 and bf16 runs write none, and load none
    untouched = torch.amp.GradScaler("cpu")
    load_checkpoint(plain, model, optimizer, scheduler, untouched)
    assert untouched.get_scale() == 65536.0


def test_a_skipped_first_step_moves_the_schedule_without_torchs_warning(config):
    """A recipe that skips the first step (no learning signal) still counts it in the schedule, and the run does not
    print torch's "lr_scheduler.step() before optimizer.step()" warning, which is about a user's mistake."""
    import warnings

    from rlft.train.optim import advance_schedule

    def fresh():
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        return optimizer, build_scheduler(optim_settings(config(learning_rate=1.0, lr_scheduler="linear", warmup_steps=2)), optimizer, 10)

    optimizer, scheduler = fresh()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        advance_schedule(scheduler, updated=False)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5)  # step 1 of the warm-up
    _, scheduler = fresh()
    with pytest.warns(UserWarning, match="before `optimizer.step"):  # what advance_schedule keeps out of the output
        scheduler.step()


def test_schedule_keys_transformers_would_refuse_or_drop_are_named_before_the_model_loads(config):
    from rlft.train.optim import scheduler_problem

    assert scheduler_problem(optim_settings(config())) is None
    assert scheduler_problem(optim_settings(config(lr_scheduler="warmup_stable_decay"))) == (
        "lr_scheduler_kwargs: the warmup_stable_decay schedule needs num_decay_steps, e.g. lr_scheduler_kwargs: "
        "{num_decay_steps: 100}")
    assert scheduler_problem(optim_settings(config(lr_scheduler="warmup_stable_decay", lr_scheduler_kwargs={"num_decay_steps": 5}))) is None
    assert scheduler_problem(optim_settings(config(lr_scheduler="cosine_with_restarts", lr_scheduler_kwargs={"num_cycle": 2}))) == (
        "lr_scheduler_kwargs: num_cycle is not an argument of the cosine_with_restarts schedule; it takes num_cycles")
    assert scheduler_problem(optim_settings(config(lr_scheduler_kwargs={"min_lr": 1e-5}))).startswith(
        "lr_scheduler_kwargs: min_lr is not an argument of the cosine schedule")
    assert scheduler_problem(optim_settings(config(cosine_min_lr_ratio=0.1, lr_scheduler_kwargs={"min_lr": 1e-5}))) is None  # cosine_with_min_lr
    assert scheduler_problem(optim_settings(config(lr_scheduler="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr": 1e-5, "min_lr_rate": 0.1}))) == (
        "lr_scheduler_kwargs: min_lr and min_lr_rate both set the final learning rate: keep one")
    assert scheduler_problem(optim_settings(config(lr_scheduler="linear", cosine_min_lr_ratio=0.1))).startswith(
        "cosine_min_lr_ratio sets the final learning rate of a cosine schedule, and lr_scheduler is linear")
    assert scheduler_problem(optim_settings(config(lr_scheduler="constant_with_warmup", lr_scheduler_kwargs={"num_cycles": 2}))) == (
        "lr_scheduler_kwargs: constant_with_warmup takes none (transformers would drop ['num_cycles']): remove them")


def test_the_schedule_arguments_table_is_transformers():
    import inspect

    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION
    from transformers.trainer_utils import SchedulerType

    from rlft.train.optim import SCHEDULE_ARGUMENTS

    for name, (optional, required) in SCHEDULE_ARGUMENTS.items():
        parameters = inspect.signature(TYPE_TO_SCHEDULER_FUNCTION[SchedulerType(name)]).parameters
        own = {k: p for k, p in parameters.items() if k not in ("optimizer", "num_warmup_steps", "num_training_steps", "last_epoch")}
        assert set(optional) | set(required) == set(own), name
        assert set(required) == {k for k, p in own.items() if p.default is inspect.Parameter.empty}, name


def test_optimizers_the_loop_cannot_drive_are_refused_before_the_model_loads(config):
    from rlft.train.unbuilt import refuse_unbuilt

    with pytest.raises(NotImplementedYet, match=r"optimizer: lomo updates the weights inside the backward pass"):
        refuse_unbuilt(config(optimizer="lomo"))
    with pytest.raises(NotImplementedYet, match=r"optimizer: schedule_free_adamw with deepspeed: ZeRO keeps"):
        refuse_unbuilt(config(optimizer="schedule_free_adamw", deepspeed="deepspeed_configs/zero2.json"))


def test_inner_optimizer_is_the_torch_optimizer_inside_accelerates_wrapper():
    """What a checkpoint saves and loads the state of, and what reset_state clears: the torch optimizer itself."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from rlft.train.optim import inner_optimizer

    inner = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    try:
        wrapped = Accelerator(cpu=True).prepare(inner)
        assert wrapped is not inner and inner_optimizer(wrapped) is inner and inner_optimizer(inner) is inner
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
