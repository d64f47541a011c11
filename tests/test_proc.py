"""mini_kv.proc's tree signals: a stop holds a tree that forks as it is signalled."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from mini_kv.proc import ProcessTree, _state, kill_group, signal_tree

# forks as fast as it can; each child spins a little (a window in which it runs), then ends
FORKER = """
import os
while True:
    if os.fork() == 0:
        sum(range(20000))
        os._exit(0)
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
"""


def test_a_stop_holds_every_process_of_a_tree_that_forks_while_it_is_signalled():
    proc = subprocess.Popen([sys.executable, "-c", FORKER], start_new_session=True)
    try:
        time.sleep(0.3)
        for _ in range(20):
            signal_tree(proc.pid, signal.SIGSTOP)
            states = {pid: _state(pid) for pid in [proc.pid, *ProcessTree.scan().below(proc.pid)]}
            assert set(states.values()) <= set("TtZX"), states  # nothing forked past the last scan runs
            signal_tree(proc.pid, signal.SIGCONT)
            time.sleep(0.01)
    finally:
        kill_group(proc.pid)
        proc.wait(timeout=10)
