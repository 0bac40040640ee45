"""Placeholders for vllm, triton, fla (GPU-only) and renderers (git-only) so torchtitan's RL package imports on CPU.

Used only by .ci/downstream-torchtitan.sh (on PYTHONPATH there): every module of
torchtitan.experiments.rl is imported through its package, whose __init__ pulls
in vLLM. triton is served only to torchtitan's own imports: torch probes for it
and must find none on a CPU machine.

Any attribute is a placeholder class; calling one with a function returns the
function (decorators), otherwise a placeholder instance. Nothing here runs a model.
"""

import importlib.abc
import importlib.machinery
import sys
import types

_ROOTS = ("vllm", "triton", "fla", "renderers")


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _make(name)

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    def __ror__(cls, other):
        return cls


def _call(self, *a, **k):
    if len(a) == 1 and callable(a[0]) and not k:
        return a[0]
    return _make("result")()


def _make(name):
    return _Meta(
        name,
        (),
        {
            "__call__": _call,
            "__getattr__": lambda s, n: _make(n),
            "__getitem__": lambda s, i: s,
            "__init__": lambda s, *a, **k: None,
        },
    )


def _asked_by_torchtitan():
    """triton only for torchtitan's own imports: torch probes triton and must find none."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_globals.get("__name__", "")
        if not name.startswith(("importlib", "_frozen_importlib")):
            return name.startswith(("torchtitan", "triton", "fla"))
        f = f.f_back
    return False


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        root = fullname.split(".")[0]
        if root in _ROOTS and (root in ("vllm", "renderers") or _asked_by_torchtitan()):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__version__ = "0.0.0"
        m.__getattr__ = lambda n: (
            _make(n) if not n.startswith("__") else (_ for _ in ()).throw(AttributeError(n))
        )
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
