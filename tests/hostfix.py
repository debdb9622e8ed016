"""Planted host-activity traces (one per host cause, each with a near-miss) and variants of real
traces (python frames renamed or dropped), for tests/test_host_causes.py.

Times in µs, as Kineto writes them. Every trace has one host thread (pid/tid 100: python
frames, CPU ops, user ranges and runtime calls) and one GPU stream; each kernel starts 1 µs
after its launch call returns, or when the GPU is free.
"""
from __future__ import annotations

import json
from pathlib import Path

from conftest import KinetoBuilder

DECODE = "diagnose:decode[bs=8]"


class HostTrace:
    """A :class:`KinetoBuilder` plus launch bookkeeping (correlation ids, when the GPU is free)."""

    def __init__(self, **top) -> None:
        self.b = KinetoBuilder(**top)
        self.corr = 5000
        self.ext = 90000
        self.gpu_free = 0.0

    def launch(self, kname: str, ts: float, dur: float = 5.0, kdur: float = 2.0, api: str = "cudaLaunchKernel",
               stream: int = 7, **kargs) -> float:
        """A launch call at ``ts`` and its kernel; returns the kernel's end."""
        self.corr += 1
        self.b.runtime(api, ts, dur, self.corr)
        ks = max(ts + dur + 1.0, self.gpu_free)
        self.b.kernel(kname, ks, kdur, corr=self.corr, stream=stream, **kargs)
        self.gpu_free = ks + kdur
        return ks + kdur

    def graph(self, ts: float, n: int, kdur: float, dur: float = 10.0) -> float:
        """One cudaGraphLaunch at ``ts`` replaying ``n`` kernels of ``kdur`` back to back."""
        self.corr += 1
        self.b.runtime("cudaGraphLaunch", ts, dur, self.corr)
        k0 = max(ts + dur + 1.0, self.gpu_free)
        for i in range(n):
            self.b.kernel(f"graph_kernel_{i % 7}", k0 + i * kdur, kdur, corr=self.corr)
        self.gpu_free = k0 + n * kdur
        return self.gpu_free

    def op(self, name: str, ts: float, dur: float, dims=None) -> None:
        self.ext += 1
        args = {"External id": self.ext}
        if dims is not None:
            args["Input Dims"] = dims
        self.b.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": dur,
                              "args": args})

    def write(self, path: Path) -> Path:
        return self.b.write(path)


def eager_steps(h: HostTrace, t: float = 0.0, steps: int = 3, kernels: int = 20, op_us: float = 15.0, work_us: float = 0.0,
                work_op: str = "aten::bmm", frame: str = "llama.py(374): forward", marker: str = DECODE,
                entry: bool = False, guard_us: float = 0.0) -> float:
    """Eager decode steps: per kernel an ``aten::add`` of ``op_us`` that launches it at its end,
    preceded by ``work_us`` of ``work_op`` that launches nothing (0: none); all under the python
    frame ``frame`` (and the torch.compile entry when ``entry``; a ``guard_us`` "TorchDynamo
    Cache Lookup" at its start), inside a step marker. Returns the time the last step ends."""
    for _ in range(steps):
        s0 = t
        cur = t + 3.0
        if guard_us:
            h.b.annotation("TorchDynamo Cache Lookup", cur, guard_us)
            cur += guard_us + 1.0
        for k in range(kernels):
            if work_us:
                h.op(work_op, cur, work_us)
                cur += work_us
            h.op("aten::add", cur, op_us, [[8, 4096], [8, 4096]])
            h.launch("elementwise_add_kernel", cur + op_us - 6.0, 5.0)
            cur += op_us
        end = cur + 3.0
        h.b.annotation(marker, s0, end - s0)
        if entry:
            h.b.python_frame("torch/_dynamo/eval_frame.py(838): _fn", s0 + 1.0, end - s0 - 2.0)
        h.b.python_frame(frame, s0 + 2.0, end - s0 - 4.0)
        t = end + 1.0
    return t


def guard_steps(h: HostTrace, steps: int = 10, guard_ms: float = 27.5, replay_ms: float = 17.7, kernels: int = 81,
                frame: str = "llama.py(374): forward") -> None:
    """Decode steps that replay one CUDA graph each, entered through torch.compile: the host
    spends ``guard_ms`` under the dynamo entry in ``frame`` (guard evaluation, nothing
    launched), launches the graph, then waits for it (cudaStreamSynchronize)."""
    t = 0.0
    g = guard_ms * 1000.0
    for _ in range(steps):
        s0 = t
        h.b.python_frame("torch/_dynamo/eval_frame.py(838): _fn", s0 + 5.0, g)
        h.b.python_frame(frame, s0 + 10.0, g - 10.0)
        end_gpu = h.graph(s0 + 5.0 + g + 2.0, kernels, replay_ms * 1000.0 / kernels)
        sync0 = s0 + 5.0 + g + 15.0
        h.b.runtime("cudaStreamSynchronize", sync0, end_gpu - sync0 + 2.0, -1)
        end = end_gpu + 5.0
        h.b.annotation(DECODE, s0, end - s0)
        t = end + 1.0


