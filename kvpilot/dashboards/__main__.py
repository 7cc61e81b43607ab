"""`python -m kvpilot.dashboards write DIR` writes every dashboard; `check DIR` says which differ."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvpilot.dashboards import DASHBOARDS, render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvpilot.dashboards", description=__doc__)
    parser.add_argument("action", choices=("write", "check"))
    parser.add_argument("directory", type=Path, nargs="?", default=Path("dashboards"))
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path, text = args.directory / name, render(build())
        if args.action == "write":
            args.directory.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
        elif not path.is_file() or path.read_text() != text:
            stale.append(str(path))
    if stale:
        print(f"out of date: {', '.join(stale)}; regenerate with `python -m kvpilot.dashboards write "
              f"{args.directory}`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
