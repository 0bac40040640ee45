"""Calling actors: the Actor class (:mod:`.actor`), endpoints (:mod:`.endpoint`), the actor
mesh reference (:mod:`.actor_mesh`) and its reply gathering (:mod:`.gather`), ports
(:mod:`.ports`), and where a call lands: the running actor (:mod:`.instance`, :mod:`.mailbox`)
and who it runs for (:mod:`.context`).

Area of :mod:`monarch.actors`: above messaging and meshes; below hosting and procs. The
running actor sits here, not with hosting, because an actor mesh delivers calls to an
actor of its own process directly.
"""
