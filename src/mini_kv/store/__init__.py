"""Evidence on disk: atomic files, append-only attempts, the index."""
