"""Shape operations on views, value meshes and actor meshes."""

from __future__ import annotations

import pytest

from monarch.actor import Extent, ValueMesh, this_host
from monarch.actors.meshes.shape import View
from tests.actors.actors_for_tests import Big, Echo
from tests.helpers import proc_mesh_fixture

GRID = Extent(["hosts", "gpus"], [2, 4])


def test_int_slice_drops_dimension_and_slice_keeps_it():
    v = View.full(GRID)
    assert v.slice(gpus=1).extent == Extent(["hosts"], [2])
    assert v.slice(gpus=1).ranks == (1, 5)
    assert v.slice(gpus=slice(1, 3)).extent == Extent(["hosts", "gpus"], [2, 2])
    assert v.slice(hosts=1, gpus=-1).ranks == (7,)


def test_slice_errors_are_precise():
    v = View.full(GRID)
    with pytest.raises(KeyError, match="no dimension 'cpus'"):
        v.slice(cpus=0)
    with pytest.raises(IndexError, match="size 4"):
        v.slice(gpus=4)
    with pytest.raises(ValueError, match="selects nothing"):
        v.slice(gpus=slice(3, 1))


def test_subject_tokens_publish_once_for_product_slices():
    v = View.full(GRID)
    assert v.subject_tokens() == [["_", "_"]]
    assert v.slice(hosts=1).subject_tokens() == [["1", "_"]]
    assert v.slice(gpus=slice(0, 2)).subject_tokens() == [["_", "0"], ["_", "1"]]
    # a flattened range that is not a product falls back to one subject per member
    assert v.flatten("x").slice(x=slice(3, 6)).subject_tokens() == [
        ["0", "3"],
        ["1", "0"],
        ["1", "1"],
    ]


def test_flatten_rename_split():
    v = View.full(GRID)
    assert v.flatten("all").extent == Extent(["all"], [8])
    assert v.rename(gpus="g").extent == Extent(["hosts", "g"], [2, 4])
    s = v.split(gpus={"pair": 2, "lane": -1})
    assert s.extent == Extent(["hosts", "pair", "lane"], [2, 2, 2])
    assert s.ranks == v.ranks
    with pytest.raises(ValueError):
        v.split(gpus={"a": 3, "b": 2})


def test_split_takes_monarchs_form_names_then_sizes_of_new_dimensions():
    # Monarch's MeshTrait.split: dim=(new names), new_name=size; one size per dim inferred
    v = View.full(GRID)
    assert v.split(gpus=("pair", "lane"), lane=2) == v.split(gpus={"pair": 2, "lane": -1})
    both = v.split(hosts=("dp", "pp"), gpus=("tp", "cp"), pp=2, cp=4)
    assert both.extent == Extent(["dp", "pp", "tp", "cp"], [1, 2, 1, 4])
    assert both.ranks == v.ranks  # row-major order kept
    assert v.split(gpus=("g",)).extent == Extent(["hosts", "g"], [2, 4])
    for kwargs, message in [
        ({"gpus": ("a", "b")}, "cannot infer the sizes of both 'a' and 'b'"),
        (
            {"gpus": ("a", "b"), "a": 3},
            r"not evenly divided by \('a', 'b'\) with sizes \(3, '\?'\)",
        ),
        ({"gpus": ("a", "b"), "a": 2, "c": 1}, r"unused size constraints: \('c',\)"),
        ({"gpus": "ab"}, "expects a sequence of dimension names"),
        ({"gpus": ("hosts", "b"), "b": 2}, "duplicate dimension name 'hosts'"),
        ({"gpus": ("a", "b"), "a": 0}, "must be a positive int"),
        ({"x": 2}, r"unused size constraints: \('x',\)"),
        ({"x": (1, 2)}, r"'x' is not an existing dim"),
    ]:
        with pytest.raises(ValueError, match=message):
            v.split(**kwargs)


def test_len_of_every_mesh_counts_its_members(grid):
    # Monarch's len(mesh) (MeshTrait.__len__): host, proc, actor and value meshes alike
    assert len(this_host()) == 1
    assert len(grid) == 4 and len(grid.slice(hosts=1)) == 2 and len(grid.flatten("x")) == 4
    mesh = grid.spawn("counted", Echo)
    assert len(mesh) == 4 and len(mesh.slice(gpus=0)) == 2
    assert len(mesh.whoami.call().get(timeout=30)) == 4
    with pytest.raises(
        KeyError, match=r"no dimension 'cpus' in mesh with dimensions \['hosts', 'gpus'\]"
    ):
        grid.size("cpus")


