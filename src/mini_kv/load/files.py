"""Which files of a candidate or solution directory may be read at all (before anything is built or
archived): no symlink that leaves the project, no hard link, no FIFO, socket or device file."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def links_leaving(cdir: Path, root: Path) -> list[tuple[Path, Path]]:
    """(link, target) for every symlink under `cdir`, listed as a source or not, that resolves outside
    `root` (or dangles): such a link would bring a file from elsewhere into the build and the attempt."""
    root = root.resolve()
    out = []
    for dirpath, dirnames, filenames in os.walk(cdir):  # does not descend into linked dirs
        for name in (*dirnames, *filenames):
            p = Path(dirpath) / name
            if p.is_symlink():
                target = p.resolve()
                if not target.exists() or (target != root and root not in target.parents):
                    out.append((p, target))
    return out


def file_refusal(p: Path) -> str | None:
    """Why a file of a candidate or solution is refused, or None: only directories, regular files with
    one name (a hard link may be a secret's second name: the build and the archive would read it) and
    symlinks (checked by `links_leaving`) are taken; FIFOs, sockets and device files never."""
    st = p.lstat()
    if stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return None
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file or directory"
    if st.st_nlink > 1:
        return f"has {st.st_nlink} hard links (copy it instead: another name may be a file from elsewhere)"
    return None


def odd_files(cdir: Path) -> list[tuple[Path, str]]:
    """(path, why) for every entry under `cdir` that `file_refusal` refuses."""
    out = []
    for dirpath, dirnames, filenames in os.walk(cdir):
        for name in (*dirnames, *filenames):
            why = file_refusal(Path(dirpath) / name)
            if why is not None:
                out.append((Path(dirpath) / name, why))
    return out
