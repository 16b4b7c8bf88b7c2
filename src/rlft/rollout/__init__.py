"""Rollouts for online RL: typed rollout data, engines, scorers (reward functions, feature matching), the producer.

See docs/rollout-server.md (the rollout pipeline) for how they fit together."""
