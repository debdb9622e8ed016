"""Classification of host-side CUDA / HIP runtime and driver API names.

The vocabulary drifts across CUDA, HIP and PyTorch versions (``cudaLaunchKernel``,
``cudaLaunchKernelExC``, ``cuLaunchKernelEx``, ``hipExtModuleLaunchKernel``, ``INVALID``...).
A call that shares its correlation id with a GPU activity is treated as that activity's
launch whatever its name; these patterns only label calls by name.
"""
from __future__ import annotations

import re
from functools import lru_cache

_GRAPH_LAUNCH = re.compile(r"^(cuda|hip|cu)GraphLaunch", re.I)
_LAUNCH = re.compile(
    r"^(cuda|hip|cu)(Ext)?(Module)?Launch(Cooperative)?Kernel|^cuLaunchGrid|^hipHccModuleLaunchKernel",
    re.I,
)
_MEMCPY = re.compile(r"memcpy", re.I)
_MEMSET = re.compile(r"memset", re.I)
_SYNC = re.compile(r"synchronize|EventQuery|StreamWaitEvent|StreamQuery", re.I)


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
