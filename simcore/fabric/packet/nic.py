"""A host's NIC: queue pairs that cut messages into MTU packets and pace them, a receiver that
reassembles them, and the DCQCN roles, whose state machines (simcore.fabric.dcqcn) live in Python
and are driven through requests the kernel leaves in its outbox.

Sending: each egress port serves traffic classes in strict priority (control frames first, then
the highest class that is neither paused nor short of credits) and, within a class, relayed
packets (a host that forwards others' traffic, like a PXN GPU) and datagrams first, then its
active queue pairs round robin; a queue pair may start its next frame once `size / rate` has
passed since the start of its previous one (its pacing rate is the line rate, or DCQCN's current
rate).

Reliability: lossless classes need none, and the receiver accepts packets in any order. Queue
pairs of a lossy class (every class when the fabric has no flow control) run go-back-N or
selective repeat, per queue pair. Go-back-N: the receiver accepts only the next expected PSN,
ACKs every few in-order packets and each message's end, NACKs the first gap once; the sender
rewinds to the NACKed PSN or, after a retransmission timeout without progress, to the oldest
unacknowledged one. Selective repeat (as RoCE NICs with selective retransmission, IRN): the
receiver keeps every packet it gets, one bit per packet of each message, and ACKs as go-back-N
does, also when a resent packet fills a gap; each packet past a gap is answered by a NACK that
carries the cumulative acknowledgement and the PSN that arrived (a selective acknowledgement).
The sender records those PSNs, and resends, ahead of new data and once each, every
unacknowledged PSN below the highest one selectively acknowledged that it has not learnt
arrived; after a retransmission timeout without progress it resends every such PSN up to the
last one sent. Queue pairs of unreliable messages (datagrams) have no acknowledgements: a
dropped packet is lost, and so is its message.

DCQCN: a marked data packet at the receiver asks the notification point whether to send a CNP
(only once its per-flow quiet interval has passed); a CNP at the sender, a reaction-point timer,
the byte counter filling, or a rate-limited queue pair becoming active again ask the reaction
point, which sets the pacing rate.
"""

from __future__ import annotations

import numpy as np

from simcore.fabric.packet._jit import njit, view
from simcore.fabric.packet.clock import ps_at_or_after, ps_later, to_ps
from simcore.fabric.packet.heap import (EV_CREDIT, EV_MESSAGE, EV_RP_TIMER, EV_RTO, EV_SOURCE,
                                        EV_WAKE, push)
from simcore.fabric.packet.link import sendable, start_tx
from simcore.fabric.packet.queues import (enqueue_ctrl, enqueue_data, level_change, pop_ctrl,
                                          pop_data, top_class)
from simcore.fabric.packet.state import (C_CNPS, C_DELIV_PAY, C_DGRAM_PKTS, C_NACKS, C_NBITS,
                                         C_NFLOW, C_NMSG, C_NOW, C_NPATH, C_NSRC, C_OBN, C_RETX,
                                         C_RETX_PAY, C_SENT_PAY, C_STALL, C_TIMEOUTS, CF_ACKN,
                                         CF_CTRL,
                                         CF_FC, CF_HDR, CF_PAY, CF_RTO, CF_WIN, FC_CREDIT, K_ACK,
                                         K_CNP, K_DATA, K_NACK, NEVER, NUM_CLASSES, REL_NONE,
                                         REL_SR, alloc_packet, free_packet,
                                         grow_floats, grow_ints, uniform)
from simcore.fabric.packet.switch import out_port

_ONE = np.int64(1)
"""Bit k & 63 of a word of the selective-repeat tables is _ONE << (k & 63) (bit 63 too)."""

# Outbox requests for Python.
STALL_TIMEOUTS = 1000
"""Retransmission timeouts in a row, with no acknowledgement between them, after which a queue
pair is declared stalled and the run stops with an error instead of resending forever (e.g.
go-back-N without a window resending its whole window, every timeout, into a drop-tail queue
still full of the previous round's packets, so that the one packet the receiver waits for never
gets through)."""

O_DONE = 0          # a: message with a callback; its last byte arrived
O_CNP = 1           # a: flow; a CNP reached its sender
O_NP = 2            # a: flow; a marked packet reached its receiver: send a CNP?
O_RP_TIMER = 3      # a: flow; its reaction point's next event is due
O_RP_BYTES = 4      # a: flow; its byte counter filled
O_RP_WAKE = 5       # a: flow; a rate-limited queue pair has data again


