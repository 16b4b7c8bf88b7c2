"""The pure parts of multi-process training: FSDP settings, the launch command, how rows and batches split."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlft.config.parallel import fsdp_settings
from rlft.data.batches import BatchPlan, PlanCursor
from rlft.errors import ConfigError
from rlft.train.launch import launch_arguments


def test_the_guides_fsdp_block(config):
    """Seed config 20: fsdp [full_shard, auto_wrap] with the layer class to wrap."""
    settings = fsdp_settings(config(fsdp=["full_shard", "auto_wrap"],
                                    fsdp_config={"fsdp_transformer_layer_cls_to_wrap": "Qwen2DecoderLayer"}))
    assert settings.layer_classes == ("Qwen2DecoderLayer",)
    assert settings.wrap_layers and settings.reshard_after_forward and not settings.offload_params
    assert settings.notes == ()


def test_fsdp_options_and_prefixless_keys(config):
    settings = fsdp_settings(config(fsdp=["shard_grad_op", "auto_wrap", "offload"],
                                    fsdp_config={"activation_checkpointing": True, "fsdp_version": 2}))
    assert not settings.reshard_after_forward and settings.offload_params and settings.activation_checkpointing
    assert settings.layer_classes == ()  # the model's own _no_split_modules
    assert fsdp_settings(config(fsdp=["full_shard"])).wrap_layers is False
    assert fsdp_settings(config()) is None


def test_fsdp1_keys_are_read_and_said_to_be_without_effect(config):
    settings = fsdp_settings(config(fsdp_config={"fsdp_version": 1, "fsdp_use_orig_params": True,
                                                 "fsdp_state_dict_type": "FULL_STATE_DICT"}))
    assert settings.wrap_layers  # fsdp_config alone: Axolotl's FSDP2 form
    joined = " ".join(settings.notes)
    assert "use_orig_params has no effect under FSDP2" in joined and "fsdp_version 1 runs as FSDP2" in joined
    assert "whatever fsdp_state_dict_type says" in joined


@pytest.mark.parametrize("fsdp, fsdp_config, words", [
    (["full_shard", "hybrid_shard"], None, "fsdp: hybrid_shard not supported"),
    (["full_shard", "shard_grad_op"], None, "choose one"),
    (None, {"fsdp_transformer_layer_cls": "X"}, "unknown keys transformer_layer_cls"),
    (None, {"fsdp_version": 3}, "expected 1 or 2"),
    (None, {"fsdp_auto_wrap_policy": "SIZE_BASED_WRAP"}, "SIZE_BASED_WRAP' is not built"),
    (None, {"fsdp_offload_params": "yes"}, "fsdp_config.offload_params: expected true or false"),
    (["full_shard"], {"fsdp_transformer_layer_cls_to_wrap": 5}, "transformer_layer_cls_to_wrap: expected a layer class name"),
    (["full_shard"], {"fsdp_transformer_layer_cls_to_wrap": [1, 2]}, "expected a layer class name or a list of them"),
])
def test_bad_fsdp_settings_are_refused_at_validation(config, fsdp, fsdp_config, words):
    with pytest.raises(ConfigError, match=words):
        config(fsdp=fsdp, fsdp_config=fsdp_config)


def test_deepspeed_with_fsdp_is_refused(config):
    with pytest.raises(ConfigError, match="deepspeed and fsdp are both set"):
        config(deepspeed="ds.json", fsdp=["full_shard"])


def test_launch_arguments():
    arguments = launch_arguments("c.yaml", ["--max_steps=3"], 4, nodes=2, node_rank=1, main_ip="10.0.0.1", main_port=29600)
    joined = " ".join(arguments)
    assert joined.startswith("--multi_gpu --num_processes 4 --num_machines 2 --machine_rank 1")
    assert joined.endswith("--main_process_ip 10.0.0.1 --main_process_port 29600 -m rlft.cli train c.yaml --max_steps=3")


@pytest.mark.parametrize("args, words", [
    ((3, 2, 0, "h"), "must divide by --nnodes 2"),
    ((2, 2, 2, "h"), "--node-rank 2: expected 0 to 1"),
    ((2, 2, 0, None), "needs --main-process-ip"),
    ((0, 1, 0, None), "both must be at least 1"),
])
def test_launch_arguments_refuse_impossible_layouts(args, words):
    with pytest.raises(ConfigError, match=words):
        launch_arguments("c.yaml", [], *args)


class HostReads(TorchDispatchMode):
    """Counts the reads of a tensor's value by the host (`aten._local_scalar_dense`: `bool()`, `.item()`), each of
    which waits for the device to finish its queued work."""

    count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf")])
def test_the_weights_check_reads_one_number_from_the_device(bad):
    from rlft.train.parallel import not_finite_anywhere

    params = [torch.ones(3), torch.zeros(2, 2), torch.full((4,), 2.0)]
    if bad is not None:
        params[1][0, 1] = bad
    with HostReads() as reads:
        found = not_finite_anywhere(params, torch.device("cpu"))
    assert found is (bad is not None) and reads.count == 1


def test_plan_padding_and_reshard():
    plan = BatchPlan(list(range(10)), 2, seed=0, pad_id=0, shard=(1, 2), collate=lambda rows: {"rows": rows})
    assert len(plan) == 3  # 5 batches: rank 0 has 3, rank 1 has 2 and repeats its last
    assert [plan.is_padding(i) for i in range(3)] == [False, False, True]
    cursor = PlanCursor(plan)
    batches = [cursor.next() for _ in range(3)]
    assert [b.get("padding", False) for b in batches] == [False, False, True]
    cursor = PlanCursor(plan, 0, 3)
    cursor.reshard(2, 4)  # 6 global batches consumed; with 4 processes that is 1.5 each: continue at 2 (none repeated)
    assert cursor.batch_in_epoch == 2
    cursor.reshard(4, 1)
    assert cursor.batch_in_epoch == 8


def test_a_batch_has_the_same_sample_seed_on_any_number_of_processes():
    """The seed belongs to the batch's place in the global order: its rows and its seed go together on 1 or 2 processes,
    in every epoch, and a plan that does not ask for seeds adds none."""
    def drawn(rank: int, world: int, count: int) -> dict[tuple, int]:
        plan = BatchPlan(list(range(12)), 2, seed=5, pad_id=0, shard=(rank, world), collate=lambda rows: {"rows": rows},
                         seed_batches=True)
        cursor = PlanCursor(plan)
        return {(cursor.epoch, tuple(b["rows"])): b["sample_seed"] for b in (cursor.next() for _ in range(count))}

    one = drawn(0, 1, 12)  # two epochs of 6 batches
    two = {**drawn(0, 2, 6), **drawn(1, 2, 6)}
    assert one == two and len(set(one.values())) == 12
    assert "sample_seed" not in PlanCursor(BatchPlan(list(range(4)), 2, seed=5, pad_id=0, collate=lambda rows: {"rows": rows})).next()


def test_the_default_generation_batch_counts_every_process(config, monkeypatch):
    from rlft.config.rl import rl_settings

    cfg = config(rl="grpo", micro_batch_size=8, gradient_accumulation_steps=2, trl={"num_generations": 4, "reward_funcs": ["r.f"]})
    assert rl_settings(cfg).prompts_per_step == 4
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert rl_settings(cfg).prompts_per_step == 8


def test_the_launchers_own_traceback_is_left_out():
    import io

    from rlft.train.launch import relay_stderr

    text = ("error (rank 1 of 2): bad layer\n"
            "Traceback (most recent call last):\n  File \"/x/torch/distributed/elastic/api.py\", line 3, in run\n    raise\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            "rank      : 1 (local_rank: 1)\n"
            "Traceback (most recent call last):\n  File \"/x/rlft/train/loop.py\", line 9, in run_loop\n"
            "KeyError: 'a bug'\n")
    out = io.StringIO()
    relay_stderr(io.StringIO(text), out)
    assert out.getvalue() == ("error (rank 1 of 2): bad layer\nrank      : 1 (local_rank: 1)\n"
                              "Traceback (most recent call last):\n  File \"/x/rlft/train/loop.py\", line 9, in run_loop\n"
                              "KeyError: 'a bug'\n")


def test_what_several_processes_cannot_run_is_refused_before_they_start(cli, tmp_path, capsys):
    import yaml

    config = tmp_path / "cp.yaml"
    config.write_text(yaml.safe_dump({"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "context_parallel_size": 2}))
    assert cli("train", config, "--num-processes", "2") == 1
    assert "context_parallel_size: 2: context parallelism splits each sequence" in capsys.readouterr().err


def test_more_processes_than_gpus_is_refused(monkeypatch):
    import torch

    from rlft.train.launch import check_devices

    check_devices(8)  # this CPU machine: any count
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_devices(2)
    with pytest.raises(ConfigError, match="3 training processes on this node but 2 visible GPU"):
        check_devices(3)


def test_axolotls_deepspeed_paths_find_the_shipped_files(config, tmp_path, monkeypatch):
    """`deepspeed: deepspeed_configs/zero3_bf16.json` (seed config 21) runs from any folder; a file of that path in the
    working directory wins."""
    import json

    from rlft.config.parallel import SHIPPED_DEEPSPEED, deepspeed_settings

    monkeypatch.chdir(tmp_path)
    settings = deepspeed_settings(config(deepspeed="deepspeed_configs/zero3_bf16.json"))
    assert settings.path == SHIPPED_DEEPSPEED / "zero3_bf16.json" and settings.stage == 3 and not settings.offload
    assert settings.config["bf16"] == {"enabled": True}
    assert deepspeed_settings(config(deepspeed="deepspeed_configs/zero2.json")).offload  # Axolotl's zero2 offloads
    (tmp_path / "none.json").write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}}}))
    assert not deepspeed_settings(config(deepspeed=str(tmp_path / "none.json"))).offload  # DeepSpeed's "none": no offload
    (tmp_path / "deepspeed_configs").mkdir()
    (tmp_path / "deepspeed_configs" / "zero3_bf16.json").write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    assert deepspeed_settings(config(deepspeed="deepspeed_configs/zero3_bf16.json")).stage == 1


@pytest.mark.parametrize("content, words", [
    (None, r"does not exist .*rlft ships zero1.json, zero2.json, zero3.json, zero3_bf16.json"),
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "holds a list, expected a JSON object"),
    ({"zero_optimization": {"stage": 0}}, "stage 0 is plain data parallelism: leave deepspeed unset"),
    ({"zero_optimization": {"stage": 4}}, "stage must be 1, 2 or 3, got 4"),
    ({"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW"}}, "'optimizer' section, which rlft does not read"),
    ({"zero_optimization": {"stage": 2}, "scheduler": {"type": "WarmupLR"}}, "builds the learning-rate schedule from lr_scheduler"),
    ({"zero_optimization": {"stage": 1}, "compile": {"disable": False}}, "compile section .* is not built"),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}, "offload to nvme is not built"),
    ({"zero_optimization": {"stage": 2}, "fp16": {"enabled": True}}, "fp16 with DeepSpeed is not built"),
    ({"zero_optimization": {"stage": 2}, "bf16": {"enabled": False}}, "bf16.enabled: false and the config bf16: true"),
    ({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 3}, "train_micro_batch_size_per_gpu: 3 and the config micro_batch_size: 2"),
    ({"zero_optimization": {"stage": 2}, "gradient_clipping": 5.0}, "gradient_clipping: 5.0 and the config max_grad_norm: 1.0"),
    ({"zero_optimization": {"stage": 2}, "train_batch_size": 64}, "train_batch_size must be \"auto\""),
])
def test_bad_deepspeed_files_are_refused_at_validation(config, tmp_path, content, words):
    import json

    path = tmp_path / "ds.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ConfigError, match=words):
        config(deepspeed=str(path), bf16=True, micro_batch_size=2, max_grad_norm=1.0)


def test_fp16_with_deepspeed_is_refused_also_when_the_file_says_nothing_of_fp16(config, tmp_path):
    """rlft runs DeepSpeed without fp16 (no loss scaler there): `fp16: true` with a file that has no fp16 section would
    have trained fp16 autocast with nothing to catch an overflow."""
    import json

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    with pytest.raises(ConfigError, match="fp16 with DeepSpeed is not built"):
        config(deepspeed=str(path), fp16=True, micro_batch_size=2, max_grad_norm=1.0)


def test_deepspeeds_auto_values_come_from_the_config(config, monkeypatch):
    from rlft.config.parallel import deepspeed_settings
    from rlft.config.settings import resolve
    from rlft.train.zero import engine_config

    cfg = config(deepspeed="deepspeed_configs/zero3.json", micro_batch_size=4, gradient_accumulation_steps=2, max_grad_norm=0.5)
    monkeypatch.setenv("WORLD_SIZE", "2")
    settings = resolve(cfg)
    filled = engine_config(deepspeed_settings(cfg), settings.parallel, settings.optim, bf16=False, hidden_size=64)
    assert (filled["train_micro_batch_size_per_gpu"], filled["gradient_accumulation_steps"], filled["train_batch_size"]) == (4, 2, 16)
    assert filled["gradient_clipping"] == 0.5 and filled["bf16"]["enabled"] is False and filled["fp16"]["enabled"] is False
    zero = filled["zero_optimization"]
    assert (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"], zero["stage3_param_persistence_threshold"]) == (4096, 3686, 640)
    assert "zero_force_ds_cpu_optimizer" not in filled  # no offload: DeepSpeed's own rule stands
    cfg = config(deepspeed="deepspeed_configs/zero2.json", max_grad_norm=None)
    monkeypatch.setenv("WORLD_SIZE", "1")
    settings = resolve(cfg)
    filled = engine_config(deepspeed_settings(cfg), settings.parallel, settings.optim, bf16=True, hidden_size=None)
    assert filled["zero_force_ds_cpu_optimizer"] is False and filled["gradient_clipping"] == 0.0 and filled["bf16"]["enabled"]


def test_a_peers_failure_is_told_apart(monkeypatch):
    from rlft.train.parallel import peer_failure

    gone = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:2944")
    assert not peer_failure(gone)  # one process: nothing to blame on a peer
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert peer_failure(gone) and not peer_failure(ValueError("a bug"))


def test_fewer_batches_than_processes_pad_every_process():
    plan = BatchPlan(list(range(2)), 2, seed=0, pad_id=0, shard=(1, 2), collate=lambda rows: {"rows": rows})
    assert len(plan) == 1 and plan.is_padding(0) and plan.epoch_order(0) == [plan.epoch_order(0)[0]]


def test_deepspeed_and_torch_compile_say_what_the_machine_lacks(config, monkeypatch):
    """Before the model loads: DeepSpeed not installed names the pip extra; on a CPU without a C++ compiler,
    torch_compile (which compiles kernels) says so instead of failing mid-run. DeepSpeed compiles nothing on a CPU
    (test_distributed.py::test_sft_two_processes_equal_one): it needs no compiler."""
    import importlib.util
    import shutil

    import torch

    from rlft.errors import ConfigError
    from rlft.train.unbuilt import missing_build_tools, refuse_unbuilt

    assert missing_build_tools(config(torch_compile=True, deepspeed="deepspeed_configs/zero2.json")) == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real_find_spec(name, *a))
    problems = missing_build_tools(config(deepspeed="deepspeed_configs/zero2.json"))
    assert len(problems) == 1 and "DeepSpeed, which is not installed: pip install -c constraints.txt 'rlft[deepspeed]'" in problems[0]
    with pytest.raises(ConfigError, match="torch_compile: on a CPU it compiles C\\+\\+ code"):
        refuse_unbuilt(config(torch_compile=True))
    assert missing_build_tools(config(torch_compile=False)) == []


def test_the_launching_command_starts_the_processes_without_loading_transformers_models(tmp_path, make_config):
    """`rlft train --num-processes N` checks the config and starts the launcher; the model code (seconds of imports)
    is for the training processes. The launcher is replaced by a stand-in that records what was imported."""
    import subprocess
    import sys

    config = make_config(output_dir=str(tmp_path / "out"))
    probe = ("import subprocess, sys\n"
             "class Stop(BaseException): pass\n"
             "def start(*args, **kwargs):\n"
             "    print(sorted(m for m in sys.modules if m.startswith(('transformers.models', 'datasets', 'rlft.train.run'))))\n"
             "    raise Stop\n"
             "subprocess.Popen = start\n"
             "from rlft.cli import main\n"
             "try:\n"
             f"    main(['train', {str(config)!r}, '--num-processes', '2'])\n"
             "except Stop:\n"
             "    pass\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_training_process_under_a_launcher_ends_without_the_interpreters_shutdown(make_config, processes):
    """Under a launcher (WORLD_SIZE > 1) the command's atexit handlers run and its exit code stands, but nothing of
    the interpreter's shutdown (where gloo's threads aborted finished runs) does: no object is finalised there."""
    import subprocess
    import sys

    probe = ("import atexit, os, sys\n"
             "class Witness:\n"
             "    def __del__(self, write=os.write):  # os is gone from the module by then\n"
             "        write(1, b'finalised at shutdown\\n')\n"
             "witness = Witness()\n"
             "atexit.register(lambda: os.write(1, b'atexit ran\\n'))\n"
             f"sys.argv = ['rlft', 'validate', {str(make_config())!r}]\n"
             "from rlft.cli import run_command\n"
             "run_command()\n")
    env = dict(__import__("os").environ, WORLD_SIZE=processes, RANK="1" if processes == "2" else "0")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stdout and "atexit ran" in done.stdout
    assert ("finalised at shutdown" in done.stdout) == (processes == "1"), done.stdout


def test_a_cuda_training_process_keeps_masked_attention_off_cudnn(config, monkeypatch):
    """cuDNN's SDPA backend plans every new batch shape and its backward has returned NaN gradients with attention
    masks on Hopper GPUs: a training process on CUDA turns it off (TF32 only when asked)."""
    import torch

    from rlft.train.parallel import cuda_settings

    calls = []
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", lambda on: calls.append(on))
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        cuda_settings(config(tf32=False))
        assert calls == [False] and torch.backends.cuda.matmul.allow_tf32 is False
        cuda_settings(config(tf32=True))
        assert calls == [False, False] and torch.backends.cuda.matmul.allow_tf32 is True
        # auto, the default (Axolotl's): TF32 where the GPU has it, as transformers tells
        assert config().tf32 == "auto" and config(tf32="auto").tf32 == "auto"
        for available in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = False
            monkeypatch.setattr("transformers.utils.is_torch_tf32_available", lambda: available)
            cuda_settings(config())
            assert torch.backends.cuda.matmul.allow_tf32 is available
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_bf16_defaults_to_auto_as_axolotl_and_fp16_wins_over_it(config, monkeypatch):
    """Axolotl's default is bf16: auto (bf16 on a GPU that has it); an Axolotl config without the key trained fp32 on
    an H100 here. fp16: true is not overridden by the default."""
    import torch

    from rlft.train.parallel import trains_in_bf16

    assert config().bf16 == "auto"
    assert not trains_in_bf16(config())  # a CPU: fp32
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert trains_in_bf16(config()) and not trains_in_bf16(config(fp16=True)) and not trains_in_bf16(config(bf16=False))


def test_axolotls_ddp_keys_reach_ddp_and_are_refused_beside_sharding(config, config_problems, monkeypatch):
    from rlft.train import parallel

    assert parallel.ddp_options(config()) == {}
    cfg = config(ddp_find_unused_parameters=True, ddp_bucket_cap_mb=50, ddp_broadcast_buffers=False)
    assert parallel.ddp_options(cfg) == {"find_unused_parameters": True, "bucket_cap_mb": 50, "broadcast_buffers": False}
    monkeypatch.setattr(parallel, "launched", lambda: (0, 2))  # as under a launcher: accelerate takes them to DDP
    handler = parallel.make_accelerator(cfg).ddp_handler
    assert (handler.find_unused_parameters, handler.bucket_cap_mb, handler.broadcast_buffers) == (True, 50, False)
    assert parallel.strategy(cfg, 2) == ("data parallel (DDP: looks for unused parameters, 50 MiB gradient buckets, "
                                         "no buffer broadcast)")
    assert parallel.strategy(config(), 2) == "data parallel (DDP)"
    [(_, message)] = config_problems(ddp_find_unused_parameters=True, fsdp=["full_shard"],
                                     fsdp_config={"fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer"})
    assert message == ("ddp_find_unused_parameters sets up DDP (plain data parallelism), and fsdp reduces gradients its own "
                       "way: remove it")
    assert config(ddp_find_unused_parameters=False, deepspeed="deepspeed_configs/zero2.json")  # what happens anyway
    assert config_problems(ddp_bucket_cap_mb=0)


def test_accelerate_never_compiles_the_model_even_when_its_config_asks(config, monkeypatch):
    """`accelerate launch` sets ACCELERATE_DYNAMO_BACKEND from `accelerate config`; accelerate's `prepare` would wrap the
    model in a compile of its own, on top of torch_compile's (or despite torch_compile: false)."""
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import DynamoBackend

    from rlft.train import parallel

    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "INDUCTOR")
    AcceleratorState._reset_state(True)  # accelerate reads the variable when its process state is first made
    try:
        accelerator = parallel.make_accelerator(config())
        assert accelerator.state.dynamo_plugin.backend == DynamoBackend.NO
        model, _ = accelerator.prepare(torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
        assert type(model) is torch.nn.Linear
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()


@pytest.mark.parametrize("asked", [None, "NO", "INDUCTOR"])
def test_the_plan_says_which_compile_runs_and_what_becomes_of_accelerates(asked, config, monkeypatch):
    """The plan's one compile row: what compiles (the rollout engine's decode too, where it runs in the process), what
    becomes of accelerate's compile, and that the first steps pay for it."""
    from rlft.config.settings.model import model_settings
    from rlft.models.compile import compile_plan

    if asked is None:
        monkeypatch.delenv("ACCELERATE_DYNAMO_BACKEND", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", asked)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    settings = model_settings(config(torch_compile=True, torch_compile_backend="aot_eager"))
    compiled, decoding = compile_plan(settings), compile_plan(settings, engine_decodes=True)
    assert compiled.startswith("rlft's torch.compile of the training forward (torch_compile: true; aot_eager, mode default)")
    cost = "; the first steps compile (seconds to a minute), then run faster"
    assert compiled.endswith(cost) and decoding.endswith(cost)
    assert decoding.replace("; the rollout engine decodes with a static KV cache and a compiled step", "") == compiled
    plain, auto = (compile_plan(model_settings(config(torch_compile=flag))) for flag in (False, "auto"))
    if asked != "INDUCTOR":  # nothing asks accelerate to compile
        assert compiled.endswith(f"mode default){cost}") and plain is None and auto is None
        return
    assert compiled.endswith("; ACCELERATE_DYNAMO_BACKEND=INDUCTOR (accelerate's compile, from `accelerate config`) is "
                             f"not applied on top: the model is compiled once{cost}")
    assert plain == ("none (torch_compile: false); ACCELERATE_DYNAMO_BACKEND=INDUCTOR (accelerate's compile, from "
                     "`accelerate config`) is not applied: rlft compiles only as torch_compile says (set torch_compile: "
                     "true, with torch_compile_backend for a backend other than inductor)")
    assert auto.startswith("none (torch_compile: auto: CUDA GPUs only); ACCELERATE_DYNAMO_BACKEND=INDUCTOR")


def test_zero3_partitions_the_weights_on_one_process_too_and_fsdp_only_on_several(config):
    """DeepSpeed partitions ZeRO-3's parameters on one process as well: a GRPO engine is then built from a gathered whole
    copy, and moving a reference copy towards the weights is refused as with several processes. FSDP2 on one process
    shards nothing."""
    from rlft.config.parallel import partitioned
    from rlft.errors import NotImplementedYet
    from rlft.train.unbuilt import refuse_unbuilt

    zero3, fsdp = config(deepspeed="deepspeed_configs/zero3.json"), config(fsdp_config={"fsdp_version": 2})
    assert [partitioned(zero3, 1), partitioned(zero3, 2), partitioned(fsdp, 1), partitioned(fsdp, 2)] == [True, True, False, True]
    assert not partitioned(config(deepspeed="deepspeed_configs/zero2.json"), 2) and not partitioned(config(), 2)
    grpo = {"rl": "grpo", "micro_batch_size": 4,
            "trl": {"num_generations": 4, "reward_funcs": ["r.f"], "sync_ref_model": True, "beta": 0.01}}
    with pytest.raises(NotImplementedYet, match="trl.sync_ref_model with fsdp or DeepSpeed ZeRO-3: moving a reference copy"):
        refuse_unbuilt(config(deepspeed="deepspeed_configs/zero3.json", **grpo), processes=1)
    refuse_unbuilt(config(deepspeed="deepspeed_configs/zero2.json", **grpo), processes=1)
