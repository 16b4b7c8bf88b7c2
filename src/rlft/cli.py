"""`rlft` command line: train | evaluate | validate | preprocess | vllm-serve | generate | score | merge-lora | quickstart."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from rich.console import Console
from rich.table import Table

from rlft import __version__
from rlft.config.parallel import launched
from rlft.errors import ConfigError, RlftError, Terminated, TrainingInterrupted
from rlft.heap import collector_paused, release_heap

console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # messages stay whole lines: easy to read and grep


def _train(args: argparse.Namespace) -> int:
    from rlft.config import load_config

    cfg = load_config(args.config, args.overrides)  # a bad config stops here, before any process starts
    WEIGHTS_ONLY[:] = [cfg.save_only_model]  # what the lines for a run stopped from outside say of its checkpoints

    if args.num_processes > 1 or args.nnodes > 1:
        from rlft.train.launch import check_devices, launch_command, run_launched
        from rlft.train.parallel import check_layer_classes
        from rlft.train.unbuilt import refuse_unbuilt

        refuse_unbuilt(cfg, args.num_processes)  # said once, before any process starts
        check_devices(args.num_processes // max(1, args.nnodes))
        check_layer_classes(cfg)

        if "WORLD_SIZE" in os.environ:
            raise ConfigError("--num-processes inside an already launched process (torchrun / accelerate launch set "
                              "WORLD_SIZE): use one launcher, e.g. `rlft train CONFIG --num-processes N` alone")
        return run_launched(launch_command(args.config, args.overrides, args.num_processes, args.nnodes, args.node_rank,
                                           args.main_ip, args.main_port, args.debug), resume_hint())
    with collector_paused():  # not before: the launching command only checks the config (seconds sooner)
        from rlft.train.run import train

    with stop_on_sigterm():
        train(cfg, console if launched()[0] == 0 else Console(quiet=True))  # rank 0 reports for all; every rank's errors reach stderr
    return 0


SIGTERM_SEEN: list[bool] = []  # set by stop_on_sigterm's handler: whatever error follows is reported as the SIGTERM
WEIGHTS_ONLY: list[bool] = []  # set by `train`: [True] where its checkpoints hold the weights only (save_only_model)


def resume_hint() -> str:
    """What to do with the checkpoints of a run stopped outside its steps (SIGTERM, Ctrl-C, a failed process)."""
    if WEIGHTS_ONLY == [True]:
        return ("they hold the weights only (save_only_model: true): a new run can start from the newest one's model/ "
                "folder, none can resume")
    return "resume with --resume_from_checkpoint=auto"


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within: SIGTERM raises Terminated, so that the run stops through its `finally` blocks (the servers and
    environments it started are stopped) and says why in one line. Python's default would end the process without a
    word, and a launched process would or would not print its own error depending on whether it saw its peer's death
    before the launcher's SIGTERM. Outside the main thread (where no handler can be set) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(*_) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # said once
        SIGTERM_SEEN.append(True)  # a library may turn Terminated into an error of its own (torch's CheckpointException)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _validate(args: argparse.Namespace) -> int:
    from rlft.config import explain, load_config

    if args.explain:
        for key in args.explain:
            console.print(explain(key), markup=False, highlight=False)
        if not args.config:
            return 0
    if not args.config:
        raise ConfigError("validate needs a CONFIG file (or --explain KEY)")
    try:
        load_config(args.config, args.overrides)
    except ConfigError as exc:
        err_console.print(str(exc), style="red", markup=False, highlight=False)
        return 1
    console.print("OK")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from rlft.config import load_config
    from rlft.train.run import evaluate

    evaluate(load_config(args.config, args.overrides), console)
    return 0


def _preprocess(args: argparse.Namespace) -> int:
    from rlft.config import load_config
    from rlft.config.plugins import nemo_gym_enabled
    from rlft.data.prepare import ebft_steps, prepare_data, preference_steps, prompt_steps, sft_steps
    from rlft.models.loading import check_context_length, load_tokenizer

    cfg = load_config(args.config, args.overrides)
    if nemo_gym_enabled(cfg):
        raise ConfigError("rlft preprocess prepares datasets:, and with NeMo Gym on the prompts are nemo_gym_datasets' "
                          "tasks, which the running Gym servers route: `rlft train` prepares them (and starts the servers "
                          "with nemo_gym_auto_start); `rlft validate` checks the config")
    check_context_length(cfg)
    steps = {"sft": sft_steps, "grpo": prompt_steps, "gdpo": prompt_steps, "ebft": ebft_steps}.get(cfg.method)
    steps = steps(cfg) if steps else preference_steps(cfg.method)
    tokenizer = load_tokenizer(cfg)
    if cfg.streamed:  # nothing to prepare: the first buffer, to check the format and lengths
        from rlft.data.inspect import describe_examples
        from rlft.data.stream import preview

        examples, line = preview(cfg, tokenizer)
        if args.debug or cfg.debug:
            console.print("[bold]trained tokens in bold green, the rest dim[/]")
            for text in describe_examples(examples, tokenizer, args.debug_num_examples):
                console.print(text)
        console.print(line, markup=False, highlight=False)
        return 0
    data = prepare_data(cfg, tokenizer, steps)
    if args.debug or cfg.debug:
        from rlft.data.inspect import describe_examples

        console.print("[bold]trained tokens in bold green, the rest dim[/]")
        for line in describe_examples(data.train, tokenizer, args.debug_num_examples):
            console.print(line)
    table = Table(title=f"rlft preprocess ({cfg.method})")
    table.add_column("dataset", overflow="fold", min_width=24)
    for column in ("rows", "kept", "dropped", "truncated", "tokens"):
        table.add_column(column)
    table.caption = "tokens per row: min/mean/p95/max"
    for report in data.reports:
        info = report.summary()
        tokens = info["tokens"]
        lengths = f"{tokens['min']}/{tokens['mean']}/{tokens['p95']}/{tokens['max']}" if tokens else "-"
        table.add_row(info["dataset"], str(info["rows"]), str(info["kept"]), report.dropped_text(), str(info["truncated"]), lengths)
    console.print(table)
    console.print(f"train rows: {len(data.train)}, eval rows: {len(data.eval)}")
    return 0


SERVE_FLAGS = ("host", "port", "tensor_parallel_size", "data_parallel_size", "gpu_memory_utilization", "dtype", "max_model_len",
               "enable_prefix_caching", "enforce_eager", "backend", "api_key")


def _serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from rlft.config import load_config
    from rlft.rollout.server.launch import serve

    cfg = load_config(args.config, args.overrides)
    for name in SERVE_FLAGS:  # flags override the `vllm:` section (booleans too, when given as --no-...)
        value = getattr(args, name)
        if value is not None:
            try:
                setattr(cfg.vllm, name, value)
            except ValidationError as exc:
                raise ConfigError(f"--{name.replace('_', '-')} {value}: {exc.errors()[0]['msg']}") from None
    return serve(cfg, console, backend_name=cfg.vllm.backend)


def _generate(args: argparse.Namespace) -> int:
    from rlft.models.generation import generate_texts
    from rlft.models.loading import load_for_inference
    from rlft.models.mistral_common import is_mistral_common

    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--num-samples", args.num_samples)):
        if value < 1:
            raise ConfigError(f"{flag} {value}: give at least 1")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise ConfigError(f"--temperature {args.temperature} --top-p {args.top_p}: the temperature is 0 (greedy) or more, "
                          "top-p in (0, 1]")
    if args.num_samples > 1 and args.temperature == 0:
        raise ConfigError(f"--num-samples {args.num_samples} with --temperature 0 (greedy) would give the same answer "
                          f"{args.num_samples} times: add --temperature 0.8 (or another value above 0)")
    model, tokenizer = load_for_inference(args.model)
    prompts = args.prompt
    if args.chat:  # mistral-common's control tokens exist only as ids: its prompts are given as ids
        rendered = is_mistral_common(tokenizer)
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=rendered, add_generation_prompt=True,
                                                 **({"return_dict": False} if rendered else {})) for p in prompts]
    texts = generate_texts(model, tokenizer, prompts, args.max_new_tokens, args.temperature, args.top_p, args.num_samples, seed=args.seed,
                           add_special_tokens=not args.chat)
    for index, text in enumerate(texts):
        prompt = args.prompt[index // args.num_samples]
        console.print(f"[bold]{prompt}[/]{text}", highlight=False)
    return 0


def _merge_lora(args: argparse.Namespace) -> int:
    from rlft.models.loading import load_for_inference

    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.force:
        raise RlftError(f"{out} exists and is not empty: merging would overwrite what is there; pick another folder, or "
                        "add --force to replace it")
    model, tokenizer = load_for_inference(args.checkpoint)
    if not hasattr(model, "merge_and_unload"):
        raise RlftError(f"{args.checkpoint} holds a full model, not a LoRA adapter: there is nothing to merge")
    merged = model.merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    console.print(f"merged model written to {out.resolve()}")
    return 0


def _score(args: argparse.Namespace) -> int:
    from rlft.models.reward import load_reward_for_scoring, score_texts

    model, tokenizer = load_reward_for_scoring(args.model)
    for text, score in zip(args.text, score_texts(model, tokenizer, args.text)):
        console.print(f"{score:+.4f}  {text}", highlight=False, markup=False)
    return 0


def _quickstart(args: argparse.Namespace) -> int:
    from rlft.quickstart import quickstart_config, run_quickstart

    WEIGHTS_ONLY[:] = [quickstart_config(Path(args.config), args.overrides).save_only_model]  # as `train` does
    with stop_on_sigterm():
        run_quickstart(Path(args.config), args.overrides, console)
    return 0


OVERRIDES_HELP = """overrides: any config key after the config file, as --key=value or --key value; values are YAML:
  --learning_rate=1e-4 --max_steps 200          top-level keys
  --trl.beta=0.01 --vllm.port=8001              keys of a section: section.key
  --lora_target_modules='[q_proj, v_proj]'      lists and mappings in YAML flow style
  --bf16                                        a bare flag is true
  --resume_from_checkpoint=auto                 continue from the newest checkpoint in output_dir

