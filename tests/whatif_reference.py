"""The event-by-event what-if walk: the reference :func:`diagnose.analyzers.whatif._walk_fast`
is compared with (``whatif.REFERENCE_WALK``). It walks every event of a window (host call
ends, call starts, activity starts) in time order; each shift reads the shifts of the events it
waited for that were walked before it (0 for the others)."""
from __future__ import annotations

from diagnose.analyzers.whatif import _CALL_START, _OP_START


def walk_reference(order, typ, ref, d_op, d_cs, d_ce, op_args, cs_args, ce_args, floor: int) -> None:
    """The shifts of every event of a window, in ``order`` (:func:`diagnose.analyzers.whatif.retime`): an activity starts
    at the latest of what it waited for (the binding one plus its lag), within [floor, its
    start]; a call starts after the previous call of its thread plus the host time kept
    between them; a blocking call returns at the later of its start and its GPU work's end
    plus its return latency."""
    binds, o_s, o_rem, t_p, w_p, t_w, w_w, t_l, w_l = op_args
    cs_kind, cs_prev, cs_add = cs_args
    blocked, plain, c_s, c_e, c_gend, c_ret, c_rel = ce_args
    for k in order:
        ty, i = typ[k], ref[k]
        if ty == _OP_START:
            if not binds[i]:
                d_op[i] = o_rem[i]
                continue
            j = w_p[i]
            new = t_p[i] - (d_op[j] if j >= 0 else 0)
            j = w_w[i]
            x = t_w[i] - (d_op[j] if j >= 0 else 0)
            if x > new:
                new = x
            j = w_l[i]
            x = t_l[i] - (d_cs[j] if j >= 0 else 0)
            if x > new:
                new = x
            s = o_s[i]
            if new < floor:
                new = floor
            d_op[i] = (s - new if new < s else 0) + o_rem[i]
        elif ty == _CALL_START:
            kd, j = cs_kind[i], cs_prev[i]
            base = 0 if kd == 0 or j < 0 else (d_ce[j] if kd == 1 else d_cs[j])
            d_cs[i] = base + cs_add[i]
        elif not blocked[i]:
            d_ce[i] = d_cs[i] + plain[i]
        else:
            j = c_rel[i]
            ge = c_gend[i] - (d_op[j] if j >= 0 else 0)
            ns = c_s[i] - d_cs[i]
            d_ce[i] = c_e[i] - ((ns if ns > ge else ge) + c_ret[i])
