"""mini_kv: a verifier and benchmark platform for custom GPU operators."""

__version__ = "0.1.0"
