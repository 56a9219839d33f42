"""Egress queues: the FIFOs of a port (strict-priority control frames ahead of data, one data
FIFO per traffic class) and the data queue's disciplines. Drop-tail refuses a frame of a lossy
class that would overflow the port's buffer; RED/ECN marks it with probability 0 below Kmin,
Pmax (q - Kmin)/(Kmax - Kmin) up to Kmax and 1 above, on the instantaneous bytes q already queued;
lossless classes (PFC or credits upstream) are never refused, because admission was settled at
the switch's ingress or by the sender's credits.

Queue bytes count data frames of every class waiting and the one on the wire (a frame holds
buffer until its last bit has left); their time integral and maximum are kept per port. A frame
counts its size on the wire, payload plus the profile's header bytes (`p_size`, the size it is
serialised at; preamble and inter-frame gap are not modelled), so the drop-tail capacity
(`buffer_bytes`, or `buffer_packets` x `mtu_bytes`), the ECN thresholds Kmin and Kmax and the
reported queue depths are all in those bytes, headers included. Control frames wait in a queue of
their own and are not counted. Which class a port sends next is the link's business
(`link.next_queued`: strict priority).
"""

from __future__ import annotations

from simcore.fabric.packet._jit import njit
from simcore.fabric.packet.state import (C_MARKS, CF_HBIN, CF_LOSSLESS, NUM_CLASSES, drop_data,
                                         uniform)


@njit
def lossless(st, c):
    """Whether traffic class c is lossless (never dropped)."""
    return (int(st.cfg[CF_LOSSLESS]) >> c) & 1 != 0


@njit
def top_class(mask):
    """The highest class whose bit is set in a non-zero class mask."""
    c = 0
    while mask > 1:
        mask >>= 1
        c += 1
    return c


@njit
def level_change(st, l, delta, now):
    """Add `delta` bytes to port l's data queue, keeping its time integral and maximum."""
    q = st.q_bytes[l]
    st.s_qint[l] += q * (now - st.s_qt[l])
    st.s_qt[l] = now
    q += delta
    st.q_bytes[l] = q
    if q > st.s_maxq[l]:
        st.s_maxq[l] = q


@njit
def mark_probability(q, kmin, kmax, pmax):
    """RED/ECN marking probability on instantaneous queue bytes q."""
    if q <= kmin:
        return 0.0
    if q <= kmax:
        return pmax * (q - kmin) / (kmax - kmin)
    return 1.0


@njit
def enqueue_data(st, l, p, now):
    """Offer data packet p to port l's queue of its class. Returns False (and frees p) if
    drop-tail refuses it; otherwise queues it, marking ECN first where the port marks."""
    size = st.p_size[p]
    c = st.f_cls[st.p_flow[p]]
    q = st.q_bytes[l]
    b = int(q / st.cfg[CF_HBIN])
    nb = st.n_hist
    st.hist[l * nb + (b if b < nb else nb - 1)] += 1
    cap = st.l_cap[l]
    if cap >= 0 and q + size > cap and not lossless(st, c):
        st.s_drops[l] += 1
        drop_data(st, p)
        return False
    if st.l_ecn[l] != 0 and st.p_ecn[p] == 0:
        prob = mark_probability(q, st.l_kmin[l], st.l_kmax[l], st.l_pmax[l])
        if prob > 0.0 and (prob >= 1.0 or uniform(st) < prob):
            st.p_ecn[p] = 1
            st.s_marks[l] += 1
            st.cnt[C_MARKS] += 1
    level_change(st, l, size, now)
    st.p_next[p] = -1
    k = l * NUM_CLASSES + c
    t = st.q_tail[k]
    if t < 0:
        st.q_head[k] = p
        st.q_mask[l] |= 1 << c
    else:
        st.p_next[t] = p
    st.q_tail[k] = p
    return True


@njit
def pop_data(st, l, c):
    """Take the head of port l's class-c data FIFO (its bytes stay counted until the frame has
    left)."""
    k = l * NUM_CLASSES + c
    p = st.q_head[k]
    nxt = st.p_next[p]
    st.q_head[k] = nxt
    if nxt < 0:
        st.q_tail[k] = -1
        st.q_mask[l] &= ~(1 << c)
    return p


@njit
def enqueue_ctrl(st, l, p, front):
    """Queue control frame p at port l, at the front for PAUSE frames (MAC control first)."""
    if front:
        st.p_next[p] = st.c_head[l]
        st.c_head[l] = p
        if st.c_tail[l] < 0:
            st.c_tail[l] = p
        return
    st.p_next[p] = -1
    t = st.c_tail[l]
    if t < 0:
        st.c_head[l] = p
    else:
        st.p_next[t] = p
    st.c_tail[l] = p


@njit
def pop_ctrl(st, l):
    p = st.c_head[l]
    nxt = st.p_next[p]
    st.c_head[l] = nxt
    if nxt < 0:
        st.c_tail[l] = -1
    return p
