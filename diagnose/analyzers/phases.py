"""Steps and their phase (prefill / decode / mixed / unknown), from every evidence in order
of trust (README "Steps"); ``steps[].evidence`` says which gave each step:

1. ``marker``: step markers (record_function / NVTX ranges) matched by the grammars of
   ``diagnose/data/step_markers.yaml`` (this project's collector, SGLang ``step[...]``, vLLM
   ``execute_...``, ATOM, TensorRT-LLM, param benchmarks) and by ``--phase-regex``, which also
   matches python frames (:func:`diagnose.analyzers.pyframes.user_frame_rows`). Nested
   markers collapse to the innermost (SGLang wraps ``step[EXTEND ...]`` inside a vLLM-style
   ``execute_...`` range); the outer one is a container.
2. ``profiler_step``: ``ProfilerStep#N`` ranges (PyTorch <= 1.9: Operator events).
3. ``python_frame``: engine step entry points in ``with_stack`` frames
   (:mod:`diagnose.analyzers.pyframes`).
4. ``structure``: repeating bursts of GPU work (:mod:`diagnose.analyzers.structure`), quality
   code ``steps_from_structure``.
5. ``shapes``: the whole trace as one window, for a trace whose shapes tell its phase (or a
   single encoder / vision forward).

A candidate that holds a graph capture (a ``capture_N_MODE`` range or a stream-capture call)
is never a step: nothing ran. Steps without a phase from their marker get one from what they
show (:mod:`diagnose.analyzers.stepphase`) unless the trace is not LLM serving
(:mod:`diagnose.analyzers.workload`); when nothing tells, the phase is ``unknown``: we never
guess. When no step is found at all, the quality code ``no_steps`` says what to capture.

A GPU activity belongs to the step whose CPU range contains the start of its host launch
call (correlation id; any thread); activities without a launch call stay outside every step.
Steps found on the GPU timeline only (GPU-side annotations, structure on a trace without
launches) hold the activities that start inside them.
"""
from __future__ import annotations

import re
from functools import lru_cache

import msgspec
import numpy as np
import pandas as pd

from diagnose.analyzers import pyframes, stepphase, structure, workload
from diagnose.analyzers.base import Notes
from diagnose.analyzers.stepphase import _is_int_list, shape_votes  # noqa: F401 - re-exported
from diagnose.errors import DiagnoseError
from diagnose.patterns import check_pattern, clip
from diagnose.trace.model import NO_TIME, QualityIssue, Trace, factorize

from diagnose.vocab import STEP_PHASES as PHASES  # noqa: E402


class Grammar(msgspec.Struct, frozen=True):
    name: str
    pattern: re.Pattern
    phase_map: dict | None = None
    fixed_phase: str | None = None
    evidence: str = "marker"


@lru_cache(maxsize=1)
def builtin_grammars() -> tuple[Grammar, ...]:
    from diagnose.tables import marker_table

    return tuple(Grammar(g.name, re.compile(g.pattern), g.phase_map, evidence=g.evidence) for g in marker_table().grammars)


@lru_cache(maxsize=1)
def _not_steps() -> tuple[re.Pattern, ...]:
    from diagnose.tables import marker_table

    return tuple(re.compile(r.pattern) for r in marker_table().not_steps)


def user_grammars(specs: tuple[str, ...] | list[str]) -> list[Grammar]:
    """Parse ``--phase PHASE=REGEX`` options.

    Raises:
        DiagnoseError: malformed option, unknown phase, or invalid regex.
    """
    out = []
    for spec in specs or ():
        if "=" not in spec:
            raise DiagnoseError(f"--phase expects PHASE=REGEX (PHASE one of {', '.join(PHASES)}), got {spec!r}")
        phase, rx = spec.split("=", 1)
        phase = phase.strip().lower()
        if not rx.strip():
            raise DiagnoseError(f"--phase {phase}: empty regex (it would match every range)")
        if phase not in PHASES:
            raise DiagnoseError(f"--phase: unknown phase {phase!r}; use one of {', '.join(PHASES)}")
        pat = check_pattern(rx, f"--phase-regex {phase}")  # matched on a bounded prefix of each name (match_marker)
        out.append(Grammar(f"user:{phase}:{len(out)}", pat, fixed_phase=phase))
    return out


