"""Rollouts for online RL: generation engines, the reward-function runner (loading, workers, timeouts)."""
