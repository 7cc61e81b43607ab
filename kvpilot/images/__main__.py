"""`python -m kvpilot.images [operator] [engine] [--out DIR]`: build, then smoke-run each image."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvpilot.images.build import REPO_ROOT, build_image, smoke
from kvpilot.images.spec import IMAGES, image_spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvpilot.images", description=__doc__)
    parser.add_argument("images", nargs="*", default=["operator"], help=f"any of {', '.join(IMAGES)}")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "build" / "images")
    args = parser.parse_args(argv)
    try:
        specs = [image_spec(name) for name in args.images]
    except KeyError as exc:
        parser.error(str(exc.args[0]))
    for spec in specs:
        built = build_image(spec, args.out)
        print(f"{built.name}: {built.tarball} in {built.seconds:.0f} s; root filesystem "
              f"{built.rootfs_bytes / 1e6:.0f} MB, compressed layers {built.compressed_bytes / 1e6:.0f} MB; "
              f"entrypoint {built.config['config']['Entrypoint']}, user {built.config['config']['User']}")
        result = smoke(built.tarball, spec.smoke)
        if result.returncode != 0:
            print(f"{built.name}: smoke `kvpilot {' '.join(spec.smoke)}` failed (exit {result.returncode}):\n"
                  f"{result.stderr[-3000:]}", file=sys.stderr)
            return 1
        print(f"{built.name}: smoke `kvpilot {' '.join(spec.smoke)}` in the unpacked image: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
