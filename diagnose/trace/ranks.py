"""Several ranks merged into one trace file: split them back into one trace per rank.

SGLang's ``ProfileMerger`` (``sglang.srt.utils.profile_merger``) concatenates the Kineto
traces of every rank into one file and prefixes each event's pid with the rank's label:
``"pid": "[TP01-DP00-PP00-EP00] 83"``. Correlation and external ids are per process, so they
collide across ranks, and every rank's GPUs share device indices with the others'.

The Kineto loader recognises the labels (:attr:`Trace.ranks`, quality code ``ranks_merged``),
strips them from the pids, adds a ``rank`` column to every frame and qualifies the ids of
rank ``r`` as ``r << 40 | id``, so that even the whole-file view never links a kernel to
another rank's launch. :func:`split_ranks` gives each rank its own :class:`Trace`, as if it
had been loaded from its own file: the rows of that rank, the original ids, the devices
listed once.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from diagnose.trace.model import FRAMES, RANK_ID_SHIFT, Trace

_ID_MASK = (1 << RANK_ID_SHIFT) - 1
# frame -> id columns qualified by the loader (see diagnose.trace.kineto._Columns.finish)
_ID_COLUMNS = {"gpu": ("correlation", "external_id"), "runtime": ("correlation",), "cpu_ops": ("external_id",),
               "gpu_syncs": ("correlation", "wait_record_correlation")}


def label_process_ranks(trace: Trace) -> Trace:
    """An nsys export of a multi-process job (tensor parallelism: one process per GPU, each
    emitting the same NVTX step markers, nsys-ai#590) as a merged file of ranks: one rank per
    process that has GPU activity, labelled ``"pid <pid>"``, every frame with a ``rank``
    column (rows of other processes: -1, left out by :func:`split_ranks`), noted
    ``ranks_merged``. Each process's steps, TPOT and gaps are then its own, as for the
    ranks of a merged Kineto file. A trace with fewer than two such processes is unchanged.
    Correlation ids are already per process (the nsys loader qualifies them with the pid).
    """
    pids = np.unique(trace.gpu["pid"].to_numpy()) if len(trace.gpu) else np.zeros(0, dtype=np.int64)
    pids = pids[pids >= 0]
    if len(pids) < 2 or trace.ranks:
        return trace
    index = {int(p): i for i, p in enumerate(pids.tolist())}
    for attr in FRAMES:
        f = getattr(trace, attr)
        if "pid" not in f.columns:
            continue
        pid = f["pid"].to_numpy()
        rank = np.full(len(f), -1, dtype=np.int64)
        for p, i in index.items():
            rank[pid == p] = i
        setattr(trace, attr, f.assign(rank=rank))
    trace.ranks = [f"pid {p}" for p in index]
    trace.note("ranks_merged", f"{len(pids)} processes with GPU work in one Nsight Systems export (pids {', '.join(map(str, index))}): "
               "each analysed alone (its own steps, TPOT and gaps)", len(pids))
    return trace


def split_ranks(trace: Trace) -> list[tuple[str, Trace]]:
    """One ``(label, trace)`` per rank of a merged file, in label order ("TP00-DP00-PP00-EP00",
    "TP01-DP00-PP00-EP00", ...); a trace that is not merged comes back as ``[("", trace)]``.

    Each rank's trace has only that rank's rows (rows without a rank label are left out),
    its ids as recorded (the loader's rank qualification removed), the devices of the file
    listed once (each rank of a merged file lists the devices it saw), the file's metadata,
    partial flag and quality notes but ``ranks_merged``, and its own ``python_function``
    counts. ``trace`` itself is not modified.
    """
    if not trace.ranks:
        return [("", trace)]
    out = []
    seen: set[int] = set()
    devices = []
    for d in trace.devices:
        if d.id not in seen:
            seen.add(d.id)
            devices.append(d)
    quality = [q for q in trace.quality if q.code != "ranks_merged"]
    for i, label in enumerate(trace.ranks):
        frames = {}
        for attr in FRAMES:
            f = getattr(trace, attr)
            if "rank" not in f.columns:
                frames[attr] = f
                continue
            part = f[f["rank"].to_numpy() == i].drop(columns="rank").reset_index(drop=True)
            for c in _ID_COLUMNS.get(attr, ()):
                x = part[c].to_numpy()
                part[c] = np.where(x >= 0, x & _ID_MASK, x)
            frames[attr] = part
        counts = dict(trace._rank_counts.get(label, {"python_function": 0, "python_function_ns": 0}))
        one = dataclasses.replace(trace, **frames, devices=list(devices), metadata=dict(trace.metadata),
                                  quality=list(quality), counts=counts, ranks=[], _rank_counts={})
        one.metadata["merged_rank"] = label
        out.append((label, one))
    return out
