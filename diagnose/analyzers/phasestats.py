"""Per-device, per-phase numbers: busy and idle time, gaps by kind, categories, top kernels,
and the roofline numbers of each step phase.

:func:`phase_rows` gives one :class:`~diagnose.model.PhaseRow` for ``all`` per device, one per
step phase present on it, and ``unknown`` for activity no step claims.
"""
from __future__ import annotations


import msgspec
import numpy as np
import pandas as pd
from msgspec import UNSET

from diagnose.analyzers.attainment import NO_ATTAINMENT, AttainmentPrep, phase_attainment
from diagnose.analyzers.base import Notes, declared
from diagnose.analyzers.latency import union_ns
from diagnose.analyzers.timeline import gap_distribution, union_busy_ns, union_by_group_ns
from diagnose.analyzers.causerows import cause_rows
from diagnose.analyzers.collectives import Collectives, phase_collectives
from diagnose.analyzers.hostcause import HostCauses
from diagnose.analyzers.oploss import op_classes as op_class_table
from diagnose.analyzers.oploss import weight_roles
from diagnose.analyzers.precision import precision_summaries
from diagnose.analyzers.smallkernels import small_kernel_tax
from diagnose.analyzers.waits import StepWaits, caused_gaps, idle_by_cause_ms, longest, outside_waits_ns
from diagnose.model import Attainment, Device, Gaps, OpClass, PhaseRow, PhaseTimes, Precision, TopKernel
from diagnose.trace.model import NO_TIME, QualityIssue, Trace, per_unique
from diagnose.vocab import CATEGORIES, EXTERNAL_CAUSES, STEP_PHASES

#: Kernels shorter than this are "small": each costs about as much to launch as to run
#: (a launch is ~5-10 µs of host time; project default, rationale in rules/small-kernel-tax.yaml).
SMALL_KERNEL_NS = 15_000

FINDINGS = declared("phasestats")


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(float(x), nd)


