"""Judging: statistics and decisions over benchmark measurements."""
