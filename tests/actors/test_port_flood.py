"""A port flooded by fast senders still lets its reader through (Monarch's grpo_yield.py)."""

from __future__ import annotations

import pytest

from monarch.actor import Channel, this_host
from tests.actors.flood_actors import Generator, Scorer


@pytest.mark.alone  # three procs spin flat out while it runs
def test_a_reader_flooded_by_generators_reaches_the_sentinel_they_send_last(nats_url):
    # Monarch 0.7's docs/source/examples/grpo_yield.py, cut down: generators stream
    # pickled tensors into one scorer's port until drained, then send None. The scorer's
    # loop once decoded every arrival before its reader ran again, so it fell behind the
    # flood for good and never reached the None (the example hung; on Monarch it ends in
    # ~13 s). Now values are decoded by the recv() that takes them.
    gens_procs = this_host().spawn_procs(per_host={"gpus": 3}, name="flood_gens")
    scorer_procs = this_host().spawn_procs(per_host={"gpus": 1}, name="flood_scorer")
    try:
        scorer = scorer_procs.spawn("scorer", Scorer)
        port = scorer.port_.call_one().get(timeout=60)
        gens = gens_procs.spawn("gens", Generator, port)
        started, started_recv = Channel.open(once=True)
        gens.start.call().get(timeout=60)
        read = scorer.run.call_one(200, started)
        assert started_recv.recv().get(timeout=60) == 200  # the flood reaches it
        gens.drain.call().get(timeout=60)
        assert read.get(timeout=60) >= 200
    finally:
        gens_procs.stop().get(timeout=60)
        scorer_procs.stop().get(timeout=60)
