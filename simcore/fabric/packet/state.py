"""The packet kernel's state: one record per fabric of flat tables (nodes, links and their ports,
queue pairs, messages, packets, the event heap), created by `new_state` and handed to every
kernel function. Nothing lives in module globals except constants.

Indices: nodes and links are the topology's; queue pairs (flows), messages, packets and traffic
sources are numbered by the kernel as they are created. A FIFO of packets is a singly linked list
through `p_next` with head and tail per port; -1 ends lists and marks "none" everywhere (and is
never used as an index). Table fields are pointers into arrays the state owns (see `_jit`);
tables that grow (flows, messages, packets, heap, paths, outbox, samples) are replaced by copies
of twice the size, with their capacity in a `*_cap` field (the outgrown arrays stay owned until
the state is freed: at most as much memory again). Two-dimensional tables are flattened
row-major.
"""

from __future__ import annotations

import types as pytypes
from types import SimpleNamespace

import numpy as np

from simcore.fabric.packet._jit import HAVE_NUMBA, data_ptr, njit, view

# Packet kinds. Data travels in its flow's traffic class; the others are control frames that take
# the strict-priority control queue of every port and are never paused, marked or dropped.
K_DATA = 0
K_ACK = 1
K_NACK = 2
K_CNP = 3
K_PAUSE = 4

# Flow control (cfg[CF_FC]).
FC_NONE = 0
FC_PFC = 1
FC_CREDIT = 2

# Counters (cnt[...]).
C_SEQ = 0          # event sequence numbers handed out
C_HN = 1           # events in the heap
C_OBN = 2          # outbox entries waiting for Python
C_PFREE = 3        # head of the free-packet list
C_PLIVE = 4        # packets allocated and not yet freed
C_NFLOW = 5
C_NMSG = 6
C_NPATH = 7        # entries used in `path`
C_NSRC = 8
C_SENT_PAY = 9     # payload bytes of every data frame a NIC transmitted (retransmissions too)
C_DELIV_PAY = 10   # payload bytes of every data frame that reached its destination NIC
C_DROP_PAY = 11    # payload bytes of dropped data frames
C_RETX_PAY = 12    # payload bytes retransmitted
C_DROPS = 13
C_RETX = 14        # data frames retransmitted
C_MARKS = 15
C_CNPS = 16
C_PAUSES = 17      # XOFF frames sent
C_EVENTS = 18
C_DATA_HOPS = 19   # data frames put on a link (packet-hops)
C_FRAMES = 20      # all frames put on a link
C_TIMEOUTS = 21
C_NACKS = 22
C_NSMP = 23        # utilization samples taken
C_DGRAM_PKTS = 24  # datagrams delivered
C_NBITS = 25       # words used in the selective-repeat bit tables
C_LOST = 26        # data frames of unreliable messages dropped (never resent)
C_NOW = 27         # the clock in whole picoseconds (clk[0] is the same instant in seconds)
C_LAST = 28        # the last event that did something, in picoseconds (clk[2] in seconds)
C_STALL = 29       # 1 + the queue pair whose timeouts in a row reached STALL_TIMEOUTS (0: none)
NUM_COUNTERS = 32

# Settings (cfg[...]), fixed when the fabric is built.
CF_FC = 0          # FC_NONE, FC_PFC or FC_CREDIT
CF_REL = 1         # 1: lossy classes too run a reliable transport (see f_rel)
CF_AR = 2          # 1: adaptive routing of data on queue depth
CF_CC = 3          # 1: DCQCN at the NICs
CF_PAY = 4         # payload bytes of a full packet
CF_HDR = 5         # header bytes per packet
CF_CTRL = 6        # bytes of a control frame
CF_ACKN = 7        # the receiver ACKs every this many in-order packets (and every message end)
CF_RTO = 8         # retransmission timeout, s
CF_WIN = 9         # most unacknowledged packets per queue pair (0: no limit)
CF_ALPHA = 10      # PFC dynamic-threshold factor
CF_XON = 11        # PFC XON offset, bytes
CF_HBIN = 12       # queue histogram bin width, bytes
CF_ARTH = 14       # adaptive routing keeps the hashed port unless another is this much shorter
CF_SMP = 15        # utilization sample interval, s (0: off)
CF_NHOST = 16      # number of hosts
CF_LOSSLESS = 17   # bit c set: traffic class c is lossless (PFC priority or credited lane)
CF_SMPMAX = 18     # most utilization samples held; past it the interval doubles (every other kept)
NUM_CFG = 24

