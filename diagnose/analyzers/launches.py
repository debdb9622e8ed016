"""Launch links: which host call launched each GPU activity, graph replays and their coverage.

A GPU activity is linked to the first runtime/driver call with its correlation id. Several
activities sharing one launch correlation are a CUDA/HIP graph replay: the first one (in time,
per device) carries the launch, later ones are ``graph_followup``. :func:`launch_links` gives
the per-activity links, :func:`launch_stats` the report's ``launches`` section.
"""
from __future__ import annotations

import re

import msgspec
import numpy as np
import pandas as pd

from diagnose.analyzers.base import Notes, declared
from diagnose.model import Launches
from diagnose.trace.model import NO_TIME, QualityIssue, Trace, per_unique

FINDINGS = declared("launches")


def link_launches(trace: Trace) -> pd.DataFrame:
    """Per GPU activity (aligned with ``trace.gpu``): its launch call's start/end/api_kind.

    Returns:
        DataFrame with launch_start_ns, launch_end_ns (NO_TIME when no launch call shares the
        activity's correlation id), launch_kind (api_kind or ""), graph_followup (bool: an
        earlier activity on the same device came from the same graph launch), launch_tid
        (the launching host thread, -1 when unknown).
    """
    gpu = trace.gpu
    n = len(gpu)
    out = pd.DataFrame(
        {
            "launch_start_ns": np.full(n, NO_TIME, dtype=np.int64),
            "launch_end_ns": np.full(n, NO_TIME, dtype=np.int64),
            "launch_kind": np.full(n, "", dtype=object),
            "graph_followup": np.zeros(n, dtype=bool),
            "launch_tid": np.full(n, -1, dtype=np.int64),
            "launch_row": np.full(n, -1, dtype=np.int64),
        }
    )
    rt = trace.runtime
    if n == 0 or len(rt) == 0:
        return out
    # the first runtime call (in row order) of each correlation id, found by binary search
    rc = rt["correlation"].to_numpy()
    rows = np.flatnonzero(rc >= 0)
    order = np.argsort(rc[rows], kind="stable")
    sorted_corr = rc[rows][order]
    first = np.ones(len(sorted_corr), dtype=bool)
    first[1:] = sorted_corr[1:] != sorted_corr[:-1]
    uniq_corr, uniq_row = sorted_corr[first], rows[order[first]]
    corr = gpu["correlation"].to_numpy()
    pos = np.minimum(np.searchsorted(uniq_corr, corr), max(len(uniq_corr) - 1, 0))
    found = (corr >= 0) & (len(uniq_corr) > 0)
    if len(uniq_corr):
        found &= uniq_corr[pos] == corr
    hit = uniq_row[pos[found]]
    out.loc[found, "launch_start_ns"] = rt["start_ns"].to_numpy()[hit]
    out.loc[found, "launch_end_ns"] = rt["end_ns"].to_numpy()[hit]
    out.loc[found, "launch_kind"] = rt["api_kind"].to_numpy(dtype=object)[hit]
    out.loc[found, "launch_tid"] = rt["tid"].to_numpy()[hit]
    out.loc[found, "launch_row"] = hit
    # Fan-out: several activities share one launch correlation (graph replay). The first one
    # (in time, per device) carries the launch; later ones are inside the replay.
    key = pd.DataFrame({"device": gpu["device"].to_numpy(), "corr": corr, "start": gpu["start_ns"].to_numpy()})
    key = key.sort_values(["device", "corr", "start"], kind="stable")
    dup = key.duplicated(["device", "corr"], keep="first").to_numpy() & (key["corr"].to_numpy() >= 0)
    followup = np.zeros(n, dtype=bool)
    followup[key.index.to_numpy()[dup]] = True
    out["graph_followup"] = followup & found
    return out


GRAPH_COVERAGE_MIN = 0.9


