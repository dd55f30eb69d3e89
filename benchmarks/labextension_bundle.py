"""What the browser downloads for the gpuslice labextension: size of each built file, raw
and gzip-compressed (as jupyter-server serves static files compressed when asked).

    make labextension && .venv/bin/python benchmarks/labextension_bundle.py
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

STATIC = Path(__file__).resolve().parents[1] / "server_ext/gpuslice/labextension/static"


def main() -> int:
    if not STATIC.is_dir():
        print(f"{STATIC} is missing: run `make labextension` first", file=sys.stderr)
        return 1
    total_raw = total_gz = 0
    print(f"{'file':40} {'bytes':>8} {'gzip':>8}")
    for path in sorted(STATIC.iterdir()):
        if path.suffix not in {".js", ".css"}:
            continue
        raw = path.read_bytes()
        gz = len(gzip.compress(raw, compresslevel=6))
        total_raw += len(raw)
        total_gz += gz
        print(f"{path.name:40} {len(raw):8} {gz:8}")
    print(f"{'total':40} {total_raw:8} {total_gz:8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
