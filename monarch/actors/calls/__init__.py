"""Calling actors, the caller's side: the Actor class (:mod:`.actor`), endpoints
(:mod:`.endpoint`), the actor mesh reference (:mod:`.actor_mesh`) and its reply gathering
(:mod:`.gather`), ports (:mod:`.ports`), and who a call runs for (:mod:`.context`).

Area of :mod:`monarch.actors`: above messaging and meshes; below hosting and procs. Where
a call lands, the running actor, is in :mod:`monarch.actors.hosting`; an actor mesh of
this process hands its calls to that actor directly (``MeshState.local``, set by procs),
without importing it.
"""
