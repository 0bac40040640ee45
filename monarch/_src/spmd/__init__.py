"""Aliases for ``monarch._src.spmd.*`` (see :mod:`monarch._src`)."""
