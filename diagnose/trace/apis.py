"""Classification of host-side CUDA / HIP runtime and driver API names.

The vocabulary drifts across CUDA, HIP and PyTorch versions (``cudaLaunchKernel``,
``cudaLaunchKernelExC``, ``cuLaunchKernelEx``, ``hipExtModuleLaunchKernel``, ``INVALID``...);
Intel XPU traces (``xpu_runtime``/``xpu_driver``) name SYCL Unified Runtime and Level Zero
calls (``urEnqueueKernelLaunch``, ``zeCommandListAppendLaunchKernel``,
``urEnqueueUSMMemcpy``, ``zeCommandListAppendMemoryCopy``, ``urEnqueueUSMFill``...).
A call that shares its correlation id with a GPU activity is treated as that activity's
launch whatever its name; these patterns only label calls by name.
"""
from __future__ import annotations

import re
from functools import lru_cache

_GRAPH_LAUNCH = re.compile(r"^(cuda|hip|cu)GraphLaunch|^urCommandBufferEnqueueExp", re.I)  # UR: SYCL graph replay
_LAUNCH = re.compile(
    r"^(cuda|hip|cu)(Ext)?(Module)?Launch(Cooperative)?Kernel|^cuLaunchGrid|^hipHccModuleLaunchKernel"
    # Intel XPU: SYCL Unified Runtime / legacy PI, Level Zero
    r"|^(ur|pi)EnqueueKernelLaunch|^zeCommandListAppendLaunch(Cooperative|Multiple)?Kernel",
    re.I,
)
_MEMCPY = re.compile(r"memcpy|MemoryCopy|USMMemcpy", re.I)
_MEMSET = re.compile(r"memset|MemoryFill|USMFill", re.I)
_SYNC = re.compile(r"synchronize|EventQuery|StreamWaitEvent|StreamQuery|^urQueueFinish|^urEventWait|^zeEventQueryStatus", re.I)


@lru_cache(maxsize=8192)
def api_kind(name: str) -> str:
    """Return "graph_launch" | "launch" | "memcpy" | "memset" | "sync" | "other" for an API name."""
    if _GRAPH_LAUNCH.search(name):
        return "graph_launch"
    if _LAUNCH.search(name):
        return "launch"
    if _MEMCPY.search(name):
        return "memcpy"
    if _MEMSET.search(name):
        return "memset"
    if _SYNC.search(name):
        return "sync"
    return "other"
