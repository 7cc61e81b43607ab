"""Run `kvpilot serve ARGS` with cProfile on the main (event loop) thread; dump the stats at exit.

Usage: python bench/profile_serve.py OUT.prof --model DIR [serve flags]   (stop it with SIGTERM),
then `python -c "import pstats; pstats.Stats('OUT.prof').sort_stats('cumtime').print_stats(40)"`.
"""

from __future__ import annotations

import cProfile
import sys
import time


def main() -> None:
    from kvpilot.cli import main as kvpilot_main

    out = sys.argv[1]
    sys.argv = ["kvpilot", "serve", *sys.argv[2:]]
    prof = cProfile.Profile()
    t0, c0 = time.perf_counter(), time.process_time()
    prof.enable()
    try:
        kvpilot_main()
    except SystemExit:
        pass
    finally:
        prof.disable()
        prof.dump_stats(out)
        print(f"wall {time.perf_counter() - t0:.1f} s, process CPU {time.process_time() - c0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
