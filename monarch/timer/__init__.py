"""Timing sections of code on CPU or GPU (Monarch's ``monarch.timer``).

``with ExecutionTimer.time("step"):`` measures the block: with CUDA, by CUDA
events on the current stream (the GPU time of the work queued in the block,
measured without blocking the caller); without CUDA, or with
``use_cpu=True``, by ``time.perf_counter``. Measurements are per process: on
a mesh, call these inside remote functions or endpoints and fetch the
results (``get_latest_timer_measurement`` returns a tensor for that).
"""

from monarch.timer.execution_timer import (
    ExecutionTimer,
    execution_timer_start,
    execution_timer_stop,
    get_execution_timer_average_ms,
    get_execution_timer_summary,
    get_latest_timer_measurement,
    get_time_perfcounter,
)

__all__ = [
    "ExecutionTimer",
    "execution_timer_start",
    "execution_timer_stop",
    "get_execution_timer_average_ms",
    "get_execution_timer_summary",
    "get_latest_timer_measurement",
    "get_time_perfcounter",
]
