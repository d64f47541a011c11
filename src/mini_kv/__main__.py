from mini_kv.cli import entry

entry()
