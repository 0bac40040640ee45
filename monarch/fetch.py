"""Monarch's ``monarch.fetch`` module: ``fetch_shard``, ``inspect`` and ``show`` of the tensor
engine (also ``monarch.<name>``), for code that imports them from there (Monarch's
``docs/source/examples/grpo_actor_te.py`` does). They live in :mod:`monarch.tensors.fetch`."""

from monarch.tensors.fetch import fetch_shard, inspect, show

__all__ = ["fetch_shard", "inspect", "show"]
