"""Small synthetic tasks with verifiable answers, for the offline quickstart, tests and demos."""
