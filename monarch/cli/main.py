"""The ``monarch`` command."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="monarch", description="Monarch over NATS: actors for PyTorch, messages on NATS."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="run a small actor mesh on this machine (embedded broker)")
    demo.add_argument("--gpus", type=int, default=4, help="procs to start (default 4)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from monarch.cli.demo import run

        return run(gpus=args.gpus)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
