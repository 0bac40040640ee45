"""Alias of ``monarch._src.actor.shape`` (TorchForge's provisioner imports ``Extent``):
our public :class:`monarch.actor.Extent`.
"""

from monarch.actor import Extent

__all__ = ["Extent"]
