"""Connections and servers: reaching a broker, running one, and what a job keeps on it.

:mod:`.connect` (credentials, one clear error), :mod:`.auth` (the job's message
key: signing and checking), :mod:`.server` (the embedded nats-server),
:mod:`.cluster` (a few routed servers on loopback, for experiments),
:mod:`.jetstream_setup` and :mod:`.registry` (streams and KV buckets, on a
cluster too), :mod:`.job_records` and :mod:`.nats_context` (the files that let
``monarch jobs`` and the ``nats`` CLI find a running job), :mod:`.ownership`
and :mod:`._pdeathsig` (files and children that must not outlive their owner).
"""
