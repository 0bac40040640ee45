"""A torchrun-style script: writes what a worker sees (env, argv, __name__) to a JSON file.

Usage: ``env_dump.py OUT_DIR [extra args...]``; writes ``OUT_DIR/rank-<RANK>.json``
and prints one line to stdout and one to stderr.
"""

import json
import os
import sys

KEYS = [
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
]  # fmt: skip

if __name__ == "__main__":
    out_dir = sys.argv[1]
    seen = {
        "env": {k: os.environ.get(k) for k in KEYS},
        "argv": sys.argv,
        "name": __name__,
        "path0": sys.path[0],
    }
    with open(os.path.join(out_dir, f"rank-{os.environ['RANK']}.json"), "w") as f:
        json.dump(seen, f)
    print(f"env_dump stdout from rank {os.environ['RANK']}")
    print(f"env_dump stderr from rank {os.environ['RANK']}", file=sys.stderr)
