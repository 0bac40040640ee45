"""The actor runtime: actors, endpoints, meshes, proc and host meshes, supervision.

Layer: above :mod:`monarch.rdma`, :mod:`monarch.core`, :mod:`monarch.supervision`
and :mod:`monarch.broker`, which is all it imports, except the two doors into
the optional tensor engine (``ActorEndpoint.rref``, ``ProcMesh.activate``),
imported when used so that torch stays off the actor API's import path.
Higher layers plug in here by handing things in: the host agents' launcher
(``HostMesh(..., agent_launcher=)``), the tensor engine's before-stop hooks
(``ProcMeshState.before_stop``), the facade's fault hook
(:func:`monarch.actors.client.set_fault_hook_source`). Its top is
:mod:`monarch.actors.client`, the root's bootstrap.
"""
