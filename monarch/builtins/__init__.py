"""Remote functions every mesh can run: :mod:`.random` (seeding, RNG state) and :mod:`.log`.

Each is a ``@monarch.remote`` function: call it inside ``with procs.activate():``
(or on tensors of a mesh) and it runs on every proc of that mesh, in order
with the tensor ops around it. Importing this package does not import torch;
importing its modules does.
"""

from typing import Any

__all__ = ["log_remote", "set_logging_level_remote"]


def __getattr__(name: str) -> Any:
    """``from monarch.builtins import log_remote`` as in Monarch 0.7, importing torch only then."""
    if name in __all__:
        from monarch.builtins import log

        return getattr(log, name)
    raise AttributeError(f"module 'monarch.builtins' has no attribute {name!r}")