def phase_stats(name: str, device: int | None, sub: pd.DataFrame, n_steps: int, wall_ns: int, unreliable: tuple[str, ...] = (),
                attainment: Attainment | None = None, own_ns: int | None = None, host: HostCauses | None = None,
                t0: int = 0, outside: tuple[np.ndarray, np.ndarray] | None = None, trace: Trace | None = None,
                psteps: pd.DataFrame | None = None, coll: Collectives | None = None,
                pre: tuple | None = None, op_classes: list[OpClass] | None = None,
                precision: Precision | None = None) -> PhaseRow:
    """Timeline, category, gap-cause and top-kernel numbers of one phase on one device
    (``sub``: its activities; ``host``: what the host did, for the gap causes; ``outside``:
    sorted start/end ns of the steps' ``outside_trace`` waits on this device: a queued gap
    mostly inside one is ``outside_trace`` here too, so the two views agree; ``psteps``: the
    phase's steps, for the causes per step; ``coll``: the collectives' split, rows aligned
    with the activity table ``sub`` was cut from; ``pre``: ``sub``'s gaps already explained);
    the idle share of the steps' own time, the small-kernel tax
    (:mod:`diagnose.analyzers.smallkernels`), and the kernel table's op classes and precision
    lever of this phase (``op_classes``, ``precision``)."""
    gaps, cg, dacts = caused_gaps(sub, host, outside, pre)
    dur = (sub["end_ns"] - sub["start_ns"]).to_numpy()
    cat_id = sub["category_id"].to_numpy()
    s_all, e_all = sub["start_ns"].to_numpy(), sub["end_ns"].to_numpy()
    is_kernel = (sub["kind"] == "kernel").to_numpy()
    # per category: the union of its activities (kernels of one category on overlapping
    # streams count once), so each category's share of kernel time is at most 1
    present = np.bincount(cat_id, minlength=len(CATEGORIES)) > 0
    per_cat = union_by_group_ns(s_all, e_all, cat_id, len(CATEGORIES))
    categories_ms = {c: round(float(per_cat[i]) / 1e6, 6) for i, c in enumerate(CATEGORIES) if present[i]}
    kernel_ns = int(dur[is_kernel].sum())
    kernel_busy_ns = union_busy_ns(s_all[is_kernel], e_all[is_kernel])
    small = is_kernel & (dur < SMALL_KERNEL_NS)
    h2d = (sub["kind"] == "memcpy").to_numpy() & per_unique(sub["name"], lambda n: "HtoD" in str(n) or "Host -> Device" in str(n))
    # small kernels and host-to-device copies as busy unions too: time on the window, counted once
    sel = small | h2d
    small_h2d = union_by_group_ns(s_all[sel], e_all[sel], np.where(small[sel], 0, 1), 2)
    comm = comm_overlap(s_all, e_all, cat_id, gaps.busy_ns)
    attn_ns = int(per_cat[CATEGORIES.index("attention")])
    top = _top_kernels(sub, dur, is_kernel, s_all, e_all, kernel_busy_ns)
    gap_info = Gaps(
        launch=gap_distribution(gaps.launch_gaps_ns),
        all=gap_distribution(gaps.all_gaps_ns),
        ms_by_kind={k: round(v / 1e6, 6) for k, v in gaps.gap_ns_by_kind.items()},
        count_by_kind=dict(gaps.gap_count_by_kind),
        longest=longest(cg, dacts, host, trace, t0),
    )
    pos = sub.index.to_numpy() if coll is not None else np.zeros(0, dtype=np.int64)
    coll_comm, coll_wait, coll_calls, coll_top = phase_collectives(coll, pos) if coll is not None else (0, 0, 0, None)
    comm_exposed_ns = comm.exposed_ns
    if coll_wait and comm_exposed_ns:  # exposed communication holds the transfer, not the wait for peers
        comm_exposed_ns = max(0, comm_exposed_ns - coll_wait)
    causes = cause_rows(cg, gaps.window_ns, own_ns, psteps, (coll_wait, coll_calls, coll_top))
    graph_share = None
    if psteps is not None and len(psteps) and "graph_step" in psteps:
        graph_share = round(float(psteps["graph_step"].to_numpy(dtype=bool).mean()), 6)
    by_cause = idle_by_cause_ms(cg)
    own_window_ms = gaps.window_ns / 1e6 - sum(float(by_cause.get(c, 0.0)) for c in EXTERNAL_CAUSES)
    idle_own = (max(0.0, own_window_ms - gaps.busy_ns / 1e6) / own_window_ms
                if len(sub) and own_window_ms > 0 else None)
    tax = small_kernel_tax(sub, own_ns) if own_ns else None
    times = PhaseTimes(
        name=name,
        device=device,
        step_count=n_steps,
        wall_ms=round(wall_ns / 1e6, 6),
        own_ms=None if own_ns is None else round(own_ns / 1e6, 6),
        window_ms=round(gaps.window_ns / 1e6, 6),
        gpu_busy_ms=round(gaps.busy_ns / 1e6, 6),
        gpu_idle_share=_r(gaps.idle_share),
        launch_gap_share=_r(gaps.launch_gap_share),
        attention_share=_r(attn_ns / kernel_busy_ns) if kernel_busy_ns else None,
        kernel_ms=round(kernel_ns / 1e6, 6),
        kernel_busy_ms=round(kernel_busy_ns / 1e6, 6),
        kernel_count=int(is_kernel.sum()),
        activity_count=int(len(sub)),
        categories_ms=categories_ms,
        gaps=gap_info,
        idle_by_cause_ms=by_cause,
        causes=causes,
        graph_step_share=graph_share,
        collective_comm_ms=round(coll_comm / 1e6, 6),
        collective_wait_ms=round(coll_wait / 1e6, 6),
        small_kernel_ms=round(float(small_h2d[0]) / 1e6, 6),
        small_kernel_count=int(small.sum()),
        h2d_ms=round(float(small_h2d[1]) / 1e6, 6),
        comm_exposed_ms=round(comm_exposed_ns / 1e6, 6),
        comm_hidden_ms=round(comm.hidden_ns / 1e6, 6),
        comm_hidden_behind_ms={c: round(v / 1e6, 6) for c, v in comm.behind_ns.items()},
        top_kernels=top,
        unreliable=list(unreliable),
        gpu_idle_own_share=_r(min(1.0, idle_own)) if idle_own is not None else None,
        small_kernel_own_count=tax.count if tax is not None else None,
        small_kernel_own_share=_r(tax.own_share) if tax is not None and tax.own_share is not None else None,
        small_kernel_saving_ms=round(tax.saving_ns / 1e6, 6) if tax is not None else None,
        op_classes=list(op_classes or ()),
        precision=precision,
    )
    return PhaseRow.of(times, attainment if attainment is not None else NO_ATTAINMENT)



