#!/usr/bin/env bash
# Install a real Slurm (slurmctld, slurmd, client commands) and munge for
# tests/job/test_slurm.py, which starts its own one-node cluster from them.
# Best effort, as root with apt-get only: without them those tests say why
# they are skipped. The packages' own services are not started or configured.
set -u
if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
    && command -v sbatch >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "warning: Slurm not installed (needs root and apt-get): the Slurm tests will be skipped"
    exit 0
fi
(apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends slurm-wlm munge) >/dev/null 2>&1 \
    || echo "warning: could not install slurm-wlm and munge: the Slurm tests will be skipped"
exit 0
