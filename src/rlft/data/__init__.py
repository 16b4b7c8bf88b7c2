"""Datasets: loading, row formats, tokenisation, length handling, batching and packing."""