class CommOverlap(msgspec.Struct, frozen=True):
    """Communication of one phase against everything else on the device, in ns:
    ``exposed_ns`` with nothing else running, ``hidden_ns`` with other work running (together
    the communication's busy union), and ``behind_ns``: per other category present, the
    communication time during which that category ran (categories may overlap each other,
    so these need not add up to ``hidden_ns``)."""

    exposed_ns: int = 0
    hidden_ns: int = 0
    behind_ns: dict[str, int] = msgspec.field(default_factory=dict)


_COMM = CATEGORIES.index("communication")


def comm_overlap(start_ns: np.ndarray, end_ns: np.ndarray, cat_id: np.ndarray, busy_ns: int) -> CommOverlap:
    """Exposed and hidden communication (:class:`CommOverlap`) of one phase's activities.

    Exposed = busy union of everything - busy union of everything but communication; hidden
    = communication's union - exposed; hidden behind category c = |comm ∩ c| = |comm| + |c|
    - |comm ∪ c| (each a busy union, one sort for all categories)."""
    comm = cat_id == _COMM
    if not comm.any():
        return CommOverlap()
    others = sorted(int(c) for c in np.unique(cat_id[~comm]))
    comm_ns = union_busy_ns(start_ns[comm], end_ns[comm])
    exposed = busy_ns - union_busy_ns(start_ns[~comm], end_ns[~comm])
    if not others:
        return CommOverlap(exposed, comm_ns - exposed, {})
    # groups: each other category alone (0..k-1), then comm together with it (k..2k-1)
    k = len(others)
    slot = np.full(len(CATEGORIES), -1, dtype=np.int64)
    slot[others] = np.arange(k)
    cs, ce = start_ns[comm], end_ns[comm]
    idx = ~comm
    starts = [start_ns[idx], start_ns[idx]] + [cs] * k
    ends = [end_ns[idx], end_ns[idx]] + [ce] * k
    groups = [slot[cat_id[idx]], slot[cat_id[idx]] + k] + [np.full(len(cs), k + i, dtype=np.int64) for i in range(k)]
    u = union_by_group_ns(np.concatenate(starts), np.concatenate(ends), np.concatenate(groups), 2 * k)
    behind = {CATEGORIES[c]: int(comm_ns + u[i] - u[k + i]) for i, c in enumerate(others)}
    return CommOverlap(exposed, comm_ns - exposed, {c: v for c, v in behind.items() if v > 0})


def _top_kernels(sub: pd.DataFrame, dur: np.ndarray, is_kernel: np.ndarray, s_all: np.ndarray, e_all: np.ndarray,
                 kernel_busy_ns: int, top: int = 10) -> list[TopKernel]:
    """The ``top`` kernel names by summed time; each one's share is its busy union over the
    phase's kernel busy union (the one denominator of every kernel-time share)."""
    if not is_kernel.any():
        return []
    # per kernel name, in first-seen order (as groupby(sort=False))
    codes, _ = pd.factorize(sub["name_id"].to_numpy()[is_kernel], sort=False)
    first = np.full(codes.max() + 1, len(codes), dtype=np.int64)
    np.minimum.at(first, codes, np.arange(len(codes)))
    total = np.bincount(codes, weights=dur[is_kernel]).astype(np.int64)
    order = sorted(range(len(total)), key=lambda i: (-total[i], i))[:top]
    rank = np.full(len(total), -1, dtype=np.int64)
    rank[order] = np.arange(len(order))
    mine = rank[codes] >= 0
    union = union_by_group_ns(s_all[is_kernel][mine], e_all[is_kernel][mine], rank[codes][mine], len(order))
    count = np.bincount(codes)
    names = sub["name"].to_numpy(dtype=object)[is_kernel][first]
    cats = sub["category"].to_numpy()[is_kernel][first]
    return [TopKernel(name=str(names[i])[:200], category=cats[i], count=int(count[i]),
                      total_ms=round(float(total[i]) / 1e6, 6),
                      kernel_time_share=round(float(union[r]) / kernel_busy_ns, 6) if kernel_busy_ns else None)
            for r, i in enumerate(order)]