@njit
def request(st, kind, a):
    n = st.cnt[C_OBN]
    if n == st.o_cap:
        st.o_kind = grow_ints(st, st.o_kind, n, 2 * n, 0)
        st.o_a = grow_ints(st, st.o_a, n, 2 * n, 0)
        st.o_cap = 2 * n
    st.o_kind[n] = kind
    st.o_a[n] = a
    st.cnt[C_OBN] = n + 1


# ---- sending ---------------------------------------------------------------------------------

@njit
def nic_kick(st, l, now):
    """Start host port l's next frame if it is idle: control frames first, then by class in strict
    priority its queued (relayed, datagram) frames, then its queue pairs' data."""
    if st.busy[l] != 0:
        return
    if st.c_head[l] >= 0:
        start_tx(st, l, pop_ctrl(st, l), now)
        return
    mask = st.q_mask[l] | st.act_mask[l]
    while mask != 0:
        c = top_class(mask)
        mask &= ~(1 << c)
        k = l * NUM_CLASSES + c
        q = st.q_head[k]
        if q >= 0:
            if sendable(st, l, c, q):
                start_tx(st, l, pop_data(st, l, c), now)
                return
        elif st.paused[k] == 0:
            p = _pull(st, l, k, now)
            if p >= 0:
                start_tx(st, l, p, now)
                return


@njit
def _frame_bytes(st, f):
    """Wire bytes of queue pair f's next packet."""
    m = st.f_msnd[f]
    k = st.f_nxt[f] - st.m_psn0[m]
    if st.f_rel[f] == REL_SR and _sr_pending(st, f):
        m = st.f_rtxm[f]
        k = st.f_rtx[f] - st.m_psn0[m]
    pay = int(st.cfg[CF_PAY])
    if k == st.m_npk[m] - 1:
        pay = st.m_size[m] - k * pay
    return pay + int(st.cfg[CF_HDR])


@njit
def _pull(st, l, k, now):
    """Round robin over port l's active queue pairs of class k % NUM_CLASSES for one whose
    pacing allows a frame now; schedule a wake-up for the earliest one otherwise. Returns the
    packet or -1."""
    n = st.act_n[k]
    if n == 0:
        return -1
    f = st.act_cur[k]
    win = st.cfg[CF_WIN]
    earliest = NEVER
    now_ps = st.cnt[C_NOW]
    for _ in range(n):
        nxt_f = st.f_anext[f]
        if win <= 0 or st.f_nxt[f] - st.f_una[f] < win or _unwindowed(st, f):
            t = st.f_next_t[f]
            if t <= now_ps:
                if st.cfg[CF_FC] == FC_CREDIT and st.credits[k] < _frame_bytes(st, f):
                    return -1
                st.act_cur[k] = nxt_f
                return _make_data(st, f, l, now)
            if t < earliest:
                earliest = t
        f = nxt_f
    if earliest < st.wake_t[l]:
        st.wake_t[l] = earliest
        push(st, earliest, EV_WAKE, l, 0)
    return -1


@njit
def _unwindowed(st, f):
    """Whether queue pair f may send past a full window: it has no acknowledgements, or
    selective repeat has a packet to resend."""
    rel = st.f_rel[f]
    return rel == REL_NONE or (rel == REL_SR and _sr_pending(st, f))


@njit
def _make_data(st, f, l, now):
    """Cut queue pair f's next packet (PSN f_nxt; under selective repeat, a packet to resend
    first) and account for it as sent now."""
    if st.f_rel[f] == REL_SR and _sr_pending(st, f):
        return _resend(st, f, l, now)
    psn = st.f_nxt[f]
    m = st.f_msnd[f]
    if psn - st.m_psn0[m] == st.m_npk[m] - 1:
        st.f_msnd[f] = st.m_next[m]
    p, pay, size = _cut_data(st, f, m, psn, now)
    st.f_nxt[f] = psn + 1
    if psn < st.f_maxsent[f]:
        st.cnt[C_RETX] += 1
        st.cnt[C_RETX_PAY] += pay
    else:
        st.f_maxsent[f] = psn + 1
    _data_sent(st, f, l, size, now)
    if st.f_nxt[f] >= st.f_end[f]:
        _deactivate(st, f)
    return p


