"""The event heap of one fabric: a binary min-heap over parallel arrays keyed (time in whole
picoseconds, sequence number), so events at the same instant run in the order they were
scheduled. An event is a kind, an integer subject `a` (a link, flow, message or source) and an
integer argument `b` (a packet or a generation number that lets stale timers be recognised and
skipped)."""

from __future__ import annotations

import numpy as np

from simcore.fabric.packet._jit import njit
from simcore.fabric.packet.clock import PS_PER_S
from simcore.fabric.packet.state import C_HN, C_SEQ, grow_ints

EV_ARRIVE = 0       # a: link, b: packet; the packet's last bit reaches the link's far end
EV_TX_DONE = 1      # a: link; the port finished serialising its frame
EV_WAKE = 2         # a: link; a NIC's pacing delay is over
EV_MESSAGE = 3      # a: message; the application hands it to the NIC
EV_PAUSE_END = 4    # a: link, b: generation; an XOFF's pause time ran out
EV_XOFF_REFRESH = 5 # a: ingress link, b: generation; re-send XOFF while still congested
EV_RTO = 6          # a: flow; retransmission timer check
EV_RP_TIMER = 7     # a: flow, b: generation; the DCQCN reaction point has work
EV_CREDIT = 8       # a: link, b: bytes; credits come back to the link's sender
EV_SOURCE = 9       # a: source; a traffic source emits a datagram
NUM_KINDS = 16


@njit
def push(st, t, kind, a, b):
    """Schedule event (kind, a, b) at time t (picoseconds)."""
    n = st.cnt[C_HN]
    if n == st.h_cap:
        _grow(st)
    seq = st.cnt[C_SEQ]
    st.cnt[C_SEQ] = seq + 1
    code = a * NUM_KINDS + kind
    ht = st.h_t
    hs = st.h_seq
    hc = st.h_code
    hb = st.h_b
    i = n
    while i > 0:
        up = (i - 1) >> 1
        tu = ht[up]
        if tu < t or (tu == t and hs[up] < seq):
            break
        ht[i] = tu
        hs[i] = hs[up]
        hc[i] = hc[up]
        hb[i] = hb[up]
        i = up
    ht[i] = t
    hs[i] = seq
    hc[i] = code
    hb[i] = b
    st.cnt[C_HN] = n + 1


@njit
def pop(st):
    """Remove the earliest event; returns (time in picoseconds, code, b). The heap must not be
    empty."""
    ht = st.h_t
    hs = st.h_seq
    hc = st.h_code
    hb = st.h_b
    t0 = ht[0]
    c0 = hc[0]
    b0 = hb[0]
    n = st.cnt[C_HN] - 1
    st.cnt[C_HN] = n
    if n > 0:
        t = ht[n]
        s = hs[n]
        c = hc[n]
        b = hb[n]
        i = 0
        while True:
            j = 2 * i + 1
            if j >= n:
                break
            k = j + 1
            if k < n and (ht[k] < ht[j] or (ht[k] == ht[j] and hs[k] < hs[j])):
                j = k
            if t < ht[j] or (t == ht[j] and s < hs[j]):
                break
            ht[i] = ht[j]
            hs[i] = hs[j]
            hc[i] = hc[j]
            hb[i] = hb[j]
            i = j
        ht[i] = t
        hs[i] = s
        hc[i] = c
        hb[i] = b
    return t0, c0, b0


@njit
def next_time(st):
    """Time of the earliest event in seconds, inf when there is none."""
    if st.cnt[C_HN] == 0:
        return np.inf
    return st.h_t[0] / PS_PER_S


@njit
def _grow(st):
    n = st.h_cap
    st.h_t = grow_ints(st, st.h_t, n, 2 * n, 0)
    st.h_seq = grow_ints(st, st.h_seq, n, 2 * n, 0)
    st.h_code = grow_ints(st, st.h_code, n, 2 * n, 0)
    st.h_b = grow_ints(st, st.h_b, n, 2 * n, 0)
    st.h_cap = 2 * n
