"""Command line: ``python -m fcall demo``."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if argv[:1] != ["demo"]:
        print("usage: python -m fcall demo")
        return 2
    from ._demo import main as demo

    demo()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