def launch_stats(trace: Trace, g: pd.DataFrame) -> Launches:
    """Host launch calls, graph launches, their fan-out and coverage.

    ``host_launch_calls``: runtime calls named as launches plus any other call linked to GPU
    work by correlation (vocabulary drift such as ``INVALID``). ``graph_coverage``: share of
    graph launches with at least one GPU activity in the trace (None without graph launches).
    """
    rt = trace.runtime
    extra = {"inductor_kernels": _inductor_kernels(g), "fused_attention_share": _fused_attention_share(g)}
    if len(rt) == 0:
        return Launches(host_launch_calls=0, graph_launches=0, graph_launches_with_activity=0,
                        graph_coverage=None, kernels_per_graph_launch_max=None, **extra)
    kinds = rt["api_kind"].to_numpy(dtype=object)
    corr = rt["correlation"].to_numpy()
    gpu_corr = g["correlation"].to_numpy() if len(g) else np.empty(0, dtype=np.int64)
    linked = pd.Series(corr, copy=False).isin(gpu_corr).to_numpy() & (corr >= 0)  # hash lookups
    is_launch = (kinds == "launch") | (kinds == "graph_launch") | (linked & (kinds != "memcpy") & (kinds != "memset"))
    graph = kinds == "graph_launch"
    n_graph = int(graph.sum())
    covered = int((graph & linked).sum())
    fan = None
    if n_graph and len(g):
        gk = g[g["launch_kind"] == "graph_launch"]
        if len(gk):
            fan = int(gk.groupby("correlation").size().max())
    return Launches(host_launch_calls=int(is_launch.sum()), graph_launches=n_graph, graph_launches_with_activity=covered,
                    graph_coverage=round(covered / n_graph, 6) if n_graph else None, kernels_per_graph_launch_max=fan, **extra)


#: Kernels generated by torch.compile's Inductor (Triton pointwise, reduction, persistent
#: reduction and template kernels: ``triton_poi_fused_*``, ``triton_red_fused_*``...).
INDUCTOR_KERNEL = re.compile(r"^triton_(?:poi|red|per|tem)_")


#: Fused (IO-aware, FlashAttention-style) attention kernels: FlashAttention 2/3, CK/aiter FMHA,
#: Triton attn_fwd, FlashInfer BatchPrefill/BatchDecode, vLLM unified/paged attention,
#: PyTorch's memory-efficient SDPA (xformers/cutlass). Softmax kernels of the unfused "math"
#: path are attention-category kernels that do not match.
FUSED_ATTENTION_KERNEL = re.compile(
    r"flash|fmha|attn_fwd|mha_fwd|mha_batch|BatchPrefill|BatchDecode|unified_attention|paged_attention|"
    r"efficient_attention|xformers|splitkv", re.I)


def _fused_attention_share(g: pd.DataFrame) -> float | None:
    """Time of fused attention kernels / time of attention-category kernels (None without any)."""
    if len(g) == 0 or "category" not in g:
        return None
    att = (g["category"] == "attention").to_numpy()
    if not att.any():
        return None
    dur = (g["end_ns"] - g["start_ns"]).to_numpy()[att]
    fused = per_unique(g["name"][att], lambda u: bool(FUSED_ATTENTION_KERNEL.search(str(u))))
    total = float(dur.sum())
    return round(float(dur[fused].sum()) / total, 6) if total > 0 else None


def _inductor_kernels(g: pd.DataFrame) -> int:
    """GPU activities whose kernel name is an Inductor-generated one (the step is compiled)."""
    if len(g) == 0:
        return 0
    return int(per_unique(g["name"], lambda u: bool(INDUCTOR_KERNEL.match(str(u)))).sum())




class LaunchLinks(msgspec.Struct, frozen=True):
    """:func:`link_launches` per GPU activity (with ``clock_skewed``), and the notes: no GPU
    activity, unlinked activities, clock skew, graph-replayed kernels."""

    frame: pd.DataFrame
    notes: tuple[QualityIssue, ...] = ()
    #: start times (int64 ns) of launch calls no GPU record answers (``orphan_launches``)
    orphan_launch_ns: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def launch_links(trace: Trace) -> LaunchLinks:
    """Link launches; note unlinked, clock-skewed and graph-replayed activities."""
    notes = Notes()
    launches = link_launches(trace)
    gpu = trace.gpu
    if len(gpu) == 0:
        notes.note("no_gpu_activity", "no GPU activity (kernels, memcpy, memset) in the trace: GPU numbers are unavailable")
        return LaunchLinks(launches, tuple(notes.issues))
    kind = launches["launch_kind"].to_numpy(dtype=object)
    unlinked = int((kind == "").sum())
    if unlinked:
        notes.note("unlinked_kernels", f"{unlinked} of {len(gpu)} GPU activities have no host launch call with their correlation id; gaps before them are 'unattributed'", unlinked)
    _clock_skew(trace, launches, notes)
    orphans = _orphan_launches(trace, notes)
    graph = kind == "graph_launch"
    if graph.any():
        n_launch = int(pd.unique(gpu["correlation"].to_numpy()[graph]).size)
        notes.note("graph_kernels_no_launch", f"{int(graph.sum())} kernels replayed from {n_launch} graph launch(es): no per-kernel launch call; op-level attribution unavailable for them", int(graph.sum()))
    return LaunchLinks(launches, tuple(notes.issues), orphans)


