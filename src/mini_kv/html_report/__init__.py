"""`mini-kv report`: one self-contained HTML page (inline SVG charts, tables) built from the attempt store."""
