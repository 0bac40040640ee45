"""NATS: connecting, the embedded nats-server, subjects, headers, KV registries,
wire codecs and their one extension registry (:mod:`monarch.broker.ext`).

Layer: the bottom floor. It imports no other part of ``monarch`` and knows
nothing of actors.
"""
