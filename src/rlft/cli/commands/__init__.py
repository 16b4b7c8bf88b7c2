"""One module per `rlft` subcommand (inference: generate, merge-lora, score); each handler takes the parsed arguments
and the command's state and returns the exit code."""