@njit
def _resend(st, f, l, now):
    """Selective repeat: cut queue pair f's packet f_rtx again and account for it as sent now."""
    psn = st.f_rtx[f]
    p, pay, size = _cut_data(st, f, st.f_rtxm[f], psn, now)
    st.f_rtx[f] = psn + 1
    st.cnt[C_RETX] += 1
    st.cnt[C_RETX_PAY] += pay
    _data_sent(st, f, l, size, now)
    if st.f_nxt[f] >= st.f_end[f] and not _sr_pending(st, f):
        _deactivate(st, f)
    return p


@njit
def _cut_data(st, f, m, psn, now):
    """Allocate queue pair f's data packet `psn` of message m (the message's last packet
    carries the rest of its bytes), pace the pair's next send after it and count its payload
    as sent; returns (packet, payload bytes, frame bytes)."""
    k = psn - st.m_psn0[m]
    pay = int(st.cfg[CF_PAY])
    if k == st.m_npk[m] - 1:
        pay = st.m_size[m] - k * pay
    size = pay + int(st.cfg[CF_HDR])
    p = alloc_packet(st, K_DATA, f, size)
    st.p_pay[p] = pay
    st.p_psn[p] = psn
    st.p_msg[p] = m
    st.f_next_t[f] = ps_later(st, size / st.f_rate[f])
    st.cnt[C_SENT_PAY] += pay
    return p, pay, size


@njit
def _data_sent(st, f, l, size, now):
    """A data frame of `size` bytes of queue pair f joins port l's queue: the retransmission
    timer starts if a reliable pair has none running, and DCQCN's byte counter advances."""
    level_change(st, l, size, now)
    if st.f_rel[f] != 0 and st.f_rto_t[f] == NEVER:
        st.f_rto_t[f] = ps_later(st, st.cfg[CF_RTO])
        _arm_rto(st, f)
    if st.f_bleft[f] >= 0:
        st.f_bacc[f] += size
        if st.f_bacc[f] >= st.f_bleft[f]:
            st.f_bleft[f] = -1
            request(st, O_RP_BYTES, f)


@njit
def _sr_pending(st, f):
    """Selective repeat: move f_rtx (and f_rtxm) to queue pair f's next PSN to resend, skipping
    those acknowledged or selectively acknowledged; whether there is one (below f_rlim)."""
    psn = st.f_rtx[f]
    lim = st.f_rlim[f]
    if psn >= lim:
        return False
    m = st.f_rtxm[f]
    if psn <= st.f_una[f]:
        psn = st.f_una[f]
        m = st.f_mhead[f]
    while psn < lim:
        while st.m_psn0[m] + st.m_npk[m] <= psn:
            m = st.m_next[m]
        k = psn - st.m_psn0[m]
        if (st.sbits[st.m_boff[m] + (k >> 6)] >> (k & 63)) & 1 == 0:
            break
        psn += 1
    st.f_rtx[f] = psn
    st.f_rtxm[f] = m
    return psn < lim


@njit
def _sr_nack(st, f, cum, got, m, now):
    """Selective repeat: the receiver has every PSN below `cum` and PSN `got` (of message m);
    every PSN between them it lacks is taken as lost and resent."""
    _acked(st, f, cum, now)
    if got >= st.f_una[f]:
        k = got - st.m_psn0[m]
        st.sbits[st.m_boff[m] + (k >> 6)] |= _ONE << (k & 63)
        if got > st.f_rlim[f]:
            st.f_rlim[f] = got
    _sr_settle(st, f, now)


@njit
def _sr_timeout(st, f, now):
    """Selective repeat after a retransmission timeout: resend every unacknowledged PSN up to
    the last one sent that the receiver is not known to hold."""
    st.f_rtx[f] = st.f_una[f]
    st.f_rtxm[f] = st.f_mhead[f]
    st.f_rlim[f] = st.f_nxt[f]
    _sr_settle(st, f, now)


@njit
def _sr_settle(st, f, now):
    """Selective repeat: keep queue pair f active exactly while it has a packet to send."""
    if _sr_pending(st, f):
        _activate(st, f)
        nic_kick(st, st.f_link[f], now)
    elif st.f_nxt[f] >= st.f_end[f]:
        _deactivate(st, f)


