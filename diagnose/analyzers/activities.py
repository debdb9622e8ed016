"""The GPU activity table every later analyzer reads, and the device list.

:func:`activity_table` gives :class:`Activities`: ``trace.gpu`` plus ``category``/
``category_id`` (kernel categories, :mod:`diagnose.analyzers.categories`), ``name_id`` (names
factorized once), the launch columns (``launch_start_ns``, ``launch_end_ns``, ``launch_kind``,
``graph_followup``, ``launch_tid``, ``launch_row``), ``step`` (row of the step table, -1 none) and ``phase``;
the devices with GPU activity, the report's ``launches`` section and, when graph coverage is
low, the names of the numbers that become unreliable.
"""
from __future__ import annotations


import msgspec
import numpy as np
import pandas as pd

from diagnose.analyzers.base import Notes, declared
from diagnose.analyzers.categories import CATEGORY_NAMES, category_ids
from diagnose.analyzers.launches import GRAPH_COVERAGE_MIN, launch_stats
from diagnose.analyzers.phases import StepSplit, assign_steps
from diagnose.model import Device, Launches
from diagnose.trace.model import NO_TIME, QualityIssue, Trace, factorize

FINDINGS = declared("activities")


class Activities(msgspec.Struct, frozen=True):
    """The GPU activity table and what it says about the trace.

    Attributes:
        frame: ``trace.gpu`` plus category, category_id, name_id, the launch columns, step
            (row of the step table, -1 none) and phase.
        devices: the devices with GPU activity.
        launches: the report's ``launches`` section.
        unreliable: names of phase numbers not to trust (low graph coverage).
        notes: graph_coverage_low, device_id_remapped.
    """

    frame: pd.DataFrame
    devices: list[Device]
    launches: Launches
    unreliable: tuple[str, ...] = ()
    notes: tuple[QualityIssue, ...] = ()


def activity_table(trace: Trace, split: StepSplit, links: pd.DataFrame) -> Activities:
    """Join the launch links (``links``: :attr:`LaunchLinks.frame`), categories, steps and
    phases (a step's, else the phase of the container marker it was launched in) onto
    ``trace.gpu``."""
    steps, launches = split.steps, links
    notes = Notes()
    gpu = trace.gpu
    step_idx = assign_steps(trace, steps, launches)
    name_id, names = factorize(gpu["name"])
    category_id = category_ids(gpu, name_id, names)
    g = gpu.assign(  # object columns stay object (no per-row conversion to a string dtype)
        category=pd.Series(CATEGORY_NAMES[category_id], index=gpu.index, dtype=object),
        category_id=category_id,
        name_id=name_id,
        launch_end_ns=launches["launch_end_ns"].to_numpy(),
        launch_start_ns=launches["launch_start_ns"].to_numpy(),
        launch_kind=pd.Series(launches["launch_kind"].to_numpy(dtype=object), index=gpu.index, dtype=object),
        graph_followup=launches["graph_followup"].to_numpy(),
        launch_tid=launches["launch_tid"].to_numpy(),
        launch_row=launches["launch_row"].to_numpy(),
        clock_skewed=launches["clock_skewed"].to_numpy() if "clock_skewed" in launches else np.zeros(len(gpu), dtype=bool),
        step=step_idx,
    )
    step_phase = steps["phase"].to_numpy() if len(steps) else np.array([], dtype=object)
    phase = np.where(step_idx >= 0, step_phase[np.clip(step_idx, 0, None)] if len(steps) else "unknown", "unknown").astype(object)
    containers = split.containers
    if containers is not None and len(containers) and len(g):
        # launched inside an outer marker but in none of its steps: the container's phase
        t = launches["launch_start_ns"].to_numpy()
        for cs, ce, cph in zip(containers["start_ns"], containers["end_ns"], containers["phase"]):
            m = (step_idx < 0) & (t >= cs) & (t <= ce) & (t != NO_TIME)
            phase[m] = cph
    g["phase"] = pd.Series(phase, index=g.index, dtype=object)

    info = launch_stats(trace, g)
    cov = info.graph_coverage
    unreliable: tuple[str, ...] = ()
    if cov is not None and cov < GRAPH_COVERAGE_MIN:
        unreliable = ("gpu_idle_share", "launch_gap_share")
        notes.note("graph_coverage_low",
                   f"only {info.graph_launches_with_activity} of {info.graph_launches} graph launches have GPU activity in the trace "
                   f"(coverage {cov:.0%}): replayed kernels are missing, so idle and launch-gap numbers are unreliable")

    devices_present = sorted(int(d) for d in gpu["device"].unique()) if len(gpu) else []
    dev_list = [Device(id=d, name=trace.device_name(d)) for d in devices_present]
    listed = {d.id for d in trace.devices}
    if len(trace.devices) == 1 and len(dev_list) == 1 and dev_list[0].id not in listed:
        # One visible GPU whose activities carry the host's device index (ROCm/HIP_VISIBLE_DEVICES).
        dev_list[0] = Device(id=dev_list[0].id, name=trace.devices[0].name)
        notes.note("device_id_remapped", f"activities use device id {dev_list[0].id} but deviceProperties lists only id {trace.devices[0].id}: taken as the same GPU")
    return Activities(g, dev_list, info, unreliable, tuple(notes.issues))