def _orphan_launches(trace: Trace, notes: Notes) -> np.ndarray:
    """Kernel launch calls (api kind ``launch``, with a correlation id) that no GPU record
    answers: the profiler dropped their activity (libkineto drops records outside its window
    or when a buffer overflows, pytorch#192021). Noted (``orphan_launches``, with where they
    sit: before the first answered launch, after the last, or in between) and their start
    times returned for the latency analyzer (int64 ns: a step holding one is incomplete)."""
    none = np.zeros(0, dtype=np.int64)
    rt, gpu = trace.runtime, trace.gpu
    if len(rt) == 0 or len(gpu) == 0:
        return none
    corr = rt["correlation"].to_numpy()
    launch = (rt["api_kind"].to_numpy(dtype=object) == "launch") & (corr >= 0)
    if not launch.any():
        return none
    answered = pd.Series(corr, copy=False).isin(gpu["correlation"].to_numpy()).to_numpy()
    orphan = launch & ~answered
    starts = rt["start_ns"].to_numpy()
    if orphan.any():
        orphan &= ~_in_capture(rt, starts)  # launches into a graph being captured run nothing
    if not orphan.any():
        return none
    o = starts[orphan]
    ok = starts[launch & answered]
    k = int(orphan.sum())
    if len(ok) == 0:
        where = "no launch of the trace has one"
    elif o.max() < ok.min():
        where = "all at trace start (before the first launch that has one)"
    elif o.min() > ok.max():
        where = "all at trace end (after the last launch that has one)"
    else:
        first, last = int((o < ok.min()).sum()), int((o > ok.max()).sum())
        where = (f"{first} at trace start, {last} at its end, {k - first - last} in between" if first or last
                 else f"in the middle of the trace (the first {(o.min() - min(starts.min(), gpu['start_ns'].min())) / 1e6:.3f} ms from its start)")
    notes.note("orphan_launches", f"{k} kernel launch{'' if k == 1 else 'es'} have no GPU kernel, {where}: the profiler dropped "
               "their records; steps holding one are left out of the per-step numbers", k)
    return o.astype(np.int64)


_CAPTURE_CALL = re.compile(r"StreamBeginCapture|StreamEndCapture", re.I)


def _in_capture(rt: pd.DataFrame, starts: np.ndarray) -> np.ndarray:
    """Whether each runtime call starts inside a stream capture (from a ``*StreamBeginCapture``
    call's start to the next ``*StreamEndCapture``'s end): its launches are recorded into a
    graph, never executed, so they have no GPU record by design."""
    out = np.zeros(len(rt), dtype=bool)
    names = rt["name"]
    kind = per_unique(names, lambda u: 1 if "begin" in str(u).lower() and _CAPTURE_CALL.search(str(u))
                      else 2 if _CAPTURE_CALL.search(str(u)) else 0, dtype=np.int8)
    if not kind.any():
        return out
    ends = rt["end_ns"].to_numpy()
    opened = None
    for i in np.argsort(starts, kind="stable")[kind[np.argsort(starts, kind="stable")] > 0]:
        if kind[i] == 1 and opened is None:
            opened = starts[i]
        elif kind[i] == 2 and opened is not None:
            out |= (starts >= opened) & (starts <= ends[i])
            opened = None
    if opened is not None:
        out |= starts >= opened
    return out


#: A GPU activity that starts this long before its launch call starts cannot be real: clock
#: skew (a kernel may start before its launch call *returns*, never before it begins).
SKEW_MIN_NS = 1_000


def _clock_skew(trace: Trace, launches: pd.DataFrame, notes: Notes) -> None:
    """Activities that start before their launch call starts (kineto#1380): estimate the skew
    per device (median of those differences) and mark them (``launches["clock_skewed"]``) so
    the gaps before them are unattributed, never launch gaps."""
    gpu = trace.gpu
    ls = launches["launch_start_ns"].to_numpy()
    early = (ls != NO_TIME) & (gpu["start_ns"].to_numpy() < ls - SKEW_MIN_NS)
    launches["clock_skewed"] = early
    if not early.any():
        return
    diff = (ls - gpu["start_ns"].to_numpy())[early]
    dev = gpu["device"].to_numpy()[early]
    est = ", ".join(f"device {int(d)}: {float(np.median(diff[dev == d])) / 1e3:.1f} µs" for d in np.unique(dev))
    notes.note("clock_skew", f"{int(early.sum())} GPU activities start before their launch call starts (host/device clock skew; "
             f"median lead {est}): the gaps before them are unattributed, never launch gaps", int(early.sum()))
