"""Rollouts for online RL: typed rollout data, engines, scorers (reward functions, feature matching), the producer.

See docs/rollouts.md for how they fit together."""