#: Phase numbers that a window holding part of a forward cannot give.
FRAGMENT_UNRELIABLE = ("mbu", "mfu", "bound_ratio", "achieved_tbps", "achieved_tflops", "arithmetic_intensity")

TPOT_FRAGMENTS = ("steps whose window holds part of a forward (quality 'fragment') are left out: "
                  "interval between completions of consecutive whole decode steps")


class PhaseRows(msgspec.Struct, frozen=True):
    """The phase rows of every device, the steps that hold part of a forward (the trace-type
    test's and the model-config FLOP coverage's), and the notes (fragment, bandwidth above peak)."""

    rows: list[PhaseRow]
    fragment_steps: frozenset[int] = frozenset()
    notes: tuple[QualityIssue, ...] = ()


def phase_rows(trace: Trace, activities: pd.DataFrame, steps: pd.DataFrame, waits: StepWaits, devices: list[Device],
               prep: AttainmentPrep, unreliable: tuple[str, ...] = (), fragment_steps: tuple[int, ...] = (),
               coll: Collectives | None = None, kernels: pd.DataFrame | None = None) -> PhaseRows:
    """One row for ``all`` per device, one per step phase present on it, and ``unknown`` for
    activity no step claims. ``steps``: the step table with every analyzer's columns;
    ``fragment_steps``: the steps the trace-type test found to hold part of a forward;
    ``kernels``: the kernel table (its op classes and precision lever per phase)."""
    g = activities
    notes = Notes()
    classes, prec = _kernel_advice(kernels, steps, prep)
    kw = {"host": waits.host, "t0": waits.t0_ns, "trace": trace, "coll": coll}
    graph_steps = prep.graph_steps
    devices_present = [d.id for d in devices]
    phases: list[PhaseRow] = []
    phase_names = [p for p in STEP_PHASES if len(steps) and (steps["phase"] == p).any()]
    frag_steps: set = set(fragment_steps)
    for dev in devices_present or [None]:
        sub_all = g[g["device"] == dev] if dev is not None else g.iloc[0:0]
        dev_steps = steps if dev is None else steps[steps["device_activity_count"].apply(lambda m: dev in m)]
        kw["outside"] = outside_waits_ns(dev_steps, waits.t0_ns)
        all_wall = _all_wall_ns(sub_all, dev_steps) if (len(sub_all) or len(dev_steps)) else _cpu_span_ns(trace)
        phases.append(phase_stats("all", dev, sub_all, len(steps), all_wall, unreliable, psteps=dev_steps,
                                  pre=waits.devices.get(dev), **kw))
        for p in phase_names:
            ps = steps[steps["phase"] == p] if dev is None else dev_steps[dev_steps["phase"] == p]
            pm = (sub_all["phase"] == p).to_numpy()
            sub = sub_all[pm]
            if dev is not None and len(ps) == 0 and len(sub) == 0:
                continue
            att = phase_attainment(p, ps, prep.inputs, graph_steps[ps.index.to_numpy()])
            unrel = list(unreliable)
            cov = None if att.forward_coverage is UNSET else att.forward_coverage
            shape_fragment = bool(frag_steps & set(ps.index.tolist()))  # tracetype's test (no model config)
            if cov is not None and cov < 0.5 or shape_fragment:
                unrel += [k for k in FRAGMENT_UNRELIABLE if k not in unrel]
                if not shape_fragment:
                    frag_steps |= set(ps.index.tolist())
            if cov is not None and cov < 0.5:
                notes.note("fragment", f"{p}: the operators in the step windows account for {cov:.0%} of the model config's FLOPs: "
                           "the window holds part of a forward, so TPOT, MBU and the bound ratio cannot be read from it "
                           "(launch gaps and idle time still can)")
            if att.achieved_tbps and att.peak_tbps and att.achieved_tbps > att.peak_tbps and "achieved_tbps" not in unrel:
                notes.note("bandwidth_above_peak", f"{p}: achieved {att.achieved_tbps:.2f} TB/s exceeds the device peak {att.peak_tbps:.2f} TB/s: wrong peak, wrong model config, or a timing without synchronisation (S7)")
            wall = union_ns(ps["start_ns"].to_numpy(), ps["start_ns"].to_numpy() + ps["wall_ns"].to_numpy())
            ckey = (-1 if dev is None else int(dev), p)
            phases.append(phase_stats(p, dev, sub, len(ps), wall, tuple(unrel), att, own_ns=int(ps["own_ns"].sum()), psteps=ps,
                                      pre=_pre(waits, dev, p, len(sub), len(sub_all)), op_classes=classes.get(ckey),
                                      precision=prec.get(ckey), **kw))
        um = (sub_all["phase"] == "unknown").to_numpy()
        unk = sub_all[um]
        if len(unk):
            wall = int(unk["end_ns"].max() - unk["start_ns"].min())
            n_unknown = int((dev_steps["phase"] == "unknown").sum()) if len(dev_steps) else 0  # steps without a phase
            phases.append(phase_stats("unknown", dev, unk, n_unknown, wall, pre=_pre(waits, dev, "unknown", len(unk), len(sub_all)), **kw))
    return PhaseRows(phases, frozenset(frag_steps), tuple(notes.issues))


