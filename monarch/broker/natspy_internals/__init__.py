"""Everything that reaches into nats-py's private attributes, in one place.

nats-py has no public hooks for reading on arrival, writing within a publish,
ordered delivery or cheaper headers; these modules add them to one connection
at a time. :func:`install` is the one entry point for a connection;
:mod:`.names` lists every private name touched, with what it is for;
:mod:`.intake` is the ordered subscription (``subscribe_ordered``) every
message of ours comes in by; :mod:`.sync_publish` the runtime's plain publish.
"""

from monarch.broker.natspy_internals.fast_paths import install

__all__ = ["install"]
