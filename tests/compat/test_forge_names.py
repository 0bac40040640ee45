"""Names and behaviour TorchForge's controller layer and Monarch's examples rely on.

TorchForge (meta-pytorch/torchforge) imports ``monarch.utils`` and three
internal paths, and its provisioner keeps bookkeeping on mesh objects
(attributes set on them, proc meshes as dict keys). These tests check that
against real procs on a real broker, in our own words.
"""

from __future__ import annotations

import asyncio
import importlib
import pickle

import pytest

from monarch.actor import Actor, ActorMesh, Extent, context, endpoint, this_host
from monarch.actors.calls.endpoint import EndpointProperty
from tests.spmd.spmd_actors import EnvProbe


class Greeter(Actor):
    greeting = "hello"

    @endpoint
    def hello(self, who: str) -> str:
        return f"{self.greeting} {who}"


def configured(cls: type, **attrs) -> type:
    """A subclass made the way ForgeActor.options() makes one: same name, new class attributes."""
    return type(cls.__name__, (cls,), attrs)


def test_internal_paths_name_our_public_objects():
    assert importlib.import_module("monarch._src.actor.actor_mesh").ActorMesh is ActorMesh
    assert (
        importlib.import_module("monarch._src.actor.endpoint").EndpointProperty is EndpointProperty
    )
    assert importlib.import_module("monarch._src.actor.shape").Extent is Extent
    # What @endpoint leaves on the class is what TorchForge's ServiceInterface scans for.
    assert isinstance(Greeter.hello, EndpointProperty)
    assert not isinstance(Greeter.__init__, EndpointProperty)
    # TorchForge builds a host extent positionally: labels, then sizes.
    ext = Extent(["hosts", "no_dim"], [3, 1])
    assert dict(ext) == {"hosts": 3, "no_dim": 1}


def test_forge_bookkeeping_on_meshes(nats_url):
    host = this_host()
    host._host_id = "local"  # the provisioner tags host meshes
    pm = host.spawn_procs(per_host={"procs": 2}, name="forge_book")
    try:
        greeters = pm.spawn("greeter", Greeter)
        assert isinstance(greeters, ActorMesh)
        greeters._proc_mesh = pm  # ForgeActor.launch keeps the mesh on the actor mesh
        pm._host = host
        owners = {pm: host}  # proc meshes are dict keys in the provisioner
        assert owners[pm]._host_id == "local" and greeters._proc_mesh is pm
        one = greeters.slice(**{k: slice(0, 1) for k in greeters.extent.keys()})
        assert one.hello.call_one("forge").get(timeout=60) == "hello forge"
    finally:
        pm.stop().get(timeout=60)


def test_setup_env_for_distributed_sets_torch_env_on_each_proc(nats_url):
    from monarch.utils import setup_env_for_distributed

    pm = this_host().spawn_procs(per_host={"procs": 2}, name="forge_env")
    try:
        with pytest.warns(DeprecationWarning, match="setup_torch_elastic_env_async"):
            asyncio.run(setup_env_for_distributed(pm, master_addr="127.0.0.1", master_port=29511))
        envs = pm.spawn("probe", EnvProbe).env.call().get(timeout=60)
        got = {point.rank: env for point, env in envs.items()}
        assert sorted(got) == [0, 1]
        for rank, env in got.items():
            assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
            assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29511")
        with pytest.raises(ValueError, match="master_port"), pytest.warns(DeprecationWarning):
            asyncio.run(setup_env_for_distributed(pm, master_addr="127.0.0.1"))
    finally:
        pm.stop().get(timeout=60)


def test_a_subclass_made_with_type_under_its_parents_name_spawns_as_itself(nats_url):
    # Its module holds the *parent* under that name, so naming it by module:qualname
    # would spawn the parent: it must reach the procs by value.
    Hi = configured(Greeter, greeting="hi")
    assert Hi.__module__ == Greeter.__module__ and Hi.__qualname__ == "Greeter"
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="forge_options")
    try:
        his = pm.spawn("hi", Hi)
        assert his.hello.call_one("there").get(timeout=60) == "hi there"
        plain = pm.spawn("plain", Greeter)
        assert plain.hello.call_one("there").get(timeout=60) == "hello there"
    finally:
        pm.stop().get(timeout=60)


class Counted(Actor):
    """An actor with a private endpoint, called from outside like any other."""

    def __init__(self) -> None:
        self.items = [1, 2, 3]

    @endpoint
    async def _numel(self) -> int:
        return len(self.items)

    @endpoint
    async def whoami(self) -> tuple[str, str]:
        me = context().actor_instance.actor_id
        return str(me), me.actor_name


def test_private_endpoints_are_callable_and_actor_ids_have_actor_names(nats_url):
    me = context().actor_instance.actor_id
    assert me == "client" and me.actor_name == "client"
    assert pickle.loads(pickle.dumps(me)).actor_name == "client"
    pm = this_host().spawn_procs(per_host={"procs": 1}, name="forge_private")
    try:
        counted = pm.spawn("counted_mesh", Counted)
        assert counted._numel.call_one().get(timeout=60) == 3
        text, actor_name = counted.whoami.call_one().get(timeout=60)
        assert actor_name == "counted_mesh" and text.startswith("counted_mesh")
        with pytest.raises(AttributeError):
            counted._not_an_endpoint  # noqa: B018
        with pytest.raises(AttributeError):
            counted.__wrapped__  # noqa: B018
    finally:
        pm.stop().get(timeout=60)


def test_an_endpoint_of_an_instance_built_here_runs_through_method():
    # No proc and no broker: an actor object made directly, its endpoint run as a method.
    c = Counted()
    assert asyncio.run(c._numel._method(c)) == 3
    assert asyncio.run(c._numel()) == 3
