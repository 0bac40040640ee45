"""``ExecutionTimer``: named sections timed by CUDA events or ``perf_counter``.

State is per process and per class (as in Monarch, the methods are class
methods). GPU measurements are resolved when read (``summary``,
``get_latest_measurement``), by waiting on the section's end event: no thread
polls in the background, and reading waits only for the GPU work that was
timed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

_DEFAULT = "default"


class ExecutionTimer:
    """Times named sections; nested or repeated sections of one name stack."""

    _lock = threading.Lock()
    _times: dict[str, list[float]] = {}  # finished measurements, ms
    _cpu_starts: dict[str, list[float]] = {}  # open CPU sections
    _gpu_open: dict[str, list[Any]] = {}  # open GPU sections: start events
    _gpu_pending: dict[str, list[tuple[Any, Any]]] = {}  # (start, end) not yet read

    @classmethod
    @contextlib.contextmanager
    def time(cls, name: str | None = None, use_cpu: bool = False) -> Iterator[None]:
        """Time the ``with`` block as section ``name`` (default ``"default"``)."""
        cls.start(name, use_cpu)
        try:
            yield
        finally:
            cls.stop(name, use_cpu)

    @classmethod
    def start(cls, name: str | None = None, use_cpu: bool = False) -> None:
        """Open section ``name``: CPU time if asked or without CUDA, else a CUDA event."""
        name = name or _DEFAULT
        with cls._lock:
            cls._times.setdefault(name, [])
            if use_cpu or not torch.cuda.is_available():
                cls._cpu_starts.setdefault(name, []).append(time.perf_counter())
                return
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream())
        with cls._lock:
            cls._gpu_open.setdefault(name, []).append(event)

    @classmethod
    def stop(cls, name: str | None = None, use_cpu: bool = False) -> None:
        """Close the last opened section ``name``; ValueError if none is open."""
        name = name or _DEFAULT
        now = time.perf_counter()
        with cls._lock:
            cpu = cls._cpu_starts.get(name)
            if (use_cpu or not torch.cuda.is_available()) and cpu:
                cls._times[name].append((now - cpu.pop()) * 1000.0)
                return
            gpu = cls._gpu_open.get(name)
            if not gpu:
                raise ValueError(f"ExecutionTimer: section {name!r} was not started")
            start = gpu.pop()
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream())
        with cls._lock:
            cls._gpu_pending.setdefault(name, []).append((start, end))

    @classmethod
    def _resolve(cls, name: str | None = None) -> None:
        """Turn finished GPU sections (of ``name``, or all) into measurements."""
        with cls._lock:
            names = [name] if name is not None else list(cls._gpu_pending)
            pending = {n: cls._gpu_pending.pop(n, []) for n in names}
        for n, pairs in pending.items():
            for start, end in pairs:
                end.synchronize()
                elapsed = start.elapsed_time(end)
                with cls._lock:
                    cls._times.setdefault(n, []).append(elapsed)

    @classmethod
    def reset(cls) -> None:
        """Forget every measurement and open section."""
        with cls._lock:
            cls._times, cls._cpu_starts, cls._gpu_open, cls._gpu_pending = {}, {}, {}, {}

    @classmethod
    def summary(cls) -> dict[str, dict[str, float]]:
        """Per section with measurements: count, mean_ms, total_ms, min_ms, max_ms."""
        cls._resolve()
        with cls._lock:
            return {
                name: {
                    "count": len(times),
                    "mean_ms": sum(times) / len(times),
                    "total_ms": sum(times),
                    "min_ms": min(times),
                    "max_ms": max(times),
                }
                for name, times in cls._times.items()
                if times
            }

    @classmethod
    def get_latest_measurement(cls, name: str | None = None) -> float:
        """The last measurement of ``name`` in ms; 0.0 if it has none."""
        name = name or _DEFAULT
        cls._resolve(name)
        with cls._lock:
            times = cls._times.get(name)
            return times[-1] if times else 0.0


def execution_timer_start(name: str | None = None, use_cpu: bool = False) -> None:
    """:meth:`ExecutionTimer.start`."""
    ExecutionTimer.start(name, use_cpu)


def execution_timer_stop(name: str | None = None, use_cpu: bool = False) -> None:
    """:meth:`ExecutionTimer.stop`."""
    ExecutionTimer.stop(name, use_cpu)


def get_execution_timer_average_ms(name: str = _DEFAULT) -> torch.Tensor:
    """The mean of section ``name`` in ms, as a float64 tensor; KeyError if it has none."""
    return torch.tensor(ExecutionTimer.summary()[name]["mean_ms"], dtype=torch.float64)


def get_latest_timer_measurement(name: str | None = None) -> torch.Tensor:
    """:meth:`ExecutionTimer.get_latest_measurement` as a float64 tensor."""
    return torch.tensor(ExecutionTimer.get_latest_measurement(name), dtype=torch.float64)


def get_execution_timer_summary() -> dict[str, dict[str, float]]:
    """:meth:`ExecutionTimer.summary`."""
    return ExecutionTimer.summary()


def get_time_perfcounter() -> torch.Tensor:
    """``time.perf_counter()`` as a float64 tensor (for debugging)."""
    return torch.tensor(time.perf_counter(), dtype=torch.float64)
