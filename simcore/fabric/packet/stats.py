"""Measurements of a packet fabric, read out of its kernel state into the fields every backend
reports (FabricStats, LinkStats), plus the kernel's own counters.

Byte accounting is per transmission: payload sent counts every data frame a NIC (or a traffic
source) put on the wire, retransmissions included; each such frame is later delivered to its
destination NIC, dropped, or still in flight, so sent = delivered + dropped + in flight holds
exactly at every instant. Duplicates a go-back-N or selective-repeat receiver discards count as
delivered; what the application got is in `messages`, and the datagram messages that lost a
packet (never delivered) in `lost_message_ids`.

Queues count data bytes waiting plus the frame on the wire. The queue histogram of a port counts
the data packets that arrived at it by the queue they found (bins of queue_histogram_bin_bytes,
the last one open-ended), what a packet experiences rather than a time average (for that:
queue_byte_s / duration). Utilization per sample is the share of the sample a link spent
serialising frames, control frames included.
"""

from __future__ import annotations

import math

import numpy as np

from simcore.fabric.packet import api
from simcore.fabric.packet.state import (C_CNPS, C_DATA_HOPS, C_DELIV_PAY, C_DGRAM_PKTS,
                                         C_DROP_PAY, C_DROPS, C_EVENTS, C_FRAMES, C_LOST,
                                         C_MARKS, C_NACKS, C_PAUSES, C_PLIVE, C_RETX, C_RETX_PAY,
                                         C_SENT_PAY, C_TIMEOUTS)
from simcore.fabric.protocol import FabricStats, LinkStats, MessageResult
from simcore.fabric.utilization import max_intervals

COUNTERS = {
    "events": C_EVENTS, "packet_hops": C_DATA_HOPS, "frames": C_FRAMES,
    "payload_sent_bytes": C_SENT_PAY, "payload_delivered_bytes": C_DELIV_PAY,
    "payload_dropped_bytes": C_DROP_PAY, "retransmitted_bytes": C_RETX_PAY, "drops": C_DROPS,
    "retransmits": C_RETX, "ecn_marks": C_MARKS, "cnps": C_CNPS, "pause_frames": C_PAUSES,
    "timeouts": C_TIMEOUTS, "nacks": C_NACKS, "datagrams_delivered": C_DGRAM_PKTS,
    "live_packets": C_PLIVE, "unreliable_drops": C_LOST,
}
"""Name -> index of the kernel counters `PacketFabric.counters()` reports."""


def utilization(st, interval_s: float, now: float
                ) -> tuple[list[float], list[list[float]], float]:
    """(sample start times, utilization per sample per link, the samples' interval) over
    [0, now): busy time in each interval over its length (the last one may be shorter). The
    interval is `interval_s` (the configured one), doubled where the kernel held its most
    samples, and again here while [0, now) would take more than `max_intervals` of them (a run
    stopped long after its last event): samples being cumulative, every other one is kept."""
    if interval_s <= 0 or now <= 0:
        return [], [], interval_s
    interval_s = api.read_sample_interval(st)
    taken = api.read_samples(st)
    busy_s, on_wire, tx_end = api.read_busy_parts(st)
    limit = max_intervals(len(busy_s))
    step = 1
    while math.ceil(now / (interval_s * step) - 1e-9) > limit:
        step *= 2
    if step > 1:                # sample j was taken at (j + 1) x the interval
        taken = taken[step - 1::step]
        interval_s *= step
    num = max(1, math.ceil(now / interval_s - 1e-9))
    busy = np.zeros((num + 1, len(busy_s)))
    have = min(len(taken), num - 1)
    busy[1:1 + have] = taken[:have]
    # Instants after the last event: only frames still on the wire change the busy time.
    instants = np.append(np.arange(1 + have, num) * interval_s, now)
    unfinished = np.maximum(tx_end[None, :] - instants[:, None], 0.0) * on_wire[None, :]
    busy[1 + have:] = busy_s[None, :] - unfinished
    starts = np.arange(num) * interval_s
    spans = np.minimum(interval_s, now - starts)
    util = np.diff(busy, axis=0) / spans[:, None]
    return starts.tolist(), util.tolist(), interval_s


def build_stats(st, now: float, messages: list[MessageResult], interval_s: float,
                num_rate_cuts: int, lost_message_ids: list[int] | None = None) -> FabricStats:
    """FabricStats of the state as of `now`."""
    (sent, busy, maxq, qint, marks, drops, pauses, paused, hist) = api.read_links(st, now)
    links = [LinkStats(bytes_sent=int(sent[i]), busy_s=float(busy[i]),
                       max_queue_bytes=int(maxq[i]), queue_byte_s=float(qint[i]),
                       ecn_marks=int(marks[i]), drops=int(drops[i]),
                       pfc_pause_frames=int(pauses[i].sum()), paused_s=float(paused[i].sum()),
                       pfc_pause_frames_by_class=[int(x) for x in pauses[i]],
                       paused_s_by_class=[float(x) for x in paused[i]])
             for i in range(len(sent))]
    cnt = api.read_counters(st)
    t_s, util, interval_s = utilization(st, interval_s, now)
    histogram = {i: hist[i].tolist() for i in range(len(hist)) if hist[i].any()}
    return FabricStats(
        messages=messages, links=links, duration_s=now,
        payload_sent_bytes=int(cnt[C_SENT_PAY]), payload_delivered_bytes=int(cnt[C_DELIV_PAY]),
        payload_dropped_bytes=int(cnt[C_DROP_PAY]),
        payload_in_flight_bytes=int(api.read_in_flight_payload(st)),
        retransmitted_bytes=int(cnt[C_RETX_PAY]), num_drops=int(cnt[C_DROPS]),
        num_retransmits=int(cnt[C_RETX]), num_ecn_marks=int(cnt[C_MARKS]),
        num_cnps=int(cnt[C_CNPS]), num_rate_cuts=num_rate_cuts,
        num_pfc_pause_frames=int(cnt[C_PAUSES]), utilization_t_s=t_s, utilization=util,
        utilization_interval_s=interval_s,
        queue_histogram_bytes=histogram, lost_message_ids=list(lost_message_ids or []))
