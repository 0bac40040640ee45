"""The distributed debugger: ``breakpoint()`` in an endpoint pauses that actor for ``monarch debug``.

:func:`install` (called once per process by the proc's entry point and the
client) makes ``breakpoint()`` and ``pdb.set_trace()`` inside actor code open a
remote pdb session (:mod:`.remote_pdb`) whose lines travel over the
process's side channel (:mod:`.sessions`); outside actor code they stay the
ordinary local pdb. The wire format is in :mod:`.protocol`.
"""

from monarch.actors.debugging.hook import install

__all__ = ["install"]
