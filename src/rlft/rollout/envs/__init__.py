"""Environments that score or drive rollouts (NeMo Gym)."""