common keys: base_model, datasets, output_dir, sequence_len, micro_batch_size, gradient_accumulation_steps,
  num_epochs / max_steps, learning_rate, lr_scheduler, warmup_steps, optimizer, bf16, adapter (lora_r, lora_alpha),
  eval_steps / evals_per_epoch, save_steps / saves_per_epoch, rl (dpo, kto, orpo, simpo, grpo, gdpo, ebft), trl.*
every key: rlft validate --explain KEY, and docs/config.md"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlft", description="Post-train language models from one YAML file.")
    parser.add_argument("--version", action="version", version=f"rlft {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks (preprocess --debug: also the first rows token by token)")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("train", help="train from a config (overrides: --key=value, --trl.beta=0.01)",
                            formatter_class=argparse.RawDescriptionHelpFormatter, epilog=OVERRIDES_HELP)
    p.add_argument("config")
    p.add_argument("--num-processes", "--num_processes", type=int, default=1, dest="num_processes", metavar="N",
                   help="training processes in all, over every node (one per GPU); starts them with accelerate launch")
    p.add_argument("--nnodes", "--num-machines", "--num_machines", type=int, default=1, dest="nnodes", help="nodes (machines)")
    p.add_argument("--node-rank", "--node_rank", "--machine-rank", type=int, default=0, dest="node_rank",
                   help="this node's index, 0 on the first")
    p.add_argument("--main-process-ip", "--main_process_ip", "--master-addr", dest="main_ip", help="address of node 0")
    p.add_argument("--main-process-port", "--main_process_port", "--master-port", type=int, dest="main_port",
                   help="port on node 0 for the rendezvous")
    p.set_defaults(run=_train)

    p = commands.add_parser("evaluate", help="eval metrics of the config's model on its eval data; no training "
                            "(point base_model at a trained output: --base_model=outputs/run)")
    p.add_argument("config")
    p.set_defaults(run=_evaluate)

    p = commands.add_parser("validate", help="check a config without loading models or data")
    p.add_argument("config", nargs="?")
    p.add_argument("--explain", action="append", metavar="KEY", help="describe a key, e.g. trl.beta")
    p.set_defaults(run=_validate)

    p = commands.add_parser("preprocess", help="load and tokenise the datasets; report kept, dropped and truncated rows "
                            "(--debug: show the first rows token by token, trained tokens marked)")
    p.add_argument("--debug-num-examples", type=int, default=3, help="rows shown by --debug (default 3)")
    p.add_argument("config")
    p.set_defaults(run=_preprocess)

    p = commands.add_parser("vllm-serve", aliases=["serve"],
                            help="serve base_model for rollouts over HTTP (vLLM on GPUs, transformers anywhere)")
    p.add_argument("config")
    p.add_argument("--host", help="vllm.host: address to listen on")
    p.add_argument("--port", type=int, help="vllm.port")
    p.add_argument("--backend", choices=["auto", "transformers", "vllm"], help="vllm.backend")
    p.add_argument("--api-key", help="vllm.api_key: token for weight-changing endpoints (or env RLFT_SERVER_TOKEN)")
    p.add_argument("--tensor-parallel-size", type=int)
    p.add_argument("--data-parallel-size", type=int)
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--dtype")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None)
    p.set_defaults(run=_serve)

    p = commands.add_parser("generate", help="sample from a model folder or checkpoint (LoRA loads on its base)")
    p.add_argument("model")
    p.add_argument("--prompt", action="append", required=True, help="repeat for several prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user message with the chat template")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=_generate)

    p = commands.add_parser("merge-lora", help="merge a LoRA checkpoint into its base and save a full model")
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--force", action="store_true", help="write into OUT even when it already holds files")
    p.set_defaults(run=_merge_lora)

    p = commands.add_parser("score", help="score texts with a trained reward model (higher = preferred)")
    p.add_argument("model")
    p.add_argument("--text", action="append", required=True, help="repeat for several texts")
    p.set_defaults(run=_score)

    p = commands.add_parser("quickstart", help="offline demo: tiny model learns addition; accuracy before/after")
    p.add_argument("--config", default="examples/quickstart/sft.yaml")
    p.set_defaults(run=_quickstart)
    return parser