def test_value_mesh_shape_operations():
    vm = ValueMesh(View.full(GRID), list(range(8)))
    assert vm.item(hosts=1, gpus=2) == 6
    assert list(vm.slice(gpus=3).values()) == [3, 7]
    assert vm.slice(hosts=0).item(gpus=1) == 1
    assert vm.size() == 8 and vm.size("gpus") == 4 and vm.sizes == {"hosts": 2, "gpus": 4}
    assert vm._labels == ["hosts", "gpus"] and vm.slice(hosts=0)._labels == ["gpus"]  # as Monarch
    assert ValueMesh[int] is ValueMesh  # subscripted at run time, as Monarch's
    assert list(vm.flatten("x").values()) == list(range(8))
    with pytest.raises(KeyError):
        vm.item(gpus=1)


grid = proc_mesh_fixture({"hosts": 2, "gpus": 2})


def test_actor_mesh_shape_operations_route_to_the_right_actors(grid):
    mesh = grid.spawn("shape", Echo)
    assert mesh.extent == Extent(["hosts", "gpus"], [2, 2])
    assert grid.size() == 4 and grid.sizes == {"hosts": 2, "gpus": 2}
    assert grid._labels == mesh._labels == ["hosts", "gpus"]  # Monarch's MeshTrait._labels
    flat = mesh.flatten("x")
    assert [v["rank"] for v in flat.whoami.call().get(timeout=30).values()] == [0, 1, 2, 3]
    part = flat.slice(x=slice(1, 4))
    assert [v["rank"] for v in part.whoami.call().get(timeout=30).values()] == [1, 2, 3]
    renamed = mesh.rename(gpus="g").slice(g=1)
    assert [v["rank"] for v in renamed.whoami.call().get(timeout=30).values()] == [1, 3]
    # spawning on a slice of the proc mesh gives a mesh shaped like the slice
    sub = grid.slice(hosts=1).spawn("sub", Echo)
    vm = sub.whoami.call().get(timeout=30)
    assert sub.extent == Extent(["gpus"], [2])
    assert [v["size"] for v in vm.values()] == [{"gpus": 2}] * 2


def test_oversized_messages_travel_out_of_band(nats_url):
    # Over the broker's max_payload (1 MiB): the bytes go through monarch.rdma.bulk.
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        big = pm.spawn("big", Big)
        assert big.length.call_one(b"x" * (2 * 1024 * 1024)).get(timeout=30) == 2 * 1024 * 1024
        assert big.blob.call_one(2 * 1024 * 1024).get(timeout=30) == b"x" * (2 * 1024 * 1024)
        assert big.length.call_one(b"x" * 1000).get(timeout=30) == 1000
    finally:
        pm.stop().get(timeout=30)


def test_endpoint_named_like_a_mesh_attribute_is_refused_at_spawn(nats_url):
    from monarch.actor import Actor, endpoint

    class Clash(Actor):
        @endpoint
        def size(self) -> int:
            return 1

    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        with pytest.raises(ValueError, match=r"\['size'\]"):
            pm.spawn("clash", Clash)
    finally:
        pm.stop().get(timeout=30)


def test_point_size_and_value_mesh_get_by_rank_as_in_monarch():
    from monarch.actor import Point

    extent = Extent(["hosts", "gpus"], [2, 3])
    point = Point(4, extent)
    assert (point.size("hosts"), point.size("gpus"), point["gpus"]) == (2, 3, 1)
    with pytest.raises(ValueError, match="Dimension 'nope' not found"):
        point.size("nope")
    vm = ValueMesh(View.full(extent), [10, 11, 12, 13, 14, 15])
    assert [vm.get(r) for r in range(6)] == [10, 11, 12, 13, 14, 15]
    assert vm.slice(hosts=1).get(0) == 13  # ranks count within the mesh or slice at hand
    with pytest.raises(ValueError, match=r"index 6 out of range \(len=6\)"):
        vm.get(6)
    with pytest.raises(TypeError, match="rank must be an int"):
        vm.get("0")