# Transports of a queue pair (f_rel).
REL_NONE = 0       # no acknowledgements: lossless class, or unreliable datagram messages
REL_GBN = 1        # go-back-N with ACKs, NACKs and a retransmission timeout
REL_SR = 2         # selective repeat: the receiver keeps out-of-order packets, only gaps resent

NUM_CLASSES = 8
"""Traffic classes (802.1p priorities, InfiniBand virtual lanes); per-(port, class) tables are
indexed link * NUM_CLASSES + class."""

INF = np.inf
NEVER = 1 << 62
"""A deadline that never comes (picoseconds, the kernel's time base: `clock`; about 53 days)."""
NUM_UNIFORMS = 4096
"""Uniform random numbers drawn from the fabric's Generator at a time."""


def _allocate(st, num_nodes, num_links, num_hist, num_nh):
    """Give `st` every field, sized for the topology; growable tables start small."""
    st.n_nodes = num_nodes
    st.n_links = num_links
    st.n_hist = num_hist
    st.clk = _floats(st, 3, 0.0)                 # [now, next utilization sample, last activity]
    st.cnt = _ints(st, NUM_COUNTERS, 0)
    st.cfg = _floats(st, NUM_CFG, 0.0)
    st.u_buf = _floats(st, NUM_UNIFORMS, 0.0)    # uniforms from the Generator, used in order
    st.u_pos = NUM_UNIFORMS
    # Nodes.
    st.n_host = _ints(st, num_nodes, 0)
    st.n_hidx = _ints(st, num_nodes, -1)         # index among hosts, -1 for switches
    st.n_salt = _ints(st, num_nodes, 0)          # ECMP salt (uint64 bits)
    st.sw_pool = _ints(st, num_nodes, 0)         # PFC shared buffer
    st.sw_shared = _ints(st, num_nodes, 0)       # shared buffer in use
    st.sw_used = _ints(st, num_nodes, 0)         # all data bytes held
    st.sw_maxused = _ints(st, num_nodes, 0)
    # Links: constants.
    st.l_src = _ints(st, num_links, 0)
    st.l_dst = _ints(st, num_links, 0)
    st.l_rev = _ints(st, num_links, 0)
    st.l_rate = _floats(st, num_links, 0.0)      # bytes/s
    st.l_delay = _floats(st, num_links, 0.0)     # s
    st.l_cap = _ints(st, num_links, -1)          # lossy egress buffer, bytes (-1: unbounded)
    st.l_ecn = _ints(st, num_links, 0)
    st.l_kmin = _floats(st, num_links, 0.0)
    st.l_kmax = _floats(st, num_links, 0.0)
    st.l_pmax = _floats(st, num_links, 0.0)
    st.l_hdrm = _ints(st, num_links, 0)          # PFC headroom of this link's ingress port
    st.l_pause_s = _floats(st, num_links, 0.0)   # time one XOFF pauses this link
    nk = num_links * NUM_CLASSES
    # Links: the egress port at l_src.
    st.q_head = _ints(st, nk, -1)                # data FIFO per class
    st.q_tail = _ints(st, nk, -1)
    st.q_mask = _ints(st, num_links, 0)          # bit c: class c's data FIFO is not empty
    st.c_head = _ints(st, num_links, -1)         # control FIFO
    st.c_tail = _ints(st, num_links, -1)
    st.q_bytes = _ints(st, num_links, 0)         # data bytes held, the one on the wire too
    st.busy = _ints(st, num_links, 0)
    st.tx_pkt = _ints(st, num_links, -1)
    st.tx_end = _floats(st, num_links, 0.0)
    st.paused = _ints(st, nk, 0)                 # per class
    st.pause_gen = _ints(st, nk, 0)
    st.paused_at = _floats(st, nk, 0.0)
    st.credits = _ints(st, nk, 0)                # bytes the receiver's lane can still take
    st.wake_t = _ints(st, num_links, NEVER)      # pending NIC pacing wake-up, ps
    st.act_cur = _ints(st, nk, -1)               # round-robin ring of active queue pairs per class
    st.act_n = _ints(st, nk, 0)
    st.act_mask = _ints(st, num_links, 0)        # bit c: class c has active queue pairs
    # Links: the ingress port at l_dst, per class (PFC accounting of the receiving switch).
    st.in_bytes = _ints(st, nk, 0)
    st.in_hdrm = _ints(st, nk, 0)
    st.xoff = _ints(st, nk, 0)
    st.xoff_gen = _ints(st, nk, 0)
    # Links: measurements.
    st.s_bytes = _ints(st, num_links, 0)
    st.s_busy = _floats(st, num_links, 0.0)
    st.s_maxq = _ints(st, num_links, 0)
    st.s_qint = _floats(st, num_links, 0.0)
    st.s_qt = _floats(st, num_links, 0.0)
    st.s_marks = _ints(st, num_links, 0)
    st.s_drops = _ints(st, num_links, 0)
    st.s_pauses = _ints(st, nk, 0)               # per class
    st.s_paused = _floats(st, nk, 0.0)
    st.hist = _ints(st, num_links * num_hist, 0)  # [link, bin]
    # Equal-cost next hops per (node, host index), for adaptive routing.
    st.nh_off = _ints(st, num_nh + 1, 0)
    st.nh_links = _ints(st, 1, 0)
    # Queue pairs (flows).
    nf = 16
    st.f_cap = nf
    st.f_src = _ints(st, nf, 0)
    st.f_dst = _ints(st, nf, 0)
    st.f_link = _ints(st, nf, 0)                 # first hop
    st.f_poff = _ints(st, nf, 0)                 # data path in `path`
    st.f_roff = _ints(st, nf, 0)                 # reverse path (ACK, NACK, CNP)
    st.f_hash = _ints(st, nf, 0)
    st.f_rate = _floats(st, nf, 0.0)             # pacing rate, bytes/s
    st.f_line = _floats(st, nf, 0.0)
    st.f_next_t = _ints(st, nf, 0)               # earliest start of the next frame, ps
    st.f_nxt = _ints(st, nf, 0)                  # next PSN to send
    st.f_una = _ints(st, nf, 0)                  # oldest unacknowledged PSN
    st.f_end = _ints(st, nf, 0)                  # one past the last PSN queued
    st.f_maxsent = _ints(st, nf, 0)              # one past the highest PSN ever sent
    st.f_msnd = _ints(st, nf, -1)                # message holding PSN f_nxt
    st.f_mhead = _ints(st, nf, -1)               # oldest message not fully acknowledged
    st.f_mtail = _ints(st, nf, -1)
    st.f_act = _ints(st, nf, 0)
    st.f_anext = _ints(st, nf, -1)
    st.f_aprev = _ints(st, nf, -1)
    st.f_rnxt = _ints(st, nf, 0)                 # receiver: next PSN expected
    st.f_rcnt = _ints(st, nf, 0)                 # receiver: in-order packets since last ACK
    st.f_nack = _ints(st, nf, -1)                # receiver: PSN last NACKed
    st.f_rto_t = _ints(st, nf, NEVER)            # retransmission deadline, ps
    st.f_rto_pend = _ints(st, nf, 0)
    st.f_tmo = _ints(st, nf, 0)                  # retransmission timeouts since its last ACK
    st.f_cc = _ints(st, nf, 0)                   # DCQCN reaction point attached
    st.f_bacc = _ints(st, nf, 0)                 # bytes sent not yet told to the reaction point
    st.f_bleft = _ints(st, nf, -1)               # bytes until its byte counter fires (-1 none)
    st.f_rpgen = _ints(st, nf, 0)
    st.f_rpwait = _ints(st, nf, 0)               # a reaction-point timer is scheduled
    st.f_quiet = _ints(st, nf, 0)                # no CNP query before this time, ps
    st.f_dgram = _ints(st, nf, 0)                # datagrams: no reliability, no messages
    st.f_dgram_pay = _ints(st, nf, 0)            # datagram payload delivered
    st.f_cls = _ints(st, nf, 0)                  # traffic class of its data
    st.f_rel = _ints(st, nf, 0)                  # REL_NONE, REL_GBN or REL_SR
    st.f_rtx = _ints(st, nf, 0)                  # selective repeat: resend PSNs from here
    st.f_rtxm = _ints(st, nf, -1)                # message holding f_rtx
    st.f_rlim = _ints(st, nf, 0)                 # to here (those not known to have arrived)
    st.path_cap = 64
    st.path = _ints(st, 64, 0)
    # Messages.
    nm = 16
    st.m_cap = nm
    st.m_flow = _ints(st, nm, 0)
    st.m_size = _ints(st, nm, 0)
    st.m_psn0 = _ints(st, nm, 0)
    st.m_npk = _ints(st, nm, 0)
    st.m_next = _ints(st, nm, -1)
    st.m_got = _ints(st, nm, 0)                  # packets accepted by the receiver
    st.m_start = _floats(st, nm, 0.0)
    st.m_end = _floats(st, nm, -1.0)
    st.m_cb = _ints(st, nm, 0)
    st.m_boff = _ints(st, nm, -1)                # selective repeat: first word in the bit tables
    # Selective repeat, one bit per packet of each message (words from m_boff): packets the
    # receiver holds (`rbits`) and packets the sender has learnt it holds (`sbits`).
    st.b_cap = 16
    st.rbits = _ints(st, 16, 0)
    st.sbits = _ints(st, 16, 0)
    # Packets.
    npk = 1024
    st.p_cap = npk
    st.p_kind = _ints(st, npk, -1)               # -1: free
    st.p_flow = _ints(st, npk, 0)
    st.p_psn = _ints(st, npk, 0)
    st.p_msg = _ints(st, npk, 0)
    st.p_size = _ints(st, npk, 0)
    st.p_pay = _ints(st, npk, 0)
    st.p_hop = _ints(st, npk, 0)
    st.p_in = _ints(st, npk, 0)                  # ingress link at the current switch
    st.p_ecn = _ints(st, npk, 0)
    st.p_rev = _ints(st, npk, 0)                 # 1: travels the flow's reverse path
    st.p_arg = _ints(st, npk, 0)                 # PAUSE: 1 XOFF / 0 XON
    st.p_next = _ints(st, npk, 0)
    for i in range(npk - 1):
        st.p_next[i] = i + 1
    st.p_next[npk - 1] = -1
    # Event heap keyed (time, sequence); code = a * NUM_KINDS + kind.
    nh = 1024
    st.h_cap = nh
    st.h_t = _ints(st, nh, 0)                    # ps
    st.h_seq = _ints(st, nh, 0)
    st.h_code = _ints(st, nh, 0)
    st.h_b = _ints(st, nh, 0)
    # Requests for Python (message callbacks, DCQCN).
    st.o_cap = 64
    st.o_kind = _ints(st, 64, 0)
    st.o_a = _ints(st, 64, 0)
    # Traffic sources (constant bit rate or Poisson datagrams).
    ns = 4
    st.s_cap = ns
    st.s_flow = _ints(st, ns, 0)
    st.s_pay = _ints(st, ns, 0)
    st.s_poisson = _ints(st, ns, 0)
    st.s_gap = _floats(st, ns, 0.0)
    st.s_stop = _floats(st, ns, 0.0)
    # Utilization samples: busy seconds per link, completed by each sample instant [row, link].
    st.smp_cap = 4
    st.smp = _floats(st, 4 * num_links, 0.0)


