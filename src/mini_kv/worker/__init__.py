"""The only code that imports candidate libraries. It runs in a child process (see runner.py)."""
