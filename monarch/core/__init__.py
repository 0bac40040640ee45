"""The per-process core: the runtime's loop and NATS connection, its ordered
outbox and intake, ports, :class:`~monarch.core.future.Future` and busy polling.

Layer: above :mod:`monarch.broker`, below everything else; it imports only
``monarch.broker``. Higher layers plug in what they need (a starter for the
client runtime, control-message kinds, connection listeners, closers).
"""