def graph_prep_steps(h: HostTrace, steps: int = 3, prep_kernels: int = 20) -> None:
    """Graph-replayed decode steps whose host launches small preparation kernels one by one
    before the replay (launch gaps on a step already captured)."""
    t = 0.0
    for _ in range(steps):
        s0 = t
        cur = t + 3.0
        for _k in range(prep_kernels):
            h.op("aten::copy_", cur, 15.0)
            h.launch("prep_copy_kernel", cur + 9.0, 5.0)
            cur += 15.0
        end_gpu = h.graph(cur + 2.0, 40, 25.0)
        h.b.runtime("cudaStreamSynchronize", cur + 20.0, end_gpu - cur - 18.0, -1)
        end = end_gpu + 5.0
        h.b.annotation(DECODE, s0, end - s0)
        h.b.python_frame("runner.py(88): replay_prepare", s0 + 1.0, cur - s0)
        t = end + 1.0


def first_call_steps(h: HostTrace, first_us: float, later_us: float = 60.0, steps: int = 3) -> None:
    """Eager steps whose GEMM (``aten::addmm`` of one shape, launching one kernel at its end)
    takes ``first_us`` on its first call and ``later_us`` afterwards, between 20 small launches."""
    t = 0.0
    dims = [[8, 4096], [4096, 4096], [8, 4096]]
    for i in range(steps):
        s0 = t
        cur = t + 3.0
        for k in range(20):
            if k == 5:
                d = first_us if i == 0 else later_us
                h.op("aten::addmm", cur, d, dims)
                h.launch("gemm_kernel_128x64", cur + d - 6.0, 5.0, kdur=20.0)
                cur += d
            h.op("aten::add", cur, 15.0, [[8, 4096], [8, 4096]])
            h.launch("elementwise_add_kernel", cur + 9.0, 5.0)
            cur += 15.0
        end = cur + 3.0
        h.b.annotation(DECODE, s0, end - s0)
        h.b.python_frame("llama.py(374): forward", s0 + 1.0, end - s0 - 2.0)
        t = end + 1.0


def tp2_allreduce_rank(h: HostTrace, durations_ms: list[float], elements: int = 1_048_576, same_size: bool = True) -> None:
    """A TP=2 rank: per decode step 20 small kernels then one all-reduce (``nccl:all_reduce``
    of ``elements`` floats, the kernel launched by it and linked by its External id) whose
    duration is taken from ``durations_ms``; with ``same_size`` False every call has another size."""
    t = 0.0
    for i, d in enumerate(durations_ms):
        s0 = t
        cur = t + 3.0
        for _k in range(20):
            h.op("aten::add", cur, 15.0)
            h.launch("elementwise_add_kernel", cur + 9.0, 5.0, kdur=10.0)
            cur += 15.0
        n = elements if same_size else elements + 1024 * i
        h.op("nccl:all_reduce", cur, 20.0, [[n]])
        ext = h.ext
        end_gpu = h.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", cur + 10.0, 5.0, kdur=d * 1000.0, **{"External id": ext})
        h.b.runtime("cudaStreamSynchronize", cur + 30.0, end_gpu - cur - 28.0, -1)
        end = end_gpu + 5.0
        h.b.annotation(DECODE, s0, end - s0)
        t = end + 1.0


# ---------------------------------------------------------------- variants of real traces


def load_doc(path: Path) -> dict:
    import gzip

    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def rename_frames(doc: dict, old: str, new: str) -> dict:
    """``doc`` with ``old`` replaced by ``new`` in every python frame's name (``llama.py`` ->
    ``qwen.py``: a rule must not depend on one model's file names)."""
    evs = [dict(e, name=e["name"].replace(old, new)) if e.get("cat") == "python_function" else e for e in doc["traceEvents"]]
    return {**doc, "traceEvents": evs}


def drop_python(doc: dict) -> dict:
    """``doc`` without python frames (a trace profiled without with_stack)."""
    return {**doc, "traceEvents": [e for e in doc["traceEvents"] if e.get("cat") != "python_function"]}


def write_doc(doc: dict, path: Path) -> Path:
    path.write_text(json.dumps(doc))
    return path
