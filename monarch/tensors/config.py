"""Settings of the tensor engine, from ``MONARCH_TENSOR_*`` environment variables.

Read when used (procs inherit the client's environment), in the project's
settings style (:class:`monarch.broker.settings.EnvSettings`: pydantic, field
``x`` is ``MONARCH_X``), validated so a bad value fails with a message naming
the variable.
"""

from __future__ import annotations

from pydantic import Field

from monarch.broker.settings import EnvSettings


class TensorSettings(EnvSettings):
    """The tensor engine's ``MONARCH_TENSOR_*`` variables."""

    tensor_timeout: float = Field(
        300.0,
        gt=0,
        description="Seconds a proc waits for a peer (collectives, rendezvous, tensor "
        "transfers), and the client for a round trip it needs.",
    )
    tensor_host: str | None = Field(
        None, description="Address other procs use to reach rank 0's rendezvous store."
    )
    tensor_backend: str | None = Field(
        None, description="Override the torch.distributed backend (e.g. gloo)."
    )


def timeout() -> float:
    """Seconds a proc waits for a peer (collectives, rendezvous, tensor transfers), and the
    client for a round trip it needs (``MONARCH_TENSOR_TIMEOUT``, default 300)."""
    return TensorSettings.read("tensor_timeout")


def store_host() -> str | None:
    """Address other procs use to reach rank 0's rendezvous store (``MONARCH_TENSOR_HOST``)."""
    return TensorSettings.read("tensor_host")


def backend() -> str | None:
    """Override the ``torch.distributed`` backend (``MONARCH_TENSOR_BACKEND``, e.g. ``gloo``)."""
    return TensorSettings.read("tensor_backend")
