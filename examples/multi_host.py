"""A mesh across machines: every registered host agent runs two procs.

Start a broker and agents first (or `docker compose up --scale host=3`):

    monarch broker &                                  # on one machine
    export MONARCH_NATS_URL=nats://BROKER:4222
    monarch host &                                    # on each machine
    python examples/multi_host.py --hosts 3

The client finds the agents through the broker (it needs no addresses), and
each agent starts its procs; every proc sees only its own GPU.
"""

import argparse
import os
import socket

from monarch.actor import Actor, attach_to_workers, current_rank, endpoint


class Trainer(Actor):
    def __init__(self, lr: float):
        self.lr = lr

    @endpoint
    def where(self) -> str:
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES")
        return f"{socket.gethostname()} pid {os.getpid()} gpu {gpu} at {current_rank()}"

    @endpoint
    def train(self, step: int) -> float:
        return self.lr * step


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=None, help="how many (default: all)")
    parser.add_argument("--gpus", type=int, default=2, help="procs per host")
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for hosts")
    args = parser.parse_args()

    hosts = attach_to_workers(hosts=args.hosts, timeout=args.timeout)
    print(hosts)
    procs = hosts.spawn_procs(per_host={"gpus": args.gpus})
    trainers = procs.spawn("trainers", Trainer, lr=0.1)
    for line in trainers.where.call().get(timeout=120).values():
        print(line)
    print(trainers.train.call(step=3).get(timeout=60))
    procs.stop().get(timeout=60)
