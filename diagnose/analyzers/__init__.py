"""Analyzers: functions from a normalized :class:`~diagnose.trace.model.Trace` to the report.

Each analyzer module has one function with explicit inputs (the trace, options, results of
analyzers before it) and one frozen result; :func:`analyze` wires them, in the order of
:data:`ANALYZERS`, and assembles the :class:`~diagnose.model.Report`. Nothing is shared
through a blackboard: what an analyzer needs is an argument, what it gives is its return
value (quality notes included, merged once per code by :class:`~diagnose.analyzers.base.Notes`).
Each module also declares the findings its numbers feed (``FINDINGS``); the findings catalog
(:mod:`diagnose.catalog`) is built from these declarations.

Rules are not evaluated here: :func:`diagnose.pipeline.attach_verdicts` does that, in one place.

Adding an analyzer: write ``def my_section(<inputs>) -> MyResult`` in a module of this
package (no I/O: the trace layer reads files), add the module to :data:`ANALYZERS`, call it
in :func:`analyze` where its inputs exist, and put what it reports into a field of
:class:`~diagnose.model.Report` (see :mod:`diagnose.model` for adding a section).
"""
from __future__ import annotations


import numpy as np

from diagnose.analyzers import (
    activities,
    attainment,
    capturehint,
    categories,
    collectives,
    critpath,
    depgraph,
    kernels,
    launches,
    latency,
    layers,
    oploss,
    phases,
    phasestats,
    precision,
    smallkernels,
    timeline,
    tracetype,
    waits,
)
from diagnose.analyzers.base import Finding, Notes
from diagnose.analyzers.result import SCHEMA_VERSION, Analysis, report_steps, step_records, step_structs
from diagnose.model import QualityIssue, Report, Source
from diagnose.options import AnalysisOptions
from diagnose.trace.capture import CaptureMapping, load_capture_mapping
from diagnose.trace.model import Trace

#: The analyzer modules, in the order :func:`analyze` runs them (categories and timeline are
#: libraries the others call: phasestats and activities).
ANALYZERS = (phases, launches, activities, waits, latency, attainment, tracetype, collectives, kernels, capturehint, precision,
             oploss, smallkernels, phasestats, critpath, layers, timeline, categories)

__all__ = ["ANALYZERS", "Analysis", "AnalysisOptions", "Finding", "SCHEMA_VERSION", "analyze", "report_steps",
           "step_records"]


def analyze(trace: Trace, options: AnalysisOptions | None = None, capture: CaptureMapping | None = None) -> Analysis:
    """Run every analyzer on ``trace`` and assemble the report (without verdicts).

    Args:
        trace: the normalized trace.
        options: analysis options (model config, peaks, shapes, phase regexes...).
        capture: the graph-capture mapping (:func:`diagnose.trace.capture.load_capture_mapping`);
            None: read from ``options.capture_trace`` when given.

    Raises:
        DiagnoseError: invalid options (e.g. a bad ``--phase-regex``, an unreadable
            ``--model-config``, an unknown ``--gpu``).
        TraceFormatError: the capture trace cannot be read.
    """
    opts = options or AnalysisOptions()
    if capture is None and opts.capture_trace:
        capture = load_capture_mapping(opts.capture_trace)
    notes = Notes(trace.quality)
    links = launches.launch_links(trace)
    split = phases.split_steps(trace, opts.phase_regex, opts.batch, links.frame)
    notes.extend(split.notes)
    notes.extend(links.notes)
    acts = activities.activity_table(trace, split, links.frame)
    notes.extend(acts.notes)
    w = waits.step_waits(trace, acts.frame, split.steps, split.containers)
    steps = latency.mark_step_quality(latency.step_table(w.steps, acts.frame), links.orphan_launch_ns, notes)
    prep = attainment.prepare_attainment(trace, opts, steps, acts.frame, acts.devices)
    notes.extend(prep.notes)
    steps = prep.steps
    kind = tracetype.classify_trace(trace, steps, acts.frame, prep.inputs.spec is not None, split.workload.code)
    notes.extend(kind.notes)
    coll = collectives.collective_split(trace, acts.frame)
    graph_note = next((q for q in notes.issues if q.code == "graph_kernels_no_launch"), None)
    kt = kernels.kernel_section(trace, acts.frame, steps, prep.inputs.peak, capture, prep.moe, graph_note)
    for q in kt.notes:
        notes.replace(q)
    if capture is None:
        notes.extend(capturehint.capture_suggestion(trace, kt.table, kernels.SHAPES_UNKNOWN[kernels.ORIGIN_GRAPH_NO_CAPTURE]))
    rows = phasestats.phase_rows(trace, acts.frame, steps, w, acts.devices, prep, acts.unreliable, kind.fragment_steps, coll,
                                 kt.table)
    notes.extend(rows.notes)
    if rows.fragment_steps:  # a fragment's time is not a step's: TTFT/TPOT/ITL from the whole steps only
        lat = latency.latency_findings(steps.drop(index=sorted(rows.fragment_steps)), phasestats.TPOT_FRAGMENTS)
    else:
        lat = latency.latency_findings(steps)
    graph = depgraph.build_graph(trace, acts.frame)
    # one definition of causes: the path and the what-if read the gap classifier's host index
    # (first calls per shape, first launches) and the collectives' waits for peers
    graph.cache["host_causes"] = w.host
    graph.cache["collective_wait_ns"] = coll.wait_ns[graph.row] if len(coll.wait_ns) else np.zeros(graph.n, np.int64)
    paths = critpath.step_paths(graph, steps, w.t0_ns)
    lay = layers.layer_section(trace, acts.frame, prep.inputs.spec, kt.per_kernel)
    shown = report_steps(steps)
    report = Report(
        schema_version=SCHEMA_VERSION,
        source=Source(path=trace.source_path, format=trace.source_format),
        partial=trace.partial,
        devices=acts.devices,
        phases=rows.rows,
        latency=lat,
        steps=step_structs(shown, {i: critpath.path_record(p, w.t0_ns) for i, p in paths.steps.items()}),
        quality=[QualityIssue(code=q.code, message=q.message, **({} if q.count is None else {"count": q.count}))
                 for q in notes.issues],
        launches=acts.launches,
        gpu=prep.gpu,
        model=prep.model,
        kernel_table=kt.rows,
        critical_path=critpath.path_section(paths, steps, w.t0_ns),
        coverage=lay.coverage,
        layer_segmentation=lay.segmentation,
        layers=lay.rows,
        **({} if kt.capture is None else {"capture": kt.capture}),
    )
    return Analysis(report=report, trace=trace, activities=acts.frame, steps=shown, kernel_frame=kt.table,
                    host_index=w.host, t0_ns=w.t0_ns, paths=paths, layer_frame=lay.frame)
