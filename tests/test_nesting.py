"""diagnose.analyzers.nesting: the numpy parents and inherited attributes equal what the
stack walks they replace give, on random interval sets (nested, partly overlapping,
zero-length, equal starts, several threads) and on a real trace's host events."""
from __future__ import annotations

import numpy as np
import pytest

from diagnose.analyzers.nesting import nearest_marked, prev_exceeding
from tests.conftest import shared_trace


def _walk(s, e, pop) -> np.ndarray:
    """The stack walk: pop while ``pop(top, i)``; parent = top."""
    parent, stack = [-1] * len(s), []
    for i in range(len(s)):
        while stack and pop(stack[-1], i):
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    return np.array(parent, dtype=np.int64)


def _intervals(rng, n: int, spread: int):
    s = np.sort(rng.integers(0, 1000, n))
    e = s + rng.integers(0, spread, n)
    o = np.lexsort((-e, s))
    return s[o], e[o]


@pytest.mark.parametrize("seed", range(6))
def test_parents_equal_the_stack_walks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for n in (0, 1, 2, 3, 7, 64, 65, 300):
        for spread in (1, 5, 50, 2000):
            s, e = _intervals(rng, n, spread)
            sl, el = s.tolist(), e.tolist()
            # host events: the top no longer open at the event's start
            assert prev_exceeding(e, s).tolist() == _walk(sl, el, lambda t, i: el[t] <= sl[i]).tolist()
            # operators: the top ends before the event does
            assert prev_exceeding(e, e, strict=False).tolist() == _walk(sl, el, lambda t, i: el[t] < el[i]).tolist()
            # module frames of several threads, sorted by thread
            tid = np.sort(rng.integers(0, 3, n))
            o = np.lexsort((-e, s, tid))
            t2, s2, e2 = tid[o].tolist(), s[o].tolist(), e[o].tolist()
            want = _walk(s2, e2, lambda t, i: t2[t] != t2[i] or e2[t] < s2[i])
            assert prev_exceeding(e[o], s[o], strict=False, group=tid[o]).tolist() == want.tolist()


@pytest.mark.parametrize("rounds", [0, 1, 3, 64])
def test_parents_walked_back_then_searched_equal_the_stack_walk(rounds: int, monkeypatch) -> None:
    """Thresholds in order (host events' starts) are answered by walking back
    (``nesting._walk_parents``) for ``WALK_ROUNDS`` rounds, the rest by the block search:
    the stack walk's parents whatever the split, on random, deeply nested and flat events."""
    import diagnose.analyzers.nesting as nesting

    monkeypatch.setattr(nesting, "WALK_ROUNDS", rounds)
    rng = np.random.default_rng(11)
    sets = [_intervals(rng, n, spread) for n in (2, 40, 500) for spread in (3, 60, 5000)]
    k = np.arange(300, dtype=np.int64)
    sets.append((k, 1000 - k))  # one chain: each inside the previous
    sets.append((np.concatenate(([0], 10 + 3 * k)), np.concatenate(([10**6], 11 + 3 * k))))  # one wide parent, flat children
    for s, e in sets:
        sl, el = s.tolist(), e.tolist()
        assert prev_exceeding(e, s).tolist() == _walk(sl, el, lambda t, i: el[t] <= sl[i]).tolist()
        assert prev_exceeding(e, s, strict=False).tolist() == _walk(sl, el, lambda t, i: el[t] < sl[i]).tolist()


def test_parents_of_far_timestamps() -> None:
    """Times of a long trace in epoch ns (keys that overflow the flattened search: ranks)."""
    rng = np.random.default_rng(7)
    s, e = _intervals(rng, 200, 50)
    s, e = s * 10**15, e * 10**15
    sl, el = s.tolist(), e.tolist()
    assert prev_exceeding(e, s).tolist() == _walk(sl, el, lambda t, i: el[t] <= sl[i]).tolist()


