"""The config sections: one module per family of keys; `rlft.config.schema.RlftConfig` joins them."""
