"""Host agents and multi-host meshes.

``monarch host`` (:mod:`monarch.hosts.agent`) runs on each machine of a
cluster: it registers in the broker (:mod:`monarch.broker.connections.registry`),
heartbeats, and starts, reaps and kills procs when a client asks.
A client finds registered agents with ``attach_to_workers``
(:mod:`monarch.hosts.attach`) and its proc meshes start procs through them
(:mod:`monarch.hosts.launcher`). Everything travels over NATS; an agent opens
no port of its own.

Layer: above :mod:`monarch.actors` (agents serve actor procs; their launcher
is handed to the host meshes they make), beside :mod:`monarch.tensors`.
"""
