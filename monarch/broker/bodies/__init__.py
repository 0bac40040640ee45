"""Message bodies: Python values to bytes and back, and what carries several at once.

:mod:`.codec` (msgpack with out-of-band buffers; ``dumps``/``loads``),
:mod:`.json_wire` (``MONARCH_WIRE=json``), :mod:`.ext` (the extension types both
share, and the codec errors), :mod:`.buffers` (big buffers whose pages stay
mapped) and :mod:`.batch` (several small messages in one NATS message). No I/O.
"""
