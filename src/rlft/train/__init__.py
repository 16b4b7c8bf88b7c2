"""The training loop (method-blind), recipes per method, checkpoints and metrics."""
