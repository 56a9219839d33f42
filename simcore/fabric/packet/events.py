"""The event loop of one fabric: pop the earliest event, hand it to the device it concerns, and
stop when the next event lies beyond the requested time, when nothing is left, or when a device
left a request for Python (a message callback, a DCQCN decision) in the outbox.

Arrival of a packet at a node (host or switch) and a port finishing a frame are the two events
every packet-hop costs; the rest are timers. Superseded timers (a pause already lifted, a
retransmission timer already re-armed) are recognised by generation numbers and skipped; when
nothing is left the clock is set back to the last event that did something, so they never extend
a run. Utilization samples are taken here too: before the first event at or after each sample
instant, every link's busy time up to that instant.

Time. Events are keyed by whole picoseconds (`clock`): a duration (serialisation,
propagation, a pause, a timeout, a pacing gap) is rounded once to the nearest picosecond and
added to the integer clock, so sums are exact and two events meant for the same instant tie and
run in scheduling order. Instants handed in from Python are taken to the nearest picosecond
(message and source starts), or to the first at or after them where Python's own clock must
have reached them when the event runs (DCQCN timers, the CNP pacing window). Handlers see the
clock in seconds too (`clk[0]`, the picosecond count over `PS_PER_S`), which measurements use.
"""

from __future__ import annotations

from simcore.fabric.packet._jit import njit
from simcore.fabric.packet.clock import PS_PER_S, ps_at_or_before, ps_later
from simcore.fabric.packet.heap import (EV_ARRIVE, EV_CREDIT, EV_MESSAGE, EV_PAUSE_END,
                                        EV_RP_TIMER, EV_RTO, EV_SOURCE, EV_TX_DONE, EV_WAKE,
                                        EV_XOFF_REFRESH, NUM_KINDS, pop, push)
from simcore.fabric.packet.link import busy_done_s, finish_tx, set_paused
from simcore.fabric.packet.nic import (message_start, nic_kick, nic_receive, rp_timer, rto_check,
                                       source_emit)
from simcore.fabric.packet.state import (C_EVENTS, C_HN, C_LAST, C_NOW, C_NSMP, C_OBN, C_STALL,
                                         CF_SMP, CF_SMPMAX,
                                         K_DATA, K_PAUSE, NEVER, NUM_CLASSES, free_packet,
                                         grow_floats)
from simcore.fabric.packet.switch import switch_kick, switch_receive, switch_release, xoff_refresh

IDLE = 0        # no events left
STOPPED = 1     # the next event is later than the stop time
REQUESTS = 2    # the outbox holds requests for Python
STALLED = 3     # a queue pair reached nic.STALL_TIMEOUTS timeouts in a row (cnt[C_STALL])


@njit
def kick(st, l, now):
    """Let port l start a frame if it can (hosts also pull from their queue pairs)."""
    if st.n_host[st.l_src[l]] != 0:
        nic_kick(st, l, now)
    else:
        switch_kick(st, l, now)


@njit
def _arrive(st, l, p, now):
    n = st.l_dst[l]
    if st.p_kind[p] == K_PAUSE:
        port = st.l_rev[l]
        xoff = st.p_arg[p]
        k = port * NUM_CLASSES + st.p_psn[p]      # a PAUSE frame's PSN field is its class
        free_packet(st, p)
        if set_paused(st, k, xoff, now):
            kick(st, port, now)
        elif xoff != 0:
            push(st, ps_later(st, st.l_pause_s[port]), EV_PAUSE_END, k, st.pause_gen[k])
        return
    if st.n_host[n] != 0:
        nic_receive(st, n, l, p, now)
    else:
        switch_receive(st, n, l, p, now)


@njit
def _tx_done(st, l, now):
    p = finish_tx(st, l, now)
    n = st.l_src[l]
    if st.n_host[n] == 0 and st.p_kind[p] == K_DATA:
        switch_release(st, n, p, now)
    kick(st, l, now)


@njit
def _sample(st):
    k = st.cnt[C_NSMP]
    nl = st.n_links
    if k == st.smp_cap:
        if k >= st.cfg[CF_SMPMAX]:
            # Held full: the interval doubles. Sample j was taken at (j + 1) w, so those at the
            # doubled interval's instants are the odd ones (samples are cumulative busy times,
            # so dropping the others loses nothing of the coarser series); the one due now, at
            # (k + 1) w, falls between them, and the next is at (k + 2) w.
            half = k // 2
            for j in range(half):
                for l in range(nl):
                    st.smp[j * nl + l] = st.smp[(2 * j + 1) * nl + l]
            st.cnt[C_NSMP] = half
            st.cfg[CF_SMP] *= 2.0
            st.clk[1] = (half + 1) * st.cfg[CF_SMP]
            return
        cap = min(2 * k, int(st.cfg[CF_SMPMAX]))
        st.smp = grow_floats(st, st.smp, k * nl, cap * nl, 0.0)
        st.smp_cap = cap
    t = st.clk[1]
    for l in range(nl):
        st.smp[k * nl + l] = busy_done_s(st, l, t)
    st.cnt[C_NSMP] = k + 1
    st.clk[1] = (k + 2) * st.cfg[CF_SMP]


@njit
def run_events(st, stop_t):
    """Process events up to and including time stop_t (seconds, on the picosecond grid).
    Returns IDLE, STOPPED, REQUESTS or STALLED."""
    cnt = st.cnt
    sampling = st.cfg[CF_SMP] > 0.0
    stop_ps = ps_at_or_before(stop_t)
    while cnt[C_HN] > 0:
        t_ps = st.h_t[0]
        if t_ps > stop_ps:
            return STOPPED
        t = t_ps / PS_PER_S
        if sampling:
            while t >= st.clk[1]:
                _sample(st)
        t_ps, code, b = pop(st)
        cnt[C_NOW] = t_ps
        st.clk[0] = t
        cnt[C_EVENTS] += 1
        kind = code % NUM_KINDS
        a = code // NUM_KINDS
        active = True
        if kind == EV_ARRIVE:
            _arrive(st, a, b, t)
        elif kind == EV_TX_DONE:
            _tx_done(st, a, t)
        elif kind == EV_WAKE:
            if t_ps >= st.wake_t[a]:
                st.wake_t[a] = NEVER
            nic_kick(st, a, t)
        elif kind == EV_CREDIT:
            st.credits[a] += b
            kick(st, a // NUM_CLASSES, t)
        elif kind == EV_MESSAGE:
            message_start(st, a, t)
        elif kind == EV_PAUSE_END:
            active = st.pause_gen[a] == b and set_paused(st, a, 0, t)
            if active:
                kick(st, a // NUM_CLASSES, t)
        elif kind == EV_XOFF_REFRESH:
            active = xoff_refresh(st, a, b, t)
        elif kind == EV_RTO:
            active = rto_check(st, a, t)
            if cnt[C_STALL] > 0:
                return STALLED
        elif kind == EV_RP_TIMER:
            active = rp_timer(st, a, b)
        elif kind == EV_SOURCE:
            source_emit(st, a, t)
        if active:
            st.clk[2] = t
            cnt[C_LAST] = t_ps
        if cnt[C_OBN] > 0:
            return REQUESTS
    # Only superseded timers (stale pauses, refreshes, timeouts) may have run since the last
    # event that did something: idle since then.
    st.clk[0] = st.clk[2]
    cnt[C_NOW] = cnt[C_LAST]
    return IDLE