@njit
def _activate(st, f):
    if st.f_act[f] != 0:
        return
    st.f_act[f] = 1
    l = st.f_link[f]
    k = l * NUM_CLASSES + st.f_cls[f]
    c = st.act_cur[k]
    if st.act_n[k] == 0:
        st.f_anext[f] = f
        st.f_aprev[f] = f
        st.act_cur[k] = f
        st.act_mask[l] |= 1 << st.f_cls[f]
    else:
        prev = st.f_aprev[c]
        st.f_anext[prev] = f
        st.f_aprev[f] = prev
        st.f_anext[f] = c
        st.f_aprev[c] = f
    st.act_n[k] += 1
    if st.f_cc[f] != 0 and st.f_rpwait[f] == 0 and st.f_rate[f] < st.f_line[f]:
        request(st, O_RP_WAKE, f)


@njit
def _deactivate(st, f):
    if st.f_act[f] == 0:
        return
    st.f_act[f] = 0
    l = st.f_link[f]
    k = l * NUM_CLASSES + st.f_cls[f]
    st.act_n[k] -= 1
    if st.act_n[k] == 0:
        st.act_cur[k] = -1
        st.act_mask[l] &= ~(1 << st.f_cls[f])
        return
    prev = st.f_aprev[f]
    nxt = st.f_anext[f]
    st.f_anext[prev] = nxt
    st.f_aprev[nxt] = prev
    if st.act_cur[k] == f:
        st.act_cur[k] = nxt


@njit
def message_start(st, m, now):
    """The application hands message m to its queue pair now."""
    f = st.m_flow[m]
    st.m_psn0[m] = st.f_end[f]
    st.f_end[f] += st.m_npk[m]
    # Chain it behind the last message (a resent last packet moves on to it) and make it the
    # oldest unacknowledged one if every earlier message has been acknowledged.
    t = st.f_mtail[f]
    if t >= 0:
        st.m_next[t] = m
    if st.f_mhead[f] < 0:
        st.f_mhead[f] = m
    st.f_mtail[f] = m
    if st.f_msnd[f] < 0:
        st.f_msnd[f] = m
    _activate(st, f)
    nic_kick(st, st.f_link[f], now)


@njit
def _find_message(st, f, psn):
    m = st.f_mhead[f]
    while m >= 0 and st.m_psn0[m] + st.m_npk[m] <= psn:
        m = st.m_next[m]
    return m


@njit
def _go_back(st, f, psn, now):
    """Go-back-N: resend from `psn`."""
    st.f_nxt[f] = psn
    st.f_msnd[f] = _find_message(st, f, psn)
    if psn < st.f_end[f]:
        _activate(st, f)
        nic_kick(st, st.f_link[f], now)


@njit
def _arm_rto(st, f):
    if st.f_rto_pend[f] == 0 and st.f_rto_t[f] < NEVER:
        st.f_rto_pend[f] = 1
        push(st, st.f_rto_t[f], EV_RTO, f, 0)


@njit
def rto_check(st, f, now):
    """The retransmission timer of queue pair f: fire if no progress for a timeout. Returns
    whether it fired."""
    st.f_rto_pend[f] = 0
    deadline = st.f_rto_t[f]
    if deadline == NEVER:
        return False
    if st.cnt[C_NOW] < deadline:
        _arm_rto(st, f)
        return False
    st.cnt[C_TIMEOUTS] += 1
    st.f_rto_t[f] = NEVER
    st.f_tmo[f] += 1
    if st.f_tmo[f] >= STALL_TIMEOUTS and st.cnt[C_STALL] == 0:
        st.cnt[C_STALL] = f + 1
    if st.f_rel[f] == REL_SR:
        _sr_timeout(st, f, now)
    else:
        _go_back(st, f, st.f_una[f], now)
    return True


@njit
def _acked(st, f, psn, now):
    """Cumulative acknowledgement of every PSN below `psn`."""
    if psn <= st.f_una[f]:
        return
    st.f_una[f] = psn
    st.f_tmo[f] = 0
    m = st.f_mhead[f]
    while m >= 0 and st.m_psn0[m] + st.m_npk[m] <= psn:
        m = st.m_next[m]
    st.f_mhead[f] = m
    if psn > st.f_nxt[f]:
        # The receiver got packets sent before a rewind: skip past them.
        st.f_nxt[f] = psn
        st.f_msnd[f] = m
        if psn >= st.f_end[f]:
            _deactivate(st, f)
    if st.f_una[f] < st.f_nxt[f]:
        st.f_rto_t[f] = ps_later(st, st.cfg[CF_RTO])
        _arm_rto(st, f)
    else:
        st.f_rto_t[f] = NEVER
    if st.f_rel[f] == REL_SR and st.f_act[f] != 0 and st.f_nxt[f] >= st.f_end[f]:
        _sr_settle(st, f, now)
    if st.cfg[CF_WIN] > 0:
        nic_kick(st, st.f_link[f], now)


