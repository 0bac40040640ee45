"""Alias of ``monarch._src.actor.actor_mesh`` for TorchForge and Monarch's examples.

TorchForge's provisioner checks ``isinstance(x, ActorMesh)`` against this
path; ``dining_philosophers.py`` imports it too. It is our public
:class:`monarch.actor.ActorMesh`.
"""

from monarch.actor import ActorMesh

__all__ = ["ActorMesh"]
