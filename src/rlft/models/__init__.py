"""Models, tokenizers, chat templates and adapters."""
