"""The packet kernel's time base: event times and the deadlines compared with them are whole
picoseconds (int64), so two events meant for the same instant tie exactly, whatever sums of
seconds led to them, and run in the order they were scheduled. The clock itself is
`st.cnt[C_NOW]` (and `st.clk[0]`, the same instant in seconds)."""

from __future__ import annotations

import numpy as np

from simcore.fabric.packet._jit import njit
from simcore.fabric.packet.state import C_NOW, NEVER

PS_PER_S = 1e12
"""Picoseconds per second."""
HORIZON_S = 4.6e6
"""Seconds from which a time is `NEVER` (about 53 days: 4.6e18 ps stays inside int64)."""


@njit
def to_ps(t):
    """Seconds `t` (a duration) as whole picoseconds (nearest), `NEVER` from about 53 days on
    (inf too)."""
    if not t < HORIZON_S:
        return NEVER
    return np.int64(np.rint(t * PS_PER_S))


@njit
def ps_later(st, dur_s):
    """The instant `dur_s` seconds after the clock, in picoseconds (the duration rounded once)."""
    return st.cnt[C_NOW] + to_ps(dur_s)


@njit
def ps_at_or_after(t):
    """The first whole picosecond k whose time in seconds, k / PS_PER_S, is not before instant
    `t` (an instant given in seconds from Python: an event at k sees a clock of at least t);
    `NEVER` from about 53 days on."""
    if not t < HORIZON_S:
        return NEVER
    k = np.int64(np.ceil(t * PS_PER_S))
    while k / PS_PER_S < t:
        k += 1
    while k > 0 and (k - 1) / PS_PER_S >= t:
        k -= 1
    return k


@njit
def ps_at_or_before(t):
    """The last whole picosecond k with k / PS_PER_S not after instant `t` (seconds)."""
    if not t < HORIZON_S:
        return NEVER
    k = np.int64(np.floor(t * PS_PER_S))
    while k / PS_PER_S > t:
        k -= 1
    while (k + 1) / PS_PER_S <= t:
        k += 1
    return k
