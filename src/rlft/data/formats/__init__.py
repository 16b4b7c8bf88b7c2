"""Row formats: a raw dataset row -> the canonical record of its method (SFT, preference and KTO, EBFT)."""
