"""Monarch's ``monarch.actor.concurrent`` module: :func:`concurrent_endpoint` (also in
:mod:`monarch.actor`), for code that imports it from there."""

from monarch.actors.calls.endpoint import concurrent_endpoint

__all__ = ["concurrent_endpoint"]
