"""The broker's vocabulary: the names everything on the wire is addressed and labelled by.

:mod:`.subjects` (every NATS subject, as DESIGN.md's table gives them) and
:mod:`.headers` (every ``Mon-*`` header, with what it carries). Plain strings,
no I/O: the bottom of the broker floor.
"""
