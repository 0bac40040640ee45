"""A torchrun-style gloo job that all-reduces once per step; one rank may SIGKILL itself.

Usage: ``allreduce_steps.py STEPS [DIE_RANK DIE_STEP]``. The collective timeout
is short, as a job that wants to notice a lost peer sets it: the ranks left
waiting on the dead one give up within seconds instead of torch's default 30
minutes.
"""

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

if __name__ == "__main__":
    steps = int(sys.argv[1])
    die_rank, die_step = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (-1, -1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    for step in range(steps):
        if rank == die_rank and step == die_step:
            os.kill(os.getpid(), signal.SIGKILL)
        t = torch.ones(4) * rank
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t[0].item()} at {time.time():.2f}", flush=True)
    dist.destroy_process_group()
