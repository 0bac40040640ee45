"""Liveness and failure reporting: heartbeats on JetStream, failure events, MeshFailure.

This package knows nothing about actors: it moves heartbeats and failure
events over NATS. The owner tree itself (who handles what) lives in
:mod:`monarch.actors.hosting.supervisor`, which uses these pieces.

Layer: beside :mod:`monarch.core`, above :mod:`monarch.broker`, which is all it imports.
"""
