"""Alias of ``monarch._src.actor.endpoint``: TorchForge's service layer finds an actor
class's endpoints with ``isinstance(attr, EndpointProperty)``, the object that
``@endpoint`` leaves on the class (ours: :mod:`monarch.actors.calls.endpoint`).
"""

from monarch.actors.calls.endpoint import EndpointProperty

__all__ = ["EndpointProperty"]
