"""The planted world the red-team attacks run against (tests/redteam/test_*.py): a fake $HOME full of
secrets, a secret environment variable, TCP and unix-socket listeners on the host, a dir in the host's
/tmp, a project with its .build/ and artifact store, a process of the same user outside; and the
checks, seen from the host, that no attack got anywhere."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

from mini_kv import jail

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROBLEM = ROOT / "tests" / "sol_solutions" / "problem"
FAST = {"device": "cpu", "rounds": 1, "warmup": 1, "repeats": 1, "samples": 3, "timeout": 120.0}
SOL_ATTACKS = sorted(p.name for p in (HERE / "sol").iterdir() if (p / "solution.json").is_file())
FORKS = 600  # more than jail.Limits().processes
MARK = "redteam-escaped-"
INFO = jail.probe()


class Listener:
    """A TCP server on 127.0.0.1 and a unix-socket server in the host's /tmp, remembering who called."""

    def __init__(self, where: Path):
        self.calls: list[str] = []
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        self.path = str(where / "daemon.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.path)
        self.abstract_name = f"mini-kv-redteam-{secrets.token_hex(4)}"
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind("\0" + self.abstract_name)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._serve, args=(s,), daemon=True) for s in self._socks()]
        for s, t in zip(self._socks(), self.threads, strict=True):
            s.listen()
            s.settimeout(0.2)
            t.start()

    def _socks(self):
        return (self.tcp, self.unix, self.abstract)

    def _serve(self, sock: socket.socket) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            self.calls.append(repr(conn.recv(64)))
            conn.close()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)
        for s in self._socks():
            s.close()


def fill(text: str, world: dict) -> str:
    for key, value in world["subst"].items():
        text = text.replace(f"@@{key}@@", str(value))
    return text


def copy_filled(src: Path, dest: Path, world: dict) -> None:
    for p in src.rglob("*"):
        if p.is_file() and "__pycache__" not in p.parts:
            out = dest / p.relative_to(src)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(fill(p.read_text(), world))


@contextlib.contextmanager
def planted_world(base: Path):
    """The planted host under `base`: secrets, listeners, the places an escape would write to."""
    token = "mkvsecret-" + secrets.token_hex(12)
    home = base / "home"
    (home / ".config" / "hub").parent.mkdir(parents=True)
    for name in (".netrc", ".pgpass", ".vault-token", ".config/hub"):
        (home / name).write_text(f"machine example.com password {token}\n")
    host_tmp = Path(tempfile.mkdtemp(prefix="mini-kv-redteam-host-"))  # the host's /tmp
    project = base / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'redteam'\n")
    (project / ".build").mkdir()
    store = project / "artifacts"
    store.mkdir()
    listener = Listener(host_tmp)
    sentinel = subprocess.Popen(["sleep", "600"])  # a process of the same user, outside
    sleep_mark = f"{600 + secrets.randbelow(10000) / 1000:.3f}"  # the setsid daemon's argument
    saved = {k: os.environ.get(k) for k in ("HOME", "MINI_KV_REDTEAM_SECRET", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(HOME=str(home), MINI_KV_REDTEAM_SECRET=token, AWS_SECRET_ACCESS_KEY=token)
    w = {
        "token": token,
        "home": home,
        "host_tmp": host_tmp,
        "project": project,
        "store": store,
        "listener": listener,
        "sentinel": sentinel,
        "sleep_mark": sleep_mark,
        "base": base,
        "subst": {
            "HOME": home,
            "HOSTTMP": host_tmp,
            "PROJECT": project,
            "STORE": store,
            "BUILD": project / ".build",
            "PORT": listener.port,
            "SOCKET": listener.path,
            "ABSTRACT": listener.abstract_name,
            "SLEEP": sleep_mark,
            "FORKS": FORKS,
        },
    }
    try:
        yield w
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        listener.close()
        sentinel.kill()
        sentinel.wait()
        subprocess.run(["pkill", "-KILL", "-f", f"sleep {sleep_mark}"], check=False)
        shutil.rmtree(host_tmp, ignore_errors=True)


def statuses(result: dict) -> set[str]:
    return {t.evaluation.status for t in result.traces}


def escaped_files(world: dict) -> list[str]:
    """Marker files an escape would have left anywhere on the host it could reach."""
    import torch

    import mini_kv

    places = [
        world["home"],
        world["host_tmp"],
        world["project"],
        Path(os.path.dirname(mini_kv.__file__)),
        Path(os.path.dirname(torch.__file__)),
        Path("/dev/shm"),
        ROOT / ".build",
    ]
    found = []
    for place in places:
        if place.is_dir():
            found += [str(p) for p in place.glob(f"{MARK}*")] + [str(p) for p in place.glob(f"*/{MARK}*")]
    if Path(f"/{MARK}remount_root").exists():
        found.append(f"/{MARK}remount_root")
    return found


def store_leaks(world: dict) -> list[str]:
    """Files of the artifact store that hold the secret."""
    token = world["token"].encode()
    return [str(p) for p in world["store"].rglob("*") if p.is_file() and token in p.read_bytes()]


def alive(pattern: str) -> bool:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0