def _py_ints(st, n, fill):
    a = np.full(n, fill, np.int64)
    st.own_i.append(a)
    return a


def _py_floats(st, n, fill):
    a = np.full(n, fill, np.float64)
    st.own_f.append(a)
    return a


def _field_types():
    """numba types of the state's fields, read off a small allocation in plain Python."""
    from numba import typeof
    from numba.core import types
    env = dict(globals(), _ints=_py_ints, _floats=_py_floats)
    allocate = pytypes.FunctionType(_allocate.__code__, env)
    proto = SimpleNamespace(own_i=[], own_f=[])
    allocate(proto, 2, 2, 2, 2)
    fields = [("own_i", types.ListType(types.int64[::1])),
              ("own_f", types.ListType(types.float64[::1])),
              ("rng", typeof(np.random.default_rng(0)))]
    for name, value in vars(proto).items():
        if name in ("own_i", "own_f"):
            continue
        if isinstance(value, np.ndarray):
            fields.append((name, types.CPointer(typeof(value).dtype)))
        else:
            fields.append((name, types.int64))
    return fields


@njit
def _ints(st, n, fill):
    a = np.full(n, fill, np.int64)
    st.own_i.append(a)
    return data_ptr(a)


@njit
def _floats(st, n, fill):
    a = np.full(n, fill, np.float64)
    st.own_f.append(a)
    return data_ptr(a)