def _int(gd: dict, key: str) -> int | None:
    v = gd.get(key)
    return int(v) if v is not None else None


def match_marker(name: str, grammars) -> dict | None:
    """Return {phase, evidence, grammar, batch, tokens, context, kv_tokens, prefill_requests,
    decode_requests} for a step-marker name, else None (no grammar matches, or the marker is
    not a compute step: SGLang IDLE, zero requests). Phase ``unknown`` when the grammar says
    none (``ProfilerStep#N``, benchmark ranges)."""
    name = clip(name)  # user regexes may backtrack: the work per name stays bounded
    for g in grammars:
        m = g.pattern.search(name)
        if not m:
            continue
        gd = m.groupdict()
        batch = _int(gd, "batch")
        if g.fixed_phase:
            phase = g.fixed_phase
        elif gd.get("n_prefill") is not None:
            npf, ndc = int(gd["n_prefill"]), int(gd["n_decode"])
            if npf > 0 and ndc > 0:
                phase = "mixed"
            elif npf > 0:
                phase = "prefill"
            elif ndc > 0:
                phase = "decode"
            else:
                return None
            if batch is None:
                batch = npf + ndc
        elif gd.get("phase"):
            phase = gd["phase"]
        elif gd.get("mode"):
            phase = (g.phase_map or {}).get(gd["mode"])
            if phase is None:
                return None  # e.g. SGLang IDLE steps
        else:
            phase = "unknown"
        context = _int(gd, "context")
        kv_tokens = _int(gd, "kv_tokens")
        if kv_tokens is None and phase == "decode" and batch and context:
            kv_tokens = batch * context
        tokens = _int(gd, "tokens")
        ptok, dtok = _int(gd, "prefill_tokens"), _int(gd, "decode_tokens")
        if tokens is None and ptok is not None and dtok is not None:
            tokens = ptok + dtok
        npf = _int(gd, "n_prefill")
        ndc = _int(gd, "n_decode")
        if npf is None:  # markers without request counts: the whole batch is of the step's phase
            npf = batch if phase == "prefill" else 0 if phase == "decode" else None
            ndc = batch if phase == "decode" else 0 if phase == "prefill" else None
        return {
            "phase": phase,
            "evidence": g.evidence,
            "grammar": g.name,
            "batch": batch,
            "tokens": tokens,
            "context": context,
            "kv_tokens": kv_tokens,
            "prefill_requests": npf,
            "decode_requests": ndc,
        }
    return None


STEP_COLUMNS = ["name", "phase", "evidence", "grammar", "start_ns", "end_ns", "batch", "tokens", "context", "kv_tokens",
                "prefill_requests", "decode_requests", "scope", "anchor_ns"]
_FILL = ("batch", "tokens", "context", "kv_tokens", "prefill_requests", "decode_requests")
CONTAINER_COLUMNS = ["name", "phase", "start_ns", "end_ns"]


def _range_rows(frame: pd.DataFrame, grammars, scope: str) -> list[dict]:
    """Rows for the ranges of ``frame`` whose name a grammar matches (each distinct name
    matched once: nsys exports carry millions of repeated NVTX names)."""
    if len(frame) == 0 or not grammars:
        return []
    codes, uniques = factorize(frame["name"])
    matched = [match_marker(str(u), grammars) for u in uniques]
    hit = np.array([m is not None for m in matched] + [False], dtype=bool)
    if not hit.any():
        return []
    sel = np.nonzero(hit[codes])[0]
    starts = frame["start_ns"].to_numpy()[sel]
    ends = frame["end_ns"].to_numpy()[sel]
    return [{"name": str(uniques[c]), "start_ns": int(s_), "end_ns": int(e_), "scope": scope, **matched[c]}
            for c, s_, e_ in zip(codes[sel], starts, ends)]