def test_nearest_marked_walks_up_the_parents() -> None:
    rng = np.random.default_rng(3)
    s, e = _intervals(rng, 400, 300)
    parent = prev_exceeding(e, s)
    mark = rng.random(400) < 0.2
    want = []
    for i in range(400):
        j = i
        while j >= 0 and not mark[j]:
            j = int(parent[j])
        want.append(j)
    assert nearest_marked(parent, mark).tolist() == want
    assert nearest_marked(parent, np.zeros(400, dtype=bool)).tolist() == [-1] * 400


def test_parents_of_a_real_threads_ops() -> None:
    """The CPU ops of the HTA alexnet trace (one thread, 359 ops, 147 top-level by the raw
    events' ts and dur): the call tree's parents."""
    from diagnose.trace.load import load_trace

    tr = load_trace(str(shared_trace("hta/critical_path_alexnet/benchmark_result_2869224_1695835535_trace.json.gz")))
    ops = tr.cpu_ops
    tid = ops["tid"].to_numpy(np.int64)
    main = ops[tid == np.bincount(tid - tid.min()).argmax() + tid.min()]
    s = main["start_ns"].to_numpy(np.int64)
    e = main["end_ns"].to_numpy(np.int64)
    o = np.lexsort((-e, s))
    s, e = s[o], e[o]
    sl, el = s.tolist(), e.tolist()
    parent = prev_exceeding(e, s)
    assert parent.tolist() == _walk(sl, el, lambda t, i: el[t] <= sl[i]).tolist()
    assert len(s) == 359 and int((parent < 0).sum()) == 147


@pytest.mark.parametrize("seed", range(4))
def test_last_above_is_the_walk_up_the_parents(seed: int) -> None:
    """The operator open at a time: walking up the call tree from the last one started
    before it until one still runs then (what ``calltree.enclosing_ops`` did) gives
    :func:`last_above` of the ends, at the start's position, not strict."""
    from diagnose.analyzers.nesting import last_above

    rng = np.random.default_rng(seed)
    s, e = _intervals(rng, 300, 60)
    parent = _walk(s.tolist(), e.tolist(), lambda t, i: e[t] < e[i])
    t = rng.integers(-5, 1100, 400)
    c = np.searchsorted(s, t, side="right") - 1
    want = []
    for ci, ti in zip(c.tolist(), t.tolist()):
        while ci >= 0 and e[ci] < ti:
            ci = int(parent[ci])
        want.append(ci)
    got = last_above(e, np.searchsorted(s, t, side="right"), t, strict=False)
    assert got.tolist() == want
    assert last_above(e, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)).tolist() == []


@pytest.mark.parametrize("seed", range(4))
def test_host_cause_innermost_event_is_the_latest_started_still_running(seed: int) -> None:
    """hostcause's thread index: the parent of each event is the latest earlier one ending at
    or after its end, and the innermost event at a time (walked up those parents) is the
    latest-started event with start <= t < end, by brute force, on nested, partly
    overlapping, zero-length and equal-start events."""
    from diagnose.analyzers.hostcause import _nesting, _Thread

    rng = np.random.default_rng(seed)
    for n, spread in ((0, 5), (1, 5), (40, 3), (300, 60), (300, 2000)):
        s, e = _intervals(rng, n, spread)
        depth, parent = _nesting(s, e)
        want_parent = [max((j for j in range(i) if e[j] >= e[i]), default=-1) for i in range(n)]
        assert parent.tolist() == want_parent
        th = _Thread(0, s, e, np.zeros(n, dtype=object), depth, parent, np.zeros(0, dtype=np.int64),
                     np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                     np.zeros(0, dtype=np.int64))
        t = np.concatenate((rng.integers(-5, 1100 + spread, 300), s, e))
        want = [max((j for j in range(n) if s[j] <= x < e[j]), default=-1) for x in t.tolist()]
        assert th.innermost(t).tolist() == want