@njit
def grow_ints(st, ptr, old_n, new_n, fill):
    """A table of new_n integers starting with the old_n at ptr, the rest `fill`."""
    a = np.full(new_n, fill, np.int64)
    a[:old_n] = view(ptr, old_n)
    st.own_i.append(a)
    return data_ptr(a)


@njit
def grow_floats(st, ptr, old_n, new_n, fill):
    a = np.full(new_n, fill, np.float64)
    a[:old_n] = view(ptr, old_n)
    st.own_f.append(a)
    return data_ptr(a)


if HAVE_NUMBA:
    from numba.core import cgutils, imputils
    from numba.core import types as nbtypes
    from numba.core.datamodel import models
    from numba.core.typing.templates import AttributeTemplate
    from numba.experimental import structref
    from numba.extending import (infer_getattr, intrinsic, lower_getattr_generic,
                                 lower_setattr_generic, register_model)
    from numba.typed import List

    @structref.register
    class KernelStateType(nbtypes.StructRef):
        def preprocess_fields(self, fields):
            return tuple((name, nbtypes.unliteral(typ)) for name, typ in fields)

    class KernelState(structref.StructRefProxy):
        """Python's handle on a kernel state (read it through the kernel's entry points)."""

    structref.define_boxing(KernelStateType, KernelState)
    STATE_TYPE = KernelStateType(_field_types())

    class KernelViewType(nbtypes.Type):
        """A borrowed pointer to a kernel state's fields: no reference counting when kernel
        functions pass it around or read it. Valid while the state it came from is held (an
        entry point's argument)."""

        def __init__(self, state_type):
            self.state_type = state_type
            super().__init__(name="KernelView")

        @property
        def key(self):
            return self.state_type

    @register_model(KernelViewType)
    class _KernelViewModel(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            payload = dmm.lookup(fe_type.state_type.get_data_type()).get_value_type()
            super().__init__(dmm, fe_type, payload.as_pointer())

    @infer_getattr
    class _KernelViewAttributes(AttributeTemplate):
        key = KernelViewType

        def generic_resolve(self, typ, attr):
            return typ.state_type.field_dict.get(attr)

    def _payload(context, builder, view_type, ptr):
        return cgutils.create_struct_proxy(view_type.state_type.get_data_type())(
            context, builder, ref=ptr)

    @lower_getattr_generic(KernelViewType)
    def _view_getattr(context, builder, typ, val, attr):
        value = getattr(_payload(context, builder, typ, val), attr)
        return imputils.impl_ret_borrowed(context, builder, typ.state_type.field_dict[attr], value)

    @lower_setattr_generic(KernelViewType)
    def _view_setattr(context, builder, sig, args, attr):
        view_type, value_type = sig.args
        ptr, value = args
        data = _payload(context, builder, view_type, ptr)
        field_type = view_type.state_type.field_dict[attr]
        value = context.cast(builder, value, value_type, field_type)
        old = getattr(data, attr)
        context.nrt.incref(builder, field_type, value)
        context.nrt.decref(builder, field_type, old)
        setattr(data, attr, value)

    @intrinsic
    def kernel_view(typingctx, state):
        """The borrowed view of a kernel state (see KernelViewType)."""
        def codegen(context, builder, sig, args):
            return structref._Utils(context, builder, sig.args[0]).get_data_pointer(args[0])
        return KernelViewType(state)(state), codegen

    _I1 = nbtypes.int64[::1]
    _F1 = nbtypes.float64[::1]
    _allocate_jit = njit(_allocate)

    @njit
    def _new_state(num_nodes, num_links, num_hist, num_nh, rng):
        st = structref.new(STATE_TYPE)
        st.own_i = List.empty_list(_I1)
        st.own_f = List.empty_list(_F1)
        st.rng = rng
        _allocate_jit(kernel_view(st), num_nodes, num_links, num_hist, num_nh)
        return st
else:
    def kernel_view(state):
        return state

    def _new_state(num_nodes, num_links, num_hist, num_nh, rng):
        st = SimpleNamespace(own_i=[], own_f=[], rng=rng)
        _allocate(st, num_nodes, num_links, num_hist, num_nh)
        return st


def new_state(num_nodes: int, num_links: int, num_hist: int, num_nh: int,
              rng: np.random.Generator):
    """A fresh kernel state for a topology of that many nodes and links."""
    return _new_state(num_nodes, num_links, num_hist, num_nh, rng)


@njit
def uniform(st):
    """The next uniform [0, 1) number of the fabric's Generator."""
    if st.u_pos == NUM_UNIFORMS:
        fresh = st.rng.random(NUM_UNIFORMS)
        buf = view(st.u_buf, NUM_UNIFORMS)
        buf[:] = fresh
        st.u_pos = 0
    u = st.u_buf[st.u_pos]
    st.u_pos += 1
    return u


@njit
def alloc_packet(st, kind, flow, size):
    """A packet from the free list (the pool doubles when empty), with its common fields set."""
    p = st.cnt[C_PFREE]
    if p < 0:
        _grow_packets(st)
        p = st.cnt[C_PFREE]
    st.cnt[C_PFREE] = st.p_next[p]
    st.cnt[C_PLIVE] += 1
    st.p_kind[p] = kind
    st.p_flow[p] = flow
    st.p_size[p] = size
    st.p_pay[p] = 0
    st.p_psn[p] = 0
    st.p_msg[p] = -1
    st.p_hop[p] = 1
    st.p_in[p] = -1
    st.p_ecn[p] = 0
    st.p_rev[p] = 0
    st.p_arg[p] = 0
    st.p_next[p] = -1
    return p


@njit
def free_packet(st, p):
    st.p_kind[p] = -1
    st.p_next[p] = st.cnt[C_PFREE]
    st.cnt[C_PFREE] = p
    st.cnt[C_PLIVE] -= 1


@njit
def drop_data(st, p):
    """Count data packet p as dropped and free it; an unreliable message it belonged to is lost
    (its end time -2: never delivered)."""
    st.cnt[C_DROPS] += 1
    st.cnt[C_DROP_PAY] += st.p_pay[p]
    m = st.p_msg[p]
    if m >= 0 and st.f_rel[st.p_flow[p]] == REL_NONE:
        st.m_end[m] = -2.0
        st.cnt[C_LOST] += 1
    free_packet(st, p)


@njit
def _grow_packets(st):
    n = st.p_cap
    m = 2 * n
    st.p_kind = grow_ints(st, st.p_kind, n, m, -1)
    st.p_flow = grow_ints(st, st.p_flow, n, m, 0)
    st.p_psn = grow_ints(st, st.p_psn, n, m, 0)
    st.p_msg = grow_ints(st, st.p_msg, n, m, 0)
    st.p_size = grow_ints(st, st.p_size, n, m, 0)
    st.p_pay = grow_ints(st, st.p_pay, n, m, 0)
    st.p_hop = grow_ints(st, st.p_hop, n, m, 0)
    st.p_in = grow_ints(st, st.p_in, n, m, 0)
    st.p_ecn = grow_ints(st, st.p_ecn, n, m, 0)
    st.p_rev = grow_ints(st, st.p_rev, n, m, 0)
    st.p_arg = grow_ints(st, st.p_arg, n, m, 0)
    st.p_next = grow_ints(st, st.p_next, n, m, 0)
    for i in range(n, m - 1):
        st.p_next[i] = i + 1
    st.p_next[m - 1] = st.cnt[C_PFREE]
    st.cnt[C_PFREE] = n
    st.p_cap = m


@njit
def load_topology(st, host, host_index, salt, pool, src, dst, rev, rate, delay, cap, ecn, kmin,
                  kmax, pmax, headroom, pause_s, credits, nh_off, nh_links, cfg):
    """Copy the resolved per-node, per-link and fabric-wide parameters into a fresh state."""
    nn = st.n_nodes
    nl = st.n_links
    view(st.n_host, nn)[:] = host
    view(st.n_hidx, nn)[:] = host_index
    view(st.n_salt, nn)[:] = salt
    view(st.sw_pool, nn)[:] = pool
    view(st.l_src, nl)[:] = src
    view(st.l_dst, nl)[:] = dst
    view(st.l_rev, nl)[:] = rev
    view(st.l_rate, nl)[:] = rate
    view(st.l_delay, nl)[:] = delay
    view(st.l_cap, nl)[:] = cap
    view(st.l_ecn, nl)[:] = ecn
    view(st.l_kmin, nl)[:] = kmin
    view(st.l_kmax, nl)[:] = kmax
    view(st.l_pmax, nl)[:] = pmax
    view(st.l_hdrm, nl)[:] = headroom
    view(st.l_pause_s, nl)[:] = pause_s
    for l in range(nl):
        for c in range(NUM_CLASSES):
            st.credits[l * NUM_CLASSES + c] = credits[l]
    view(st.nh_off, nh_off.shape[0])[:] = nh_off
    st.nh_links = grow_ints(st, st.nh_links, 0, nh_links.shape[0], 0)
    view(st.nh_links, nh_links.shape[0])[:] = nh_links
    view(st.cfg, NUM_CFG)[:] = cfg
    st.clk[1] = cfg[CF_SMP] if cfg[CF_SMP] > 0 else INF
