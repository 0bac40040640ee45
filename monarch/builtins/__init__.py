"""Remote functions every mesh can run: :mod:`.random` (seeding, RNG state) and :mod:`.log`.

Each is a ``@monarch.remote`` function: call it inside ``with procs.activate():``
(or on tensors of a mesh) and it runs on every proc of that mesh, in order
with the tensor ops around it. Importing this package does not import torch;
importing its modules does.
"""
