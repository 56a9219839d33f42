"""A switch: it forwards each packet on its flow's ECMP path (the hash of the flow's 5-tuple with
this switch's salt, fixed per flow; or, with adaptive routing, the equal-cost port with the least
queued bytes unless the hashed one is within a threshold of it) and, under PFC, keeps a shared
buffer per switch with per-ingress-port accounting.

PFC (IEEE 802.1Qbb) per ingress port and priority (traffic class): a data packet of a lossless
class c arriving on ingress port i is admitted to the shared buffer while (i, c)'s shared use
stays within the dynamic threshold T = alpha x (shared pool - shared buffer in use); beyond it,
into (i, c)'s headroom; beyond that it is dropped (a headroom too small for the link). When
(i, c)'s shared use reaches T or its headroom is in use, the switch sends XOFF for class c
upstream on i's reverse link (refreshed at half the pause time while congested); when (i, c)'s
headroom is empty again and its shared use is xon_offset under T, XON. Pauses stop the upstream
transmitter's data of that class only, whose queue then fills and pauses its own upstream:
congestion spreads, with head-of-line blocking of every flow of the class behind the paused port
and none across classes. Lossy classes skip this accounting and meet drop-tail at egress.
"""

from __future__ import annotations

import numpy as np

from simcore.fabric import ecmp
from simcore.fabric.packet._jit import HAVE_NUMBA, njit
from simcore.fabric.packet.clock import ps_later
from simcore.fabric.packet.heap import EV_CREDIT, EV_XOFF_REFRESH, push
from simcore.fabric.packet.link import next_queued, start_tx
from simcore.fabric.packet.queues import enqueue_ctrl, enqueue_data, lossless
from simcore.fabric.packet.state import (C_PAUSES, CF_ALPHA, CF_AR, CF_ARTH, CF_CTRL, CF_FC,
                                         CF_NHOST, CF_XON, FC_CREDIT, FC_PFC, K_DATA, K_PAUSE,
                                         NUM_CLASSES, alloc_packet, drop_data)

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)
_MASK = (1 << 64) - 1

if HAVE_NUMBA:
    @njit
    def mix64(x):
        """SplitMix64's finaliser on uint64 (the same function as ecmp.mix64)."""
        x = x + _M1
        x = (x ^ (x >> np.uint64(30))) * _M2
        x = (x ^ (x >> np.uint64(27))) * _M3
        return x ^ (x >> np.uint64(31))

    @njit
    def ecmp_index(fhash_bits, salt_bits, k):
        """ecmp.choose's pick among k equal-cost ports (hash and salt as int64 bit patterns)."""
        h = mix64(np.uint64(fhash_bits) ^ np.uint64(salt_bits))
        return np.int64(h % np.uint64(k))
else:
    def ecmp_index(fhash_bits, salt_bits, k):
        return ecmp.mix64((int(fhash_bits) & _MASK) ^ (int(salt_bits) & _MASK)) % int(k)


@njit
def adaptive_port(st, n, dst, f):
    """The least-queued equal-cost port toward host dst, preferring the hashed one unless another
    is shorter by more than the adaptive-routing threshold."""
    key = n * int(st.cfg[CF_NHOST]) + st.n_hidx[dst]
    a = st.nh_off[key]
    b = st.nh_off[key + 1]
    if b - a == 1:
        return st.nh_links[a]
    hashed = st.nh_links[a + ecmp_index(st.f_hash[f], st.n_salt[n], b - a)]
    best = hashed
    best_q = st.q_bytes[hashed]
    for j in range(a, b):
        lj = st.nh_links[j]
        if st.q_bytes[lj] < best_q:
            best = lj
            best_q = st.q_bytes[lj]
    if best_q + st.cfg[CF_ARTH] < st.q_bytes[hashed]:
        return best
    return hashed


@njit
def out_port(st, n, p):
    """The link node n forwards packet p on (and advance p along its path)."""
    f = st.p_flow[p]
    hop = st.p_hop[p]
    st.p_hop[p] = hop + 1
    if st.p_rev[p] != 0:
        return st.path[st.f_roff[f] + hop]
    if st.cfg[CF_AR] != 0 and st.p_kind[p] == K_DATA:
        return adaptive_port(st, n, st.f_dst[f], f)
    return st.path[st.f_poff[f] + hop]


@njit
def switch_kick(st, l, now):
    """Start port l's next frame if it is idle and has one it may send."""
    if st.busy[l] != 0:
        return
    p = next_queued(st, l)
    if p >= 0:
        start_tx(st, l, p, now)