# ---- receiving -------------------------------------------------------------------------------

@njit
def send_ctrl(st, f, kind, psn, now):
    """Send a control frame of flow f from its receiver back to its sender."""
    l0 = st.path[st.f_roff[f]]
    p = alloc_packet(st, kind, f, int(st.cfg[CF_CTRL]))
    st.p_psn[p] = psn
    st.p_rev[p] = 1
    enqueue_ctrl(st, l0, p, False)
    nic_kick(st, l0, now)


@njit
def nic_receive(st, h, l_in, p, now):
    """Packet p reached host h over link l_in."""
    kind = st.p_kind[p]
    f = st.p_flow[p]
    if kind == K_DATA and st.cfg[CF_FC] == FC_CREDIT:
        push(st, ps_later(st, st.l_delay[l_in]), EV_CREDIT, l_in * NUM_CLASSES + st.f_cls[f],
             st.p_size[p])
    dest = st.f_src[f] if st.p_rev[p] != 0 else st.f_dst[f]
    if dest != h:
        out = out_port(st, h, p)
        if kind == K_DATA:
            if not enqueue_data(st, out, p, now):
                return
        else:
            enqueue_ctrl(st, out, p, False)
        nic_kick(st, out, now)
        return
    if kind == K_DATA:
        _receive_data(st, f, p, now)
    elif kind == K_ACK:
        _acked(st, f, st.p_psn[p], now)
    elif kind == K_NACK:
        psn = st.p_psn[p]
        if st.f_rel[f] == REL_SR:
            _sr_nack(st, f, psn, st.p_arg[p], st.p_msg[p], now)
            free_packet(st, p)
            return
        _acked(st, f, psn, now)
        if psn < st.f_nxt[f]:
            st.f_rto_t[f] = ps_later(st, st.cfg[CF_RTO])
            _arm_rto(st, f)
            _go_back(st, f, psn, now)
    elif kind == K_CNP:
        if st.f_cc[f] != 0:
            request(st, O_CNP, f)
    free_packet(st, p)


@njit
def _accept(st, m, now):
    st.m_got[m] += 1
    if st.m_got[m] == st.m_npk[m]:
        st.m_end[m] = now
        if st.m_cb[m] != 0:
            request(st, O_DONE, m)
        return True
    return False


@njit
def _receive_data(st, f, p, now):
    pay = st.p_pay[p]
    st.cnt[C_DELIV_PAY] += pay
    if st.f_dgram[f] != 0:
        st.f_dgram_pay[f] += pay
        st.cnt[C_DGRAM_PKTS] += 1
        return
    if st.p_ecn[p] != 0 and st.f_cc[f] != 0 and st.cnt[C_NOW] >= st.f_quiet[f]:
        request(st, O_NP, f)
    m = st.p_msg[p]
    if st.f_rel[f] == REL_NONE:
        _accept(st, m, now)
        return
    if st.f_rel[f] == REL_SR:
        _receive_sr(st, f, p, m, now)
        return
    psn = st.p_psn[p]
    expected = st.f_rnxt[f]
    if psn == expected:
        st.f_rnxt[f] = psn + 1
        st.f_nack[f] = -1
        done = _accept(st, m, now)
        st.f_rcnt[f] += 1
        if done or st.f_rcnt[f] >= st.cfg[CF_ACKN]:
            st.f_rcnt[f] = 0
            send_ctrl(st, f, K_ACK, psn + 1, now)
    elif psn > expected and st.f_nack[f] != expected:
        st.f_nack[f] = expected
        st.cnt[C_NACKS] += 1
        send_ctrl(st, f, K_NACK, expected, now)


