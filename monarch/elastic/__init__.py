"""Fault-tolerant data-parallel training: respawn a lost rank and carry on.

Three small pieces a trainer composes (``examples/fault_tolerant_training.py``
puts them together):

* :class:`RankedMesh` (:mod:`.ranks`): one actor per rank, each on a proc of
  its own, so one rank can be respawned in place or dropped;
* :class:`GroupStore` / :class:`ElasticGroup` (:mod:`.group`): re-form a gloo
  group after a membership change, with collectives that can be aborted;
* :class:`StateBuffer` (:mod:`.state`): a rank's model and optimizer state as
  one flat buffer, copied to a replacement by ``RDMABuffer``.

This module only re-exports.
"""

from monarch.elastic.errors import ElasticError, GroupAbortedError, NoCapacityError, RespawnError
from monarch.elastic.group import ElasticGroup, GroupStore, Membership
from monarch.elastic.ranks import RankedMesh, one_local_proc
from monarch.elastic.state import Layout, SharedState, StateBuffer

__all__ = [
    "ElasticError",
    "ElasticGroup",
    "GroupAbortedError",
    "GroupStore",
    "Layout",
    "Membership",
    "NoCapacityError",
    "RankedMesh",
    "RespawnError",
    "SharedState",
    "StateBuffer",
    "one_local_proc",
]