@njit
def switch_receive(st, n, l_in, p, now):
    """Packet p arrived at switch n over link l_in: admit it and queue it on its out port."""
    out = out_port(st, n, p)
    if st.p_kind[p] != K_DATA:
        enqueue_ctrl(st, out, p, False)
        switch_kick(st, out, now)
        return
    size = st.p_size[p]
    c = st.f_cls[st.p_flow[p]]
    if (st.cfg[CF_FC] == FC_PFC and lossless(st, c)
            and not pfc_admit(st, n, l_in, c, size, now)):
        st.s_drops[out] += 1
        drop_data(st, p)
        return
    st.p_in[p] = l_in
    if not enqueue_data(st, out, p, now):
        return
    used = st.sw_used[n] + size
    st.sw_used[n] = used
    if used > st.sw_maxused[n]:
        st.sw_maxused[n] = used
    switch_kick(st, out, now)


@njit
def switch_release(st, n, p, now):
    """Data packet p has left switch n: free its buffer at its ingress port (PFC accounting and
    XON) or return its credits upstream."""
    l_in = st.p_in[p]
    size = st.p_size[p]
    st.sw_used[n] -= size
    fc = st.cfg[CF_FC]
    c = st.f_cls[st.p_flow[p]]
    if fc == FC_PFC:
        if lossless(st, c):
            pfc_release(st, n, l_in, c, size, now)
    elif fc == FC_CREDIT:
        push(st, ps_later(st, st.l_delay[l_in]), EV_CREDIT, l_in * NUM_CLASSES + c, size)


@njit
def _threshold(st, n):
    return st.cfg[CF_ALPHA] * (st.sw_pool[n] - st.sw_shared[n])


@njit
def pfc_admit(st, n, l, c, size, now):
    """Account `size` bytes of class c arriving on ingress l of switch n; False if even the
    headroom of (l, c) is full."""
    k = l * NUM_CLASSES + c
    h = st.in_hdrm[k]
    if h == 0 and st.in_bytes[k] + size <= _threshold(st, n):
        st.in_bytes[k] += size
        st.sw_shared[n] += size
    elif h + size <= st.l_hdrm[l]:
        st.in_hdrm[k] = h + size
        st.in_bytes[k] += size
    else:
        return False
    if st.xoff[k] == 0 and (st.in_hdrm[k] > 0
                            or st.in_bytes[k] - st.in_hdrm[k] >= _threshold(st, n)):
        send_pause(st, k, 1, now)
    return True


@njit
def pfc_release(st, n, l, c, size, now):
    """Account `size` bytes of class c of ingress l leaving switch n (headroom first); XON when
    drained."""
    k = l * NUM_CLASSES + c
    h = st.in_hdrm[k]
    from_h = size if size < h else h
    st.in_hdrm[k] = h - from_h
    st.in_bytes[k] -= size
    st.sw_shared[n] -= size - from_h
    if st.xoff[k] != 0 and st.in_hdrm[k] == 0:
        shared = st.in_bytes[k]
        if shared == 0 or shared + st.cfg[CF_XON] <= _threshold(st, n):
            send_pause(st, k, 0, now)


@njit
def send_pause(st, k, xoff, now):
    """Send XOFF (xoff=1) or XON (0) for class k % NUM_CLASSES of ingress link k // NUM_CLASSES
    upstream, ahead of other frames."""
    l = k // NUM_CLASSES
    back = st.l_rev[l]
    p = alloc_packet(st, K_PAUSE, -1, int(st.cfg[CF_CTRL]))
    st.p_arg[p] = xoff
    st.p_psn[p] = k - l * NUM_CLASSES
    enqueue_ctrl(st, back, p, True)
    st.xoff_gen[k] += 1
    st.xoff[k] = xoff
    if xoff != 0:
        st.s_pauses[k] += 1
        st.cnt[C_PAUSES] += 1
        push(st, ps_later(st, 0.5 * st.l_pause_s[l]), EV_XOFF_REFRESH, k, st.xoff_gen[k])
    switch_kick(st, back, now)


@njit
def xoff_refresh(st, k, gen, now):
    """Half an XOFF's pause time has passed: repeat it if (ingress, class) k is still congested.
    Returns whether it did."""
    if st.xoff[k] != 0 and st.xoff_gen[k] == gen:
        send_pause(st, k, 1, now)
        return True
    return False
