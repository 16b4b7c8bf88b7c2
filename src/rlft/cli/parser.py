"""The `rlft` command line's arguments: one subcommand each, and where each one's handler lives.

A subcommand names its handler as (module in rlft.cli.commands, function): the module is imported only when its
command runs, so that `rlft --help` and `rlft validate` import no model or training code.
"""

from __future__ import annotations

import argparse

from rlft import __version__

# the commands that take config overrides (--key=value) after their arguments
OVERRIDE_COMMANDS = ("train", "evaluate", "validate", "preprocess", "quickstart", "vllm-serve", "serve")

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
    p.set_defaults(handler=("train", "train"))

    p = commands.add_parser("evaluate", help="eval metrics of the config's model on its eval data; no training "
                            "(point base_model at a trained output: --base_model=outputs/run)")
    p.add_argument("config")
    p.set_defaults(handler=("evaluate", "evaluate"))

    p = commands.add_parser("validate", help="check a config (rlft YAML, or a Cosmos-RL TOML) without loading models or data")
    p.add_argument("config", nargs="?")
    p.add_argument("--explain", action="append", nargs="?", const="", metavar="KEY",
                   help="describe a key (trl.beta, train.train_policy.kl_beta); with no KEY, or given the config: each "
                        "key the config sets, and for a Cosmos-RL file what it became in rlft")
    p.set_defaults(handler=("validate", "validate"))

    p = commands.add_parser("convert", help="write the rlft YAML of a Cosmos-RL config (TOML or YAML)")
    p.add_argument("config")
    p.add_argument("-o", "--output", help="the YAML file to write (default: print it)")
    p.add_argument("--force", action="store_true", help="replace OUTPUT when it exists")
    p.set_defaults(handler=("convert", "convert"))

    p = commands.add_parser("preprocess", help="load and tokenise the datasets; report kept, dropped and truncated rows "
                            "(--debug: show the first rows token by token, trained tokens marked)")
    p.add_argument("--debug-num-examples", type=int, default=3, help="rows shown by --debug (default 3)")
    p.add_argument("config")
    p.set_defaults(handler=("preprocess", "preprocess"))

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
    p.set_defaults(handler=("serve", "serve"))

    p = commands.add_parser("generate", help="sample from a model folder or checkpoint (LoRA loads on its base)")
    p.add_argument("model")
    p.add_argument("--prompt", action="append", required=True, help="repeat for several prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user message with the chat template")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=("inference", "generate"))

    p = commands.add_parser("merge-lora", help="merge a LoRA checkpoint into its base and save a full model")
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--force", action="store_true", help="write into OUT even when it already holds files")
    p.set_defaults(handler=("inference", "merge_lora"))

    p = commands.add_parser("score", help="score texts with a trained reward model (higher = preferred)")
    p.add_argument("model")
    p.add_argument("--text", action="append", required=True, help="repeat for several texts")
    p.set_defaults(handler=("inference", "score"))

    p = commands.add_parser("quickstart", help="offline demo: tiny model learns addition; accuracy before/after")
    p.add_argument("--config", default="examples/quickstart/sft.yaml")
    p.set_defaults(handler=("quickstart", "quickstart"))
    return parser
