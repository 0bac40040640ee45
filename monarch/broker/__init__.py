"""NATS: the bottom floor. It imports no other part of ``monarch`` and knows nothing of actors.

* :mod:`.vocabulary`: subjects and ``Mon-*`` headers, the names on the wire;
* :mod:`.bodies`: message bodies (the codecs, their one extension registry,
  batches, buffers);
* :mod:`.connections`: connecting (credentials, message signing), the embedded
  nats-server, streams and KV registries, job records;
* :mod:`.natspy_internals`: every use of nats-py's private attributes (the fast
  paths, the ordered intake), behind one ``install(nc)``;
* :mod:`.settings`: the broker's ``MONARCH_*`` settings, and the one settings
  style (pydantic, ``MONARCH_<FIELD>``) of the project.
"""
