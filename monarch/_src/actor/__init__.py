"""Aliases for ``monarch._src.actor.*`` (see :mod:`monarch._src`)."""
