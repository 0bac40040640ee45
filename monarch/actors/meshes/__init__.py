"""Meshes as shapes: extents, points, views and slices (:mod:`.shape`, :mod:`.ndslice`), the
slicing operations every mesh shares (:mod:`.mesh_ops`) and per-rank values (:mod:`.value_mesh`).

Area of :mod:`monarch.actors`: the bottom one, with messaging; it imports no other area.
"""