@njit
def _receive_sr(st, f, p, m, now):
    """Selective repeat at the receiver: keep packet p (of message m) unless it is a duplicate;
    ACK as go-back-N does, and when it fills a gap; NACK every packet past a gap."""
    psn = st.p_psn[p]
    expected = st.f_rnxt[f]
    if psn < expected:
        return
    k = psn - st.m_psn0[m]
    w = st.m_boff[m] + (k >> 6)
    bit = _ONE << (k & 63)
    if st.rbits[w] & bit != 0:
        return
    st.rbits[w] |= bit
    done = _accept(st, m, now)
    if psn > expected:
        st.cnt[C_NACKS] += 1
        q = alloc_packet(st, K_NACK, f, int(st.cfg[CF_CTRL]))
        st.p_psn[q] = expected
        st.p_arg[q] = psn
        st.p_msg[q] = m
        st.p_rev[q] = 1
        l0 = st.path[st.f_roff[f]]
        enqueue_ctrl(st, l0, q, False)
        nic_kick(st, l0, now)
        return
    # In order: move past every packet already held.
    psn += 1
    filled = False
    while True:
        if psn == st.m_psn0[m] + st.m_npk[m]:
            m = st.m_next[m]
            if m < 0:
                break
        k = psn - st.m_psn0[m]
        if (st.rbits[st.m_boff[m] + (k >> 6)] >> (k & 63)) & 1 == 0:
            break
        psn += 1
        filled = True
    st.f_rnxt[f] = psn
    st.f_rcnt[f] += 1
    if done or filled or st.f_rcnt[f] >= st.cfg[CF_ACKN]:
        st.f_rcnt[f] = 0
        send_ctrl(st, f, K_ACK, psn, now)


@njit
def send_cnp(st, f, quiet_until_s, now):
    """The notification point decided to answer flow f's marked packet with a CNP."""
    st.cnt[C_CNPS] += 1
    st.f_quiet[f] = ps_at_or_after(quiet_until_s)
    send_ctrl(st, f, K_CNP, 0, now)


# ---- traffic sources -------------------------------------------------------------------------

@njit
def source_emit(st, s, now):
    """Source s hands its NIC one datagram now and schedules the next."""
    f = st.s_flow[s]
    pay = st.s_pay[s]
    p = alloc_packet(st, K_DATA, f, pay + int(st.cfg[CF_HDR]))
    st.p_pay[p] = pay
    st.cnt[C_SENT_PAY] += pay
    l = st.f_link[f]
    if enqueue_data(st, l, p, now):
        nic_kick(st, l, now)
    gap = st.s_gap[s]
    if st.s_poisson[s] != 0:
        gap = -gap * np.log(1.0 - uniform(st))
    t = ps_later(st, gap)
    if t < ps_at_or_after(st.s_stop[s]):
        push(st, t, EV_SOURCE, s, 0)


# ---- calls from Python -----------------------------------------------------------------------

@njit
def add_flow(st, src, dst, path, rpath, fhash_bits, line_bytes_per_s, cc, dgram, cls, rel):
    """Register a queue pair from host src to host dst with its data and reverse paths, its
    traffic class and its transport `rel` (REL_NONE, REL_GBN or REL_SR)."""
    f = st.cnt[C_NFLOW]
    if f == st.f_cap:
        _grow_flows(st, 2 * f)
    st.cnt[C_NFLOW] = f + 1
    off = st.cnt[C_NPATH]
    need = off + path.shape[0] + rpath.shape[0]
    if need > st.path_cap:
        cap = max(need, 2 * st.path_cap)
        st.path = grow_ints(st, st.path, off, cap, 0)
        st.path_cap = cap
    for i in range(path.shape[0]):
        st.path[off + i] = path[i]
    st.f_poff[f] = off
    off += path.shape[0]
    for i in range(rpath.shape[0]):
        st.path[off + i] = rpath[i]
    st.f_roff[f] = off
    st.cnt[C_NPATH] = off + rpath.shape[0]
    st.f_src[f] = src
    st.f_dst[f] = dst
    st.f_link[f] = path[0]
    st.f_hash[f] = fhash_bits
    st.f_rate[f] = line_bytes_per_s
    st.f_line[f] = line_bytes_per_s
    st.f_next_t[f] = 0
    st.f_nxt[f] = 0
    st.f_una[f] = 0
    st.f_end[f] = 0
    st.f_maxsent[f] = 0
    st.f_msnd[f] = -1
    st.f_mhead[f] = -1
    st.f_mtail[f] = -1
    st.f_act[f] = 0
    st.f_anext[f] = -1
    st.f_aprev[f] = -1
    st.f_rnxt[f] = 0
    st.f_rcnt[f] = 0
    st.f_nack[f] = -1
    st.f_rto_t[f] = NEVER
    st.f_rto_pend[f] = 0
    st.f_tmo[f] = 0
    st.f_cc[f] = cc
    st.f_bacc[f] = 0
    st.f_bleft[f] = -1
    st.f_rpgen[f] = 0
    st.f_rpwait[f] = 0
    st.f_quiet[f] = 0
    st.f_dgram[f] = dgram
    st.f_dgram_pay[f] = 0
    st.f_cls[f] = cls
    st.f_rel[f] = rel
    st.f_rtx[f] = 0
    st.f_rtxm[f] = -1
    st.f_rlim[f] = 0
    return f


