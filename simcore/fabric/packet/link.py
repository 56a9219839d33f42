"""A link's transmitter and wire: store-and-forward serialisation at the link rate, then the
propagation delay. Starting a frame at t schedules the port free at t + L/C and the frame's
arrival at the far end at t + L/C + d, each duration to the nearest picosecond. The port obeys
PFC pauses per traffic class (data only) and, under credit-based flow control, sends a class's
data only against the credits the receiver advertised for that class's virtual lane.

Scheduling between classes is strict priority: control frames first, then the highest class
(7 highest, as 802.1p priorities) that has data and is neither paused nor short of credits; a
paused class never blocks another."""

from __future__ import annotations

from simcore.fabric.packet._jit import njit
from simcore.fabric.packet.clock import PS_PER_S, to_ps
from simcore.fabric.packet.heap import EV_ARRIVE, EV_TX_DONE, push
from simcore.fabric.packet.queues import level_change, pop_ctrl, pop_data, top_class
from simcore.fabric.packet.state import (C_DATA_HOPS, C_FRAMES, C_NOW, CF_FC, FC_CREDIT, K_DATA,
                                         NUM_CLASSES)


@njit
def start_tx(st, l, p, now):
    """Put frame p on link l now (the port must be idle)."""
    size = st.p_size[p]
    ser_ps = to_ps(size / st.l_rate[l])
    end_ps = st.cnt[C_NOW] + ser_ps
    st.busy[l] = 1
    st.tx_pkt[l] = p
    st.tx_end[l] = end_ps / PS_PER_S
    st.s_bytes[l] += size
    st.s_busy[l] += ser_ps / PS_PER_S
    st.cnt[C_FRAMES] += 1
    if st.p_kind[p] == K_DATA:
        st.cnt[C_DATA_HOPS] += 1
        if st.cfg[CF_FC] == FC_CREDIT:
            st.credits[l * NUM_CLASSES + st.f_cls[st.p_flow[p]]] -= size
    push(st, end_ps, EV_TX_DONE, l, p)
    push(st, end_ps + to_ps(st.l_delay[l]), EV_ARRIVE, l, p)


@njit
def finish_tx(st, l, now):
    """The frame on port l has left; returns it (it is still travelling to the far end)."""
    p = st.tx_pkt[l]
    st.busy[l] = 0
    st.tx_pkt[l] = -1
    if st.p_kind[p] == K_DATA:
        level_change(st, l, -st.p_size[p], now)
    return p


@njit
def next_queued(st, l):
    """The next frame port l may send from its queues: control first, then data of the highest
    class that is not paused and has credits for its head frame. Returns -1 when there is none."""
    if st.c_head[l] >= 0:
        return pop_ctrl(st, l)
    mask = st.q_mask[l]
    while mask != 0:
        c = top_class(mask)
        mask &= ~(1 << c)
        if sendable(st, l, c, st.q_head[l * NUM_CLASSES + c]):
            return pop_data(st, l, c)
    return -1


@njit
def sendable(st, l, c, p):
    """Whether port l may send class-c data frame p now (not paused, enough credits)."""
    k = l * NUM_CLASSES + c
    if st.paused[k] != 0:
        return False
    return st.cfg[CF_FC] != FC_CREDIT or st.credits[k] >= st.p_size[p]


@njit
def set_paused(st, k, paused, now):
    """Apply a PFC XOFF (paused=1) or XON (0) to class k % NUM_CLASSES of port
    k // NUM_CLASSES; returns True if it resumed."""
    if paused != 0:
        if st.paused[k] == 0:
            st.paused[k] = 1
            st.paused_at[k] = now
        st.pause_gen[k] += 1
        return False
    if st.paused[k] != 0:
        st.paused[k] = 0
        st.s_paused[k] += now - st.paused_at[k]
        return True
    return False


@njit
def busy_done_s(st, l, t):
    """Seconds link l has spent serialising up to time t (the frame on the wire counts in part)."""
    b = st.s_busy[l]
    if st.busy[l] != 0 and st.tx_end[l] > t:
        b -= st.tx_end[l] - t
    return b