def main(argv: list[str] | None = None) -> int:
    SIGTERM_SEEN.clear()  # a run before this one in the same process (tests) is not this one
    WEIGHTS_ONLY.clear()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # our own progress bar is the one to watch
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    with collector_paused():
        import torch

    if not torch.cuda.is_available():  # said, so that DeepSpeed (imported by transformers when installed) does not warn
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import logging

    logging.getLogger("rlft.rewards").propagate = False  # the recipe prints reward failures on the run's console
    # torchao, which transformers and PEFT import when it is installed (rlft[qat]), logs that its CUDA kernels do not
    # load on a machine without CUDA, and torch notes its Enum registrations: lines before every run that mean nothing
    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    logging.getLogger("rlft.rewards").addHandler(logging.NullHandler())
    if not sys.stderr.isatty():  # progress bars in logs are only carriage-return noise
        if "datasets" in sys.modules:
            from datasets.utils.logging import disable_progress_bar

            disable_progress_bar()
        else:  # read when datasets is imported: importing it here would cost a second to commands that never use it
            os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    args, extra = parser.parse_known_args([a for a in argv if a != "--debug"])
    args.debug = debug
    if extra and args.command not in ("train", "evaluate", "validate", "preprocess", "quickstart", "vllm-serve", "serve"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = extra
    try:
        return args.run(args)
    except RlftError as exc:
        if args.debug:
            raise
        if SIGTERM_SEEN:
            return stopped_by_sigterm()
        rank, processes = launched()
        if isinstance(exc, TrainingInterrupted) and rank != 0:
            return 130  # the processes stopped together: rank 0 says where the checkpoint is
        where = f" (rank {rank} of {processes})" if processes > 1 else ""
        err_console.print(f"error{where}:", style="bold red", end=" ")
        err_console.print(str(exc), markup=False, highlight=False)  # messages quote YAML like [ipo]: no markup
        return 130 if isinstance(exc, TrainingInterrupted) else 1
    except Terminated:
        return stopped_by_sigterm()
    except KeyboardInterrupt:  # outside the training steps (loading, final export, summary): the loop saves its own
        return interrupted_outside_the_steps()
    except BaseException as exc:  # torch's CheckpointException is one: it wraps what failed while a checkpoint was written
        from rlft.train.parallel import peer_failure

        if SIGTERM_SEEN and not args.debug:
            return stopped_by_sigterm()
        if args.debug or not peer_failure(exc):
            raise
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the launcher's SIGTERM, a moment later: this line is enough
        rank, processes = launched()
        lines = str(exc).splitlines() or [type(exc).__name__]
        line = next((text for text in lines if "by peer" in text), lines[0])  # DCP's exception: the failure is inside
        detail = re.sub(r"^\s*\[[^\]]*\]\s*", "", line).split(". ")[0][:160]  # gloo: "[file:line] what. advice"
        err_console.print(f"error (rank {rank} of {processes}): another training process stopped first, so this one cannot go on "
                          f"({detail}); that process's own error is above", markup=False, highlight=False)
        return 1
    finally:
        release_heap()  # for a caller that goes on (tests); the command itself exits next


def interrupted_outside_the_steps() -> int:
    err_console.print(f"interrupted outside the training steps: nothing to save beyond the checkpoints already written; "
                      f"{resume_hint()}", markup=False, highlight=False)
    return 130


def stopped_by_sigterm() -> int:
    """One line for a run that SIGTERM stopped, and its exit status."""
    rank, processes = launched()
    where = f" (rank {rank} of {processes})" if processes > 1 else ""
    cause = ("the launcher stops every process when one fails, and that process's error is above; a scheduler does "
             "when it cancels the job") if processes > 1 else "a scheduler cancelling the job, or `kill`"
    err_console.print(f"error{where}: stopped by SIGTERM ({cause}). Checkpoints are written whole or not at all: "
                      f"{resume_hint()}", markup=False, highlight=False)
    return 143


def run_command() -> None:
    """The `rlft` command: main(), then exit with its code. A Ctrl-C that lands after main() has returned (while the
    interpreter shuts down torch's libraries) is ignored: the run is over and its result printed, and Python would
    otherwise print a traceback from an atexit hook. One that lands in the instant before SIGINT is ignored keeps
    main()'s code; one that escapes main() itself (before its handling begins, or in its last line) is answered as
    main() answers a Ctrl-C outside the training steps: no traceback."""
    code = None
    try:
        code = main()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:
        while signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # pressed again in the instant before it took
            with contextlib.suppress(KeyboardInterrupt):
                signal.signal(signal.SIGINT, signal.SIG_IGN)
        if code is None:
            code = interrupted_outside_the_steps()
    if launched()[1] > 1:
        end_training_process(code)
    gc.freeze()  # the interpreter's last collections would walk every object left for nothing (0.8 s with torch loaded)
    sys.exit(code)


def end_training_process(code: int) -> NoReturn:
    """A training process under a launcher ends without the interpreter's shutdown. In that shutdown gloo's threads
    could still hold work with tensors in it, and a run that had finished died of SIGABRT ("terminate called without
    an active exception", its launcher then failing the run): twice in three full test runs on one machine, in a
    different test each time, with or without destroy_process_group first. The atexit handlers run (log handlers;
    trackers and checkpoints are closed before), then the process exits with `code`."""
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_command()
