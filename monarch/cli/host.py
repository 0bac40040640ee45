"""``monarch host``: run this machine's host agent until Ctrl-C (see :mod:`monarch.hosts.agent`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from monarch.cli.main import broker_url


def parse_labels(items: list[str]) -> dict[str, str]:
    """``["mesh=a", "zone=b,rack=3"]`` -> ``{"mesh": "a", "zone": "b", "rack": "3"}``."""
    labels = {}
    for item in items:
        for pair in filter(None, (p.strip() for p in item.split(","))):
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise ValueError(f"label {pair!r} is not KEY=VALUE")
            labels[key] = value
    return labels


def run(args: argparse.Namespace) -> int:
    # Imported when the subcommand runs, so that `monarch --help` stays fast.
    from monarch.core.runtime import new_event_loop
    from monarch.hosts.agent import run_agent

    url = broker_url(args)
    try:
        labels = parse_labels(args.labels)
    except ValueError as e:
        print(f"monarch host: {e}", file=sys.stderr)
        return 2
    if args.capacity is not None and args.capacity < 1:
        print("monarch host: --capacity must be at least 1", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=os.environ.get("MONARCH_LOG_LEVEL", "INFO"),
        format="%(asctime)s monarch host %(levelname)s: %(message)s",
    )
    loop = new_event_loop()
    try:
        loop.run_until_complete(
            run_agent(
                url,
                name=args.name,
                labels=labels,
                capacity=args.capacity,
                connect_timeout=args.connect_timeout,
            )
        )
    except ConnectionError as e:
        print(f"monarch host: {e}", file=sys.stderr)
        return 1
    finally:
        loop.close()
    return 0