def _pre(waits: StepWaits, dev: int | None, phase: str, n_sub: int, n_all: int) -> tuple | None:
    """What the step waits already hold for a phase's activities on a device: all of them (the
    device's gaps), their sorted table (its gaps to compute), or nothing."""
    if dev is None:
        return None
    if n_sub == n_all and dev in waits.devices:
        return waits.devices[dev]
    pa = waits.phase_acts.get((dev, phase))
    return None if pa is None else (pa, None)


def _kernel_advice(kernels: pd.DataFrame | None, steps: pd.DataFrame, prep: AttainmentPrep) -> tuple[dict, dict]:
    """Per (device, phase): the kernel table's op classes (:func:`~diagnose.analyzers.oploss.op_classes`)
    and precision lever (:class:`~diagnose.model.Precision`)."""
    if kernels is None or len(kernels) == 0:
        return {}, {}
    peak, inp = prep.inputs.peak, prep.inputs
    per_phase: dict[tuple[int, str], int] = {}
    if len(steps) and "device_activity_count" in steps:
        for ph, devs in zip(steps["phase"].to_numpy(dtype=object), steps["device_activity_count"].to_numpy(dtype=object)):
            for d in (devs or {}):
                per_phase[(int(d), str(ph))] = per_phase.get((int(d), str(ph)), 0) + 1
    classes = op_class_table(kernels, peak, weight_roles(inp.spec, inp.tp), per_phase)
    prec = {k: Precision(**msgspec.structs.asdict(v)) for k, v in precision_summaries(kernels, peak).items()}
    return classes, prec


def _all_wall_ns(acts: pd.DataFrame, steps: pd.DataFrame) -> int:
    """End-to-end wall of everything on a device: from the first step start or GPU activity to
    the last completion (step end or GPU end); never shorter than a phase's summed step walls."""
    starts, ends = [], []
    if len(acts):
        starts.append(int(acts["start_ns"].min()))
        ends.append(int(acts["end_ns"].max()))
    if len(steps):
        starts.append(int(steps["start_ns"].min()))
        ends.append(int(steps["end_ns"].max()))
        ge = steps["gpu_end_ns"].to_numpy()
        ge = ge[ge != NO_TIME]
        if len(ge):
            ends.append(int(ge.max()))
    return max(ends) - min(starts) if starts else 0


def _cpu_span_ns(trace: Trace) -> int:
    lo, hi = None, None
    for f in (trace.cpu_ops, trace.runtime, trace.annotations):
        if len(f):
            a, b = int(f["start_ns"].min()), int(f["end_ns"].max())
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
    return 0 if lo is None else hi - lo
