"""Meshnet shard fleet: serve one large GGUF model as a pipeline of layer ranges."""

__version__ = "0.1.0"
