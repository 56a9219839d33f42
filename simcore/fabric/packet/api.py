"""The kernel's entry points from Python. Each takes the state handle (`new_state`) and lends
the kernel functions a borrowed view of it for the duration of the call."""

from __future__ import annotations

import numpy as np

from simcore.fabric.packet import events, heap, nic
from simcore.fabric.packet._jit import njit, view
from simcore.fabric.packet.link import busy_done_s
from simcore.fabric.packet.clock import to_ps
from simcore.fabric.packet.state import (C_LAST, C_NMSG, C_NOW, C_NSMP, CF_SMP, K_DATA,
                                         NUM_CLASSES,
                                         NUM_COUNTERS, kernel_view,
                                         load_topology as _load_topology)


@njit
def load_topology(ref, host, host_index, salt, pool, src, dst, rev, rate, delay, cap, ecn, kmin,
                  kmax, pmax, headroom, pause_s, credits, nh_off, nh_links, cfg):
    _load_topology(kernel_view(ref), host, host_index, salt, pool, src, dst, rev, rate, delay,
                   cap, ecn, kmin, kmax, pmax, headroom, pause_s, credits, nh_off, nh_links, cfg)


@njit
def run_events(ref, stop_t):
    return events.run_events(kernel_view(ref), stop_t)


@njit
def next_time(ref):
    return heap.next_time(kernel_view(ref))


@njit
def add_flow(ref, src, dst, path, rpath, fhash_bits, line_bytes_per_s, cc, dgram, cls, rel):
    return nic.add_flow(kernel_view(ref), src, dst, path, rpath, fhash_bits, line_bytes_per_s,
                        cc, dgram, cls, rel)


@njit
def add_message(ref, f, size, num_packets, at_s, has_callback):
    return nic.add_message(kernel_view(ref), f, size, num_packets, at_s, has_callback)


@njit
def add_source(ref, f, payload_bytes, gap_s, poisson, start_s, stop_s):
    return nic.add_source(kernel_view(ref), f, payload_bytes, gap_s, poisson, start_s, stop_s)


@njit
def take_outbox(ref):
    return nic.take_outbox(kernel_view(ref))


@njit
def take_sent_bytes(ref, f):
    return nic.take_sent_bytes(kernel_view(ref), f)


@njit
def set_flow_rate(ref, f, rate_bytes_per_s, next_event_s, bytes_left):
    nic.set_flow_rate(kernel_view(ref), f, rate_bytes_per_s, next_event_s, bytes_left)


@njit
def send_cnp(ref, f, quiet_until_s, now):
    nic.send_cnp(kernel_view(ref), f, quiet_until_s, now)


@njit
def read_clock(ref):
    return kernel_view(ref).clk[0]


@njit
def set_clock(ref, t):
    st = kernel_view(ref)
    st.clk[0] = t
    st.clk[2] = t
    st.cnt[C_NOW] = to_ps(t)
    st.cnt[C_LAST] = st.cnt[C_NOW]


@njit
def read_flow_datagram_bytes(ref, f):
    return kernel_view(ref).f_dgram_pay[f]


@njit
def read_counters(ref):
    st = kernel_view(ref)
    return view(st.cnt, NUM_COUNTERS).copy()


@njit
def read_links(ref, now):
    """Per-link figures as of `now`: bytes, busy seconds, max queue, queue integral, marks,
    drops, pause frames and paused seconds per class ([link, class])."""
    st = kernel_view(ref)
    n = st.n_links
    nk = n * NUM_CLASSES
    busy = np.empty(n)
    qint = np.empty(n)
    paused = np.empty(nk)
    for l in range(n):
        busy[l] = busy_done_s(st, l, now)
        qint[l] = st.s_qint[l] + st.q_bytes[l] * (now - st.s_qt[l])
    for k in range(nk):
        paused[k] = st.s_paused[k]
        if st.paused[k] != 0:
            paused[k] += now - st.paused_at[k]
    hist = view(st.hist, n * st.n_hist).copy().reshape((n, st.n_hist))
    return (view(st.s_bytes, n).copy(), busy, view(st.s_maxq, n).copy(), qint,
            view(st.s_marks, n).copy(), view(st.s_drops, n).copy(),
            view(st.s_pauses, nk).copy().reshape((n, NUM_CLASSES)),
            paused.reshape((n, NUM_CLASSES)), hist)


@njit
def read_messages(ref):
    st = kernel_view(ref)
    n = st.cnt[C_NMSG]
    return view(st.m_start, n).copy(), view(st.m_end, n).copy()


@njit
def read_in_flight_payload(ref):
    st = kernel_view(ref)
    total = 0
    for p in range(st.p_cap):
        if st.p_kind[p] == K_DATA:
            total += st.p_pay[p]
    return total


@njit
def read_sample_interval(ref):
    """The interval of the samples held, s: the configured one, doubled each time the kernel
    held its most samples (`events._sample`)."""
    return kernel_view(ref).cfg[CF_SMP]


@njit
def read_samples(ref):
    st = kernel_view(ref)
    k = st.cnt[C_NSMP]
    return view(st.smp, k * st.n_links).copy().reshape((k, st.n_links))


@njit
def read_busy_parts(ref):
    """Busy seconds credited per link (whole frames), whether a frame is on the wire, its end."""
    st = kernel_view(ref)
    n = st.n_links
    return (view(st.s_busy, n).copy(), view(st.busy, n).astype(np.float64),
            view(st.tx_end, n).copy())


@njit
def read_busy_at(ref, t):
    st = kernel_view(ref)
    n = st.n_links
    out = np.empty(n)
    for l in range(n):
        out[l] = busy_done_s(st, l, t)
    return out


@njit
def read_switch_peaks(ref):
    st = kernel_view(ref)
    return view(st.sw_maxused, st.n_nodes).copy()


@njit
def read_queue_bytes(ref):
    st = kernel_view(ref)
    return view(st.q_bytes, st.n_links).copy()
