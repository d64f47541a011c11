"""Strict readers: every file mini_kv reads passes through here before it is used."""
