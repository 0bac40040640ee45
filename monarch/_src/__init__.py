"""Thin aliases under Monarch 0.7's internal module paths, for downstream code that imports them.

Real libraries built on Monarch (torchstore, torchtitan's RL experiment,
TorchForge) import a few names from ``monarch._src...`` instead of the public
modules. Each module here re-exports one of *our public objects* under the
path such code uses; nothing here reimplements Monarch's internals. The table
in ``docs/compatibility.md`` ("Internal paths") lists every path, what it maps
to, and who imports it. New code should import the public names.
"""