def marker_rows(trace: Trace, grammars) -> list[dict]:
    """Candidate step rows from CPU annotations; in a trace without any, from operator events
    (PyTorch <= 1.9 wrote record_function ranges as Operator events); without a match, from
    GPU-side annotations (CPU markers win: GPU-side copies of the same ranges are not extra steps)."""
    ann = trace.annotations
    cpu = ann[ann["scope"] == "cpu"] if len(ann) else ann
    rows = _range_rows(cpu, grammars, "cpu")
    if not rows and len(cpu) == 0:  # PyTorch <= 1.9: no user_annotation category at all
        rows = _range_rows(trace.cpu_ops, grammars, "cpu")
    if not rows and len(ann):
        rows = _range_rows(ann[ann["scope"] == "gpu"], grammars, "gpu")
    return rows


def nest(rows: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(steps, containers) from candidate rows: one step per innermost row, sorted by start.

    An outer row that contains steps is a *container*: its numbers (batch, tokens...) fill
    what the inner row lacks, GPU work launched in it but in no inner step keeps the
    container's phase, and the first step of a container waits from the container's start
    (``anchor_ns``: where the step's waits before its GPU span begin).

    Returns:
        (steps, containers). steps columns: :data:`STEP_COLUMNS` (start_ns, end_ns: the CPU
        range, or the GPU range for GPU-scoped steps; batch...decode_requests: nullable ints;
        scope; anchor_ns). containers: name, phase, start_ns, end_ns.
    """
    if not rows:
        return pd.DataFrame(columns=STEP_COLUMNS), pd.DataFrame(columns=CONTAINER_COLUMNS)
    rows = sorted(rows, key=lambda r: (r["start_ns"], -r["end_ns"]))
    stack: list[dict] = []
    for r in rows:
        while stack and not (r["start_ns"] >= stack[-1]["start_ns"] and r["end_ns"] <= stack[-1]["end_ns"]):
            stack.pop()
        r["_parents"] = list(stack)
        r["_children"] = 0
        if stack:
            stack[-1]["_children"] += 1
        stack.append(r)
    steps, containers = [], []
    for r in rows:
        if r["_children"]:
            containers.append({k: r[k] for k in CONTAINER_COLUMNS})
            continue
        r["anchor_ns"] = r["start_ns"]
        for outer in reversed(r["_parents"]):
            for k in _FILL:
                if r.get(k) is None and outer.get(k) is not None:
                    r[k] = outer[k]
            if not outer.get("_anchored"):  # the first step of a container waits from its start
                outer["_anchored"] = True
                r["anchor_ns"] = min(r["anchor_ns"], outer["start_ns"])
        steps.append(r)
    return pd.DataFrame(steps)[STEP_COLUMNS], pd.DataFrame(containers, columns=CONTAINER_COLUMNS)


def find_steps(trace: Trace, extra: list[Grammar] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Step table from step markers alone (``extra``: user grammars, tried first): :func:`nest`
    of :func:`marker_rows` with the builtin marker grammars (not ``ProfilerStep#N``)."""
    grammars = list(extra or []) + [g for g in builtin_grammars() if g.evidence == "marker"]
    return nest(marker_rows(trace, grammars))


def _capture_windows(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of graph-capture passes: ``capture_N_MODE`` ranges, and each stream-capture
    begin call to the next end call (a begin without an end: to the trace's end)."""
    ws, we = [], []
    ann = trace.annotations
    if len(ann):
        codes, uniq = factorize(ann["name"])
        hit = np.array([any(rx.search(clip(str(u))) for rx in _not_steps()) for u in uniq] + [False], dtype=bool)[codes]
        ws.append(ann["start_ns"].to_numpy()[hit])
        we.append(ann["end_ns"].to_numpy()[hit])
    rt = trace.runtime
    if len(rt):
        codes, uniq = factorize(rt["name"])
        kind = np.array([1 if "StreamBeginCapture" in str(u) else 2 if "StreamEndCapture" in str(u) else 0 for u in uniq] + [0],
                        dtype=np.int8)[codes]
        b = np.sort(rt["start_ns"].to_numpy()[kind == 1])
        e = np.sort(rt["end_ns"].to_numpy()[kind == 2])
        if len(b):
            nxt = np.searchsorted(e, b, side="left")
            last = int(rt["end_ns"].max())
            ws.append(b)
            we.append(np.where(nxt < len(e), e[np.minimum(nxt, len(e) - 1)], last) if len(e) else np.full(len(b), last))
    if not ws:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(ws).astype(np.int64), np.concatenate(we).astype(np.int64)


def _drop_capture(rows: list[dict], capture: tuple[np.ndarray, np.ndarray]) -> list[dict]:
    """The rows that overlap no graph-capture pass (nothing ran in one)."""
    ws, we = capture
    if len(ws) == 0:
        return rows
    return [r for r in rows if not ((ws <= r["end_ns"]) & (we >= r["start_ns"])).any()]


def assign_steps(trace: Trace, steps: pd.DataFrame, launches: pd.DataFrame) -> np.ndarray:
    """Step index (row of ``steps``) for each GPU activity, -1 when outside every step.

    CPU-scoped steps: the step containing the activity's launch start. GPU-scoped steps
    (markers only on the GPU timeline): the step containing the activity's start.
    """
    n = len(trace.gpu)
    idx = np.full(n, -1, dtype=np.int64)
    if n == 0 or len(steps) == 0:
        return idx
    st = steps["start_ns"].to_numpy(dtype=np.int64)
    en = steps["end_ns"].to_numpy(dtype=np.int64)
    gpu_scoped = (steps["scope"] == "gpu").all()
    t = trace.gpu["start_ns"].to_numpy() if gpu_scoped else launches["launch_start_ns"].to_numpy()
    valid = t != NO_TIME
    pos = np.searchsorted(st, t, side="right") - 1
    ok = valid & (pos >= 0)
    ok[ok] &= t[ok] <= en[pos[ok]]
    idx[ok] = pos[ok]
    return idx


FINDINGS = ()


class StepSplit(msgspec.Struct, frozen=True):
    """The step table and its containers, with the quality notes the split raised (how the
    steps were found, phases from shapes, no steps, what the trace runs, an unmatched regex)
    and the trace's kind (:class:`diagnose.analyzers.workload.Workload`)."""

    steps: pd.DataFrame
    containers: pd.DataFrame
    notes: tuple[QualityIssue, ...] = ()
    workload: workload.Workload = workload.Workload()
    structure: structure.Structure | None = None


def _compute_flags(gpu: pd.DataFrame, codes: np.ndarray, names: np.ndarray) -> np.ndarray:
    """Compute kernels of ``gpu``: GEMM, MoE, attention (not a KV-cache write: it does not
    make a step) and convolution."""
    from diagnose.analyzers.categories import CATEGORY_NAMES, category_ids

    cat = CATEGORY_NAMES[category_ids(gpu, codes, names)]
    conv = np.array([bool(structure.CONV_KERNEL.search(str(n))) for n in names] + [False], dtype=bool)[codes]
    kv = np.array([bool(workload.KV_WRITE_KERNEL.search(str(n))) for n in names] + [False], dtype=bool)[codes]
    kernel = (gpu["kind"] == "kernel").to_numpy()
    return kernel & (np.isin(cat, ("gemm", "moe")) | ((cat == "attention") & ~kv) | conv)


def structure_steps(trace: Trace, links: pd.DataFrame) -> tuple[pd.DataFrame, structure.Structure | None]:
    """Steps from the GPU structure (:func:`diagnose.analyzers.structure.detect`) of the device
    with the most GPU time. A step's range is the CPU range of its launches when every one of
    its activities has a launch call and the ranges do not overlap (scope ``cpu``: its waits
    before the GPU span are read like a marker's), else its GPU span (scope ``gpu``)."""
    g = trace.gpu
    if len(g) == 0:
        return pd.DataFrame(columns=STEP_COLUMNS), None
    dur = (g["end_ns"] - g["start_ns"]).to_numpy()
    dev_arr = g["device"].to_numpy()
    devs, inv = np.unique(dev_arr, return_inverse=True)
    dev = devs[int(np.argmax(np.bincount(inv, weights=dur)))]
    pos = np.flatnonzero(dev_arr == dev)
    pos = pos[np.argsort(g["start_ns"].to_numpy()[pos], kind="stable")]
    codes, names = factorize(g["name"])
    comp = _compute_flags(g, codes, names)
    st, en = g["start_ns"].to_numpy()[pos], g["end_ns"].to_numpy()[pos]
    found = structure.detect(st, en, codes[pos], comp[pos])
    bursts = found.steps
    if not bursts:
        return pd.DataFrame(columns=STEP_COLUMNS), found
    ls, le = links["launch_start_ns"].to_numpy()[pos], links["launch_end_ns"].to_numpy()[pos]
    cpu = [(int(ls[b.lo:b.hi].min()), int(le[b.lo:b.hi].max())) for b in bursts if (ls[b.lo:b.hi] != NO_TIME).all()]
    use_cpu = len(cpu) == len(bursts) and all(cpu[i][1] < cpu[i + 1][0] for i in range(len(cpu) - 1))
    rows = []
    for k, b in enumerate(bursts):
        s_, e_ = cpu[k] if use_cpu else (int(st[b.lo]), int(en[b.lo:b.hi].max()))
        rows.append({"name": f"structure step {k + 1}", "phase": "unknown", "evidence": "structure",
                     "grammar": f"structure:{found.method}", "start_ns": s_, "end_ns": e_, "scope": "cpu" if use_cpu else "gpu",
                     "batch": None, "tokens": None, "context": None, "kv_tokens": None, "prefill_requests": None,
                     "decode_requests": None, "anchor_ns": s_})
    return pd.DataFrame(rows, columns=STEP_COLUMNS), found


def _whole_window(trace: Trace) -> tuple[int, int] | None:
    frames = [f for f in (trace.cpu_ops, trace.runtime) if len(f)]
    if not frames:
        return None
    return min(int(f["start_ns"].min()) for f in frames), max(int(f["end_ns"].max()) for f in frames)


def shapes_step(trace: Trace, kind: workload.Workload, batch: int | None) -> tuple[pd.DataFrame, str]:
    """The whole trace as one step (evidence ``shapes``): for an LLM trace whose operator
    shapes tell one phase, or a single encoder / vision forward (phase ``unknown``). Returns
    (steps, the evidence that gave the phase)."""
    win = _whole_window(trace)
    if win is None:
        return pd.DataFrame(columns=STEP_COLUMNS), ""
    s_, e_ = win
    row = {"name": "trace", "phase": "unknown", "evidence": "shapes", "grammar": "shapes", "start_ns": s_, "end_ns": e_,
           "batch": None, "tokens": None, "context": None, "kv_tokens": None, "prefill_requests": None,
           "decode_requests": None, "scope": "cpu", "anchor_ns": s_}
    used = ""
    if kind.code in ("encoder_forward", "vision_forward"):
        pass
    elif kind.code is None:
        ph = stepphase.step_phase(trace, s_, e_, batch)
        if ph["phase"] == "unknown":
            return pd.DataFrame(columns=STEP_COLUMNS), ""
        row.update(phase=ph["phase"], batch=ph["batch"], tokens=ph["tokens"], context=ph["context"])
        used = ph["evidence"]
    else:
        return pd.DataFrame(columns=STEP_COLUMNS), ""
    return pd.DataFrame([row], columns=STEP_COLUMNS), used


def _engine(steps: pd.DataFrame) -> bool:
    """An engine step marker or engine frame gave steps (LLM serving evidence)."""
    if len(steps) == 0:
        return False
    gr = steps["grammar"].astype(str)
    ev = steps["evidence"].to_numpy()
    marker = (ev == "marker") & ~gr.str.startswith("user:").to_numpy() & (gr != "param-bench").to_numpy()
    frame = (ev == "python_frame") & gr.str.startswith("frame:").to_numpy() & (gr != "frame:nn-module").to_numpy()
    return bool((marker | frame).any())


def _resolve_phases(trace: Trace, steps: pd.DataFrame, batch: int | None) -> list[str]:
    """Fill the phase (and batch, tokens, context) of the ``unknown`` steps not set by the user
    from what they show (:func:`diagnose.analyzers.stepphase.step_phase`); returns the
    evidence used per resolved step."""
    used = []
    for i in np.flatnonzero((steps["phase"] == "unknown").to_numpy() & ~steps["grammar"].astype(str).str.startswith("user:").to_numpy()):
        r = steps.iloc[i]
        ph = stepphase.step_phase(trace, int(r["start_ns"]), int(r["end_ns"]), batch)
        if ph["phase"] == "unknown":
            continue
        steps.iat[i, steps.columns.get_loc("phase")] = ph["phase"]
        for k in ("batch", "tokens", "context"):
            if r[k] is None or (isinstance(r[k], float) and np.isnan(r[k])):
                steps.iat[i, steps.columns.get_loc(k)] = ph[k]
        used.append(ph["evidence"])
    return used


def _check_user_labels(trace: Trace, steps: pd.DataFrame, batch: int | None, notes: Notes) -> None:
    """Note ``--phase-regex`` labels that the steps' own evidence contradicts (the label is kept)."""
    user = steps["grammar"].astype(str).str.startswith("user:").to_numpy()
    if not user.any():
        return
    wrong = []
    for i in np.flatnonzero(user):
        r = steps.iloc[i]
        ph = stepphase.step_phase(trace, int(r["start_ns"]), int(r["end_ns"]), batch)
        if ph["phase"] not in ("unknown", r["phase"]):
            wrong.append(f"{r['phase']} where {ph['evidence']} say {ph['phase']}")
    if wrong:
        notes.note("phase_regex_contradicted", f"--phase-regex labels {len(wrong)} step(s) against their own evidence "
                   f"({'; '.join(sorted(set(wrong))[:3])}): the label is kept", len(wrong))


def _container_phases(steps: pd.DataFrame, containers: pd.DataFrame) -> pd.DataFrame:
    """A container without a phase of its own takes the one phase of the steps inside it."""
    if len(containers) == 0 or not (containers["phase"] == "unknown").any():
        return containers
    containers = containers.copy()
    st, en, ph = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy(), steps["phase"].to_numpy()
    for i in np.flatnonzero((containers["phase"] == "unknown").to_numpy()):
        c = containers.iloc[i]
        inside = set(ph[(st >= c["start_ns"]) & (en <= c["end_ns"])])
        if len(inside) == 1:
            containers.iat[i, containers.columns.get_loc("phase")] = inside.pop()
    return containers


NO_STEPS = ("no steps found (no marker, ProfilerStep, engine frame or repeated GPU structure): capture record_function "
            "step markers, or profile with with_stack=True")


def split_steps(trace: Trace, phase_regex: tuple[str, ...] | list[str] = (), batch: int | None = None,
                links: pd.DataFrame | None = None) -> StepSplit:
    """The step table from every evidence in order of trust (module docstring).

    Args:
        trace: the normalized trace.
        phase_regex: ``--phase-regex PHASE=REGEX`` options (markers, then python frames).
        batch: the ``--batch`` hint for flattened linears.
        links: the launch links (:func:`diagnose.analyzers.launches.link_launches`), computed
            when not given.

    Raises:
        DiagnoseError: a malformed ``--phase-regex``.
    """
    from diagnose.analyzers.launches import link_launches

    notes = Notes()
    if links is None:
        links = link_launches(trace)
    user = user_grammars(phase_regex)
    builtin = builtin_grammars()
    capture = _capture_windows(trace)
    rows = _drop_capture(marker_rows(trace, user + [g for g in builtin if g.evidence == "marker"]), capture)
    if user and not {r["grammar"] for r in rows} & {g.name for g in user}:
        rows += _drop_capture(pyframes.user_frame_rows(trace, user), capture)
    if not rows:
        rows = _drop_capture(marker_rows(trace, [g for g in builtin if g.evidence == "profiler_step"]), capture)
    if not rows:
        rows = _drop_capture(pyframes.engine_frame_rows(trace), capture)
    steps, containers = nest(rows)
    found = None
    if len(steps) == 0 and len(capture[0]) == 0:
        steps, found = structure_steps(trace, links)
    if user:
        used = set(steps["grammar"]) if len(steps) else set()
        unmatched = [spec for spec, g in zip(phase_regex, user) if g.name not in used]
        if unmatched:
            notes.note("phase_regex_unmatched", "--phase-regex " + ", ".join(unmatched) + " matched no range or python frame "
                       "in the trace (check the marker and frame names: diagnose run --format json lists the steps found)",
                       len(unmatched))
    ev = workload.trace_evidence(trace)
    n_rep = 0
    if len(steps) >= 2:
        codes, _ = factorize(trace.gpu["name"])
        idx = assign_steps(trace, steps, links)
        n_rep = len(steps) if workload.repeated_steps(idx, codes, len(steps)) else 0
    kind = workload.classify(ev, _engine(steps), n_rep)
    used: list[str] = []
    if len(steps) == 0 and len(capture[0]) == 0:
        steps, how = shapes_step(trace, kind, batch)
        used = [how] if how else []
    elif kind.code is None:
        used = _resolve_phases(trace, steps, batch)
        _check_user_labels(trace, steps, batch, notes)
    containers = _container_phases(steps, containers)
    _notes(notes, trace, steps, found, used, kind, len(capture[0]) > 0)
    return StepSplit(steps, containers, tuple(notes.issues), kind, found)


def _notes(notes: Notes, trace: Trace, steps: pd.DataFrame, found, used: list[str], kind: workload.Workload,
           capture: bool) -> None:
    """The split's quality notes: how the steps were found and phased, or that none were."""
    n = len(steps)
    if n == 0:
        if not capture:
            notes.note("no_steps", NO_STEPS)
    elif found is not None and (steps["evidence"] == "structure").any():
        notes.note("steps_from_structure", f"no step markers, ProfilerStep or engine python frames: {n} step(s) guessed from "
                   f"the GPU work's structure ({found.note}); capture record_function step markers (or with_stack=True) "
                   "for exact boundaries", n)
    if used:
        ev = sorted(set(steps["evidence"]))
        notes.note("phases_from_shapes", f"no serving-engine step markers: {len(used)} step(s) from "
                   f"{', '.join(e.replace('_', ' ') for e in ev)} evidence, their phase read from what they show "
                   f"({'; '.join(sorted(set(used)))})", len(used))
    if kind.code:
        notes.note(kind.code, kind.message)
    elif n:
        unknown = int((steps["phase"] == "unknown").sum())
        if unknown:
            notes.note("phase_unknown", f"{unknown} of {n} step(s) show nothing that tells prefill from decode (no phase in "
                       f"their marker; {_why_no_phase(trace)}): phase 'unknown' (use --phase-regex PHASE=REGEX)", unknown)


def _why_no_phase(trace: Trace) -> str:
    """What the phase evidence lacked: operators, their shapes, or a telling shape."""
    ops = trace.cpu_ops
    if len(ops) == 0:
        return "the trace holds no CPU operators, so no shapes to read a phase from"
    if ops["input_dims"].isna().all():
        return "its operators carry no 'Input Dims' shapes (torch.profiler records them with record_shapes=True)"
    return ("no aten::linear [B, S, H], attention shape, token/row count or engine path tells prefill from decode "
            "(2-D [tokens, hidden] linears need --batch)")
