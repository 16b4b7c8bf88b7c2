"""Cosmos-RL configs as a second front end: a Cosmos-RL TOML (or the same structure as YAML) is checked against Cosmos-RL's
schema (`schema`), translated into rlft's config by one table of rows (`translate`, the rows in `rows_*`), and then
validated and run as any rlft config. docs/cosmos-rl.md shows the table."""
