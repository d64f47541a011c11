#!/usr/bin/env python3
"""Screenshots of a `mini-kv report` page, one PNG per section, for docs/report.md.

    python scripts/report_screenshots.py REPORT.html OUTDIR [--prefix cpu-] [--width 1100] [--max-height 1400]

Headless Chromium renders the whole page once (a tall window); the sections are found in that image by
their headings' blue underline (2 px of #0072B2 across the content) and cut apart. Each piece is cut to
--max-height and stored with a 256-colour palette, which keeps a screenshot of tables and charts well
under 300 KB. Prints one line per file with its size.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

SECTIONS = (
    "top",
    "attempts",
    "latency",
    "roofline",
    "correctness",
    "history",
    "profiles",
    "environment",
    "skipped",
    "about",
)
FLAGS = [
    "--headless",
    "--no-sandbox",  # Chromium's own flag (its sandbox needs namespaces a container may lack)
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def underline_rows(img: np.ndarray) -> list[int]:
    """y of each h2 underline: rows where most of the width is the Okabe-Ito blue."""
    blue = (np.abs(img.astype(int) - [0, 114, 178]).sum(axis=2) < 30).mean(axis=1) > 0.6
    rows = np.flatnonzero(blue)
    return [int(y) for i, y in enumerate(rows) if i == 0 or y - rows[i - 1] > 3]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report")
    p.add_argument("outdir")
    p.add_argument("--prefix", default="")
    p.add_argument("--width", type=int, default=1100)
    p.add_argument("--height", type=int, default=16000, help="window height: at least the page's")
    p.add_argument("--max-height", type=int, default=1400)
    args = p.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("chromium is not installed (apt-get install -y chromium)")
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        shot = Path(tmp) / "page.png"
        subprocess.run(
            [
                chromium,
                *FLAGS,
                f"--user-data-dir={tmp}/profile",
                f"--screenshot={shot}",
                f"--window-size={args.width},{args.height}",
                Path(args.report).resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
        img = np.asarray(Image.open(shot).convert("RGB"))
    # the page ends where the last non-white row is
    ink = np.flatnonzero((img < 245).any(axis=2).any(axis=1))
    end = int(ink[-1]) + 20 if ink.size else img.shape[0]
    lines = underline_rows(img[:end])
    starts = [0] + [max(0, y - 40) for y in lines[1:]]  # a section begins just above its heading
    for name, (a, b) in zip(SECTIONS, zip(starts, starts[1:] + [end], strict=True), strict=False):
        piece = Image.fromarray(img[a : min(b, a + args.max_height)])
        path = out / f"{args.prefix}{name}.png"
        piece.quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(path, optimize=True)
        print(f"{path}: {path.stat().st_size / 1024:.0f} KB, {piece.width}x{piece.height}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
