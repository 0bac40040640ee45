"""examples/fault_tolerant_training.py: a SIGKILLed rank is replaced and training goes on.

Real procs, a real broker, real gloo groups: the example's coordinator (in the
test process) SIGKILLs one trainer's process during a step.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from monarch.actor import ActorError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS, KILL_AT = 8, 4


def _example():
    """The example as a module the procs can import too (they get this sys.path)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.append(str(EXAMPLES))
    return importlib.import_module("fault_tolerant_training")


def test_replaced_rank_gives_the_same_parameters_bit_for_bit(nats_url):
    ex = _example()
    reference, ref_params = ex.run(STEPS, None)
    report, params = ex.run(STEPS, KILL_AT, kill_rank=2)

    (recovery,) = report["recoveries"]
    assert recovery["ranks"] == [2] and recovery["step"] == KILL_AT
    assert report["kill"] <= recovery["supervise"] <= recovery["ready"] <= recovery["first_step"]
    assert report["world"] == reference["world"] == 4
    assert len(report["losses"]) == STEPS
    assert report["losses"] == reference["losses"]  # every step's mean loss, replayed one too
    assert len(params) == 4
    for rank_params in params:  # the replacement included
        assert all(a.equal(b) for a, b in zip(rank_params, ref_params[0], strict=True))
    for rank_params in ref_params:
        assert all(a.equal(b) for a, b in zip(rank_params, ref_params[0], strict=True))


def test_no_capacity_shrinks_the_world_when_the_policy_says_so(nats_url):
    ex = _example()
    report, params = ex.run(STEPS, KILL_AT, world=3, spare_procs=0, on_no_capacity="shrink")

    (recovery,) = report["recoveries"]
    assert recovery["ranks"] == [1] and recovery["shrunk_to"] == 2
    assert report["world"] == 2 and len(params) == 2
    assert len(report["losses"]) == STEPS  # the interrupted step was replayed on 2 ranks
    assert all(a.equal(b) for a, b in zip(params[0], params[1], strict=True))


def test_no_capacity_stops_with_a_clear_error_when_the_policy_says_so(nats_url):
    ex = _example()
    with pytest.raises(ActorError, match=r"could not respawn rank 1 of 'trainer'.*spare_procs"):
        ex.run(STEPS, KILL_AT, world=2, spare_procs=0, on_no_capacity="stop")
