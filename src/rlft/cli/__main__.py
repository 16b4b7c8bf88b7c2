"""`python -m rlft.cli ARGS`: the `rlft` command (launchers start training processes this way)."""

from rlft.cli import run_command

run_command()