@njit
def _grow_flows(st, n):
    old = st.f_cap
    st.f_src = grow_ints(st, st.f_src, old, n, 0)
    st.f_dst = grow_ints(st, st.f_dst, old, n, 0)
    st.f_link = grow_ints(st, st.f_link, old, n, 0)
    st.f_poff = grow_ints(st, st.f_poff, old, n, 0)
    st.f_roff = grow_ints(st, st.f_roff, old, n, 0)
    st.f_hash = grow_ints(st, st.f_hash, old, n, 0)
    st.f_rate = grow_floats(st, st.f_rate, old, n, 0.0)
    st.f_line = grow_floats(st, st.f_line, old, n, 0.0)
    st.f_next_t = grow_ints(st, st.f_next_t, old, n, 0)
    st.f_nxt = grow_ints(st, st.f_nxt, old, n, 0)
    st.f_una = grow_ints(st, st.f_una, old, n, 0)
    st.f_end = grow_ints(st, st.f_end, old, n, 0)
    st.f_maxsent = grow_ints(st, st.f_maxsent, old, n, 0)
    st.f_msnd = grow_ints(st, st.f_msnd, old, n, -1)
    st.f_mhead = grow_ints(st, st.f_mhead, old, n, -1)
    st.f_mtail = grow_ints(st, st.f_mtail, old, n, -1)
    st.f_act = grow_ints(st, st.f_act, old, n, 0)
    st.f_anext = grow_ints(st, st.f_anext, old, n, -1)
    st.f_aprev = grow_ints(st, st.f_aprev, old, n, -1)
    st.f_rnxt = grow_ints(st, st.f_rnxt, old, n, 0)
    st.f_rcnt = grow_ints(st, st.f_rcnt, old, n, 0)
    st.f_nack = grow_ints(st, st.f_nack, old, n, -1)
    st.f_rto_t = grow_ints(st, st.f_rto_t, old, n, NEVER)
    st.f_rto_pend = grow_ints(st, st.f_rto_pend, old, n, 0)
    st.f_tmo = grow_ints(st, st.f_tmo, old, n, 0)
    st.f_cc = grow_ints(st, st.f_cc, old, n, 0)
    st.f_bacc = grow_ints(st, st.f_bacc, old, n, 0)
    st.f_bleft = grow_ints(st, st.f_bleft, old, n, -1)
    st.f_rpgen = grow_ints(st, st.f_rpgen, old, n, 0)
    st.f_rpwait = grow_ints(st, st.f_rpwait, old, n, 0)
    st.f_quiet = grow_ints(st, st.f_quiet, old, n, 0)
    st.f_dgram = grow_ints(st, st.f_dgram, old, n, 0)
    st.f_dgram_pay = grow_ints(st, st.f_dgram_pay, old, n, 0)
    st.f_cls = grow_ints(st, st.f_cls, old, n, 0)
    st.f_rel = grow_ints(st, st.f_rel, old, n, 0)
    st.f_rtx = grow_ints(st, st.f_rtx, old, n, 0)
    st.f_rtxm = grow_ints(st, st.f_rtxm, old, n, -1)
    st.f_rlim = grow_ints(st, st.f_rlim, old, n, 0)
    st.f_cap = n


