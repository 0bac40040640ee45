"""Monarch's ``monarch.tools`` names that scripts use: :mod:`.network` (host addresses).

Layer: beside :mod:`monarch.config`; it imports no other part of ``monarch``.
"""
