"""Run the torchrun script ``spmd_ddp.py`` on 4 procs of this host with monarch.spmd.

    python examples/spmd_launch.py [--procs 4] [script arguments...]

What ``torchrun --nproc-per-node 4 examples/spmd_ddp.py ...`` does, but the
workers are procs of a Monarch mesh: their output comes back prefixed with
their rank, and a failing rank is reported through supervision.
"""

from __future__ import annotations

import argparse
import os
import sys

from monarch.actor import this_host
from monarch.spmd import SPMDActor

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spmd_ddp.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=4)
    args, script_args = parser.parse_known_args()

    procs = this_host().spawn_procs(per_host={"gpus": args.procs})
    trainers = procs.spawn("_SPMDActor", SPMDActor)
    # The first proc hosts the rendezvous (torchrun's rank 0): its host and a free port.
    addr, port = trainers.slice(gpus=0).get_host_port.call_one(None).get()
    trainers.main.call(addr, port, [SCRIPT, *script_args]).get()
    print(f"trained on {args.procs} procs, master {addr}:{port}")
    procs.stop().get()


if __name__ == "__main__":
    main()
    sys.exit(0)