@njit
def add_message(st, f, size, num_packets, at_s, has_callback):
    """Register a message of `size` payload bytes on queue pair f, handed over at at_s (now if
    that is not later). Returns its kernel index."""
    m = st.cnt[C_NMSG]
    if m == st.m_cap:
        n = 2 * m
        st.m_flow = grow_ints(st, st.m_flow, m, n, 0)
        st.m_size = grow_ints(st, st.m_size, m, n, 0)
        st.m_psn0 = grow_ints(st, st.m_psn0, m, n, 0)
        st.m_npk = grow_ints(st, st.m_npk, m, n, 0)
        st.m_next = grow_ints(st, st.m_next, m, n, -1)
        st.m_got = grow_ints(st, st.m_got, m, n, 0)
        st.m_start = grow_floats(st, st.m_start, m, n, 0.0)
        st.m_end = grow_floats(st, st.m_end, m, n, -1.0)
        st.m_cb = grow_ints(st, st.m_cb, m, n, 0)
        st.m_boff = grow_ints(st, st.m_boff, m, n, -1)
        st.m_cap = n
    st.cnt[C_NMSG] = m + 1
    st.m_flow[m] = f
    st.m_size[m] = size
    st.m_psn0[m] = 0
    st.m_npk[m] = num_packets
    st.m_next[m] = -1
    st.m_got[m] = 0
    st.m_start[m] = at_s
    st.m_end[m] = -1.0
    st.m_cb[m] = has_callback
    st.m_boff[m] = -1
    if st.f_rel[f] == REL_SR:
        _bit_words(st, m, (num_packets + 63) >> 6)
    now = st.clk[0]
    if at_s > now:
        push(st, max(to_ps(at_s), st.cnt[C_NOW]), EV_MESSAGE, m, 0)
    else:
        message_start(st, m, now)
    return m


@njit
def _bit_words(st, m, words):
    """Give message m `words` zeroed words in each selective-repeat bit table."""
    off = st.cnt[C_NBITS]
    need = off + words
    if need > st.b_cap:
        cap = max(need, 2 * st.b_cap)
        st.rbits = grow_ints(st, st.rbits, off, cap, 0)
        st.sbits = grow_ints(st, st.sbits, off, cap, 0)
        st.b_cap = cap
    st.m_boff[m] = off
    st.cnt[C_NBITS] = need


@njit
def add_source(st, f, payload_bytes, gap_s, poisson, start_s, stop_s):
    """Register a datagram source on flow f: one packet of `payload_bytes` every gap_s (the mean
    of exponential gaps when poisson), the first at start_s, none at or after stop_s."""
    s = st.cnt[C_NSRC]
    if s == st.s_cap:
        n = 2 * s
        st.s_flow = grow_ints(st, st.s_flow, s, n, 0)
        st.s_pay = grow_ints(st, st.s_pay, s, n, 0)
        st.s_poisson = grow_ints(st, st.s_poisson, s, n, 0)
        st.s_gap = grow_floats(st, st.s_gap, s, n, 0.0)
        st.s_stop = grow_floats(st, st.s_stop, s, n, 0.0)
        st.s_cap = n
    st.cnt[C_NSRC] = s + 1
    st.s_flow[s] = f
    st.s_pay[s] = payload_bytes
    st.s_poisson[s] = poisson
    st.s_gap[s] = gap_s
    st.s_stop[s] = stop_s
    if start_s < stop_s:
        push(st, max(to_ps(start_s), st.cnt[C_NOW]), EV_SOURCE, s, 0)
    return s


@njit
def take_outbox(st):
    """The requests waiting for Python, oldest first (and clear them)."""
    n = st.cnt[C_OBN]
    kinds = view(st.o_kind, n).copy()
    args = view(st.o_a, n).copy()
    st.cnt[C_OBN] = 0
    return kinds, args


@njit
def take_sent_bytes(st, f):
    """Bytes flow f sent since its reaction point was last told (and reset the count)."""
    b = st.f_bacc[f]
    st.f_bacc[f] = 0
    return b


@njit
def set_flow_rate(st, f, rate_bytes_per_s, next_event_s, bytes_left):
    """Apply the reaction point's rate; schedule its next timer event (if finite and the queue
    pair has data) and its byte counter (bytes_left < 0: off)."""
    st.f_rate[f] = rate_bytes_per_s
    st.f_bleft[f] = bytes_left
    st.f_rpgen[f] += 1
    if next_event_s < np.inf and st.f_act[f] != 0:
        st.f_rpwait[f] = 1
        push(st, max(ps_at_or_after(next_event_s), st.cnt[C_NOW]), EV_RP_TIMER, f,
             st.f_rpgen[f])
    else:
        st.f_rpwait[f] = 0


@njit
def rp_timer(st, f, gen):
    """A reaction-point timer came due: ask Python unless it was superseded. Returns whether."""
    if st.f_rpgen[f] == gen:
        st.f_rpwait[f] = 0
        request(st, O_RP_TIMER, f)
        return True
    return False
