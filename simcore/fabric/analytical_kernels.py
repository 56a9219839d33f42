"""The analytical fabric's event loop and the step DAGs that run on it, as kernels over arrays
(`simcore.fabric.analytical_compiled` holds the state and calls them).

They do what `AnalyticalFabric.send`, `_reserve` and `run` do with `simcore.dag.executor.DagRun`
as the callback of a step's transfers, operation for operation: the same heaps ordered by (time,
sequence), the same reservation of each message on its path, and each step DAG resolved depth
first from the same stack, so that every number comes out the same to the bit. A transfer of a
step (a "job") is sent, delivered and released inside the kernel; a message sent from Python
hands its delivery back to Python (`run_core` returns it).

State (columns named by the constants below):
- `clock` float64 [3]: the fabric's time, and the time and clock of a send found behind it;
- `counts` int64: the sequence counter shared by both heaps, the numbers of messages, of waiting
  starts and ends, of reserved, of spans and of delivered messages, and the sends made by jobs
  since Python last read them;
- messages: `msg_f` float64 [M, 3] (start, ideal, end: NaN until delivered) and `msg_i` int64
  [M, 4] (wire bytes, payload bytes, route, and the job's node: >= 0 for a job's transfer, -1
  for a Python message with a callback, -2 for one without); `msg_job` the job of a transfer;
- routes: `route_i` int64 [R, 2] (first link in `route_links`, number of links) and `route_f`
  float64 [R, 3] (sum of delays, sum of inverse rates, slowest rate: `_known_route`'s terms);
- links: `link_f` float64 [L, 3] (free-from time, inverse rate, delay);
- the heaps: times in `*_t`, (sequence, message) in `*_i`;
- `order` (messages in reservation order), `spans` (each hop's begin, in that order), `done`
  (messages in delivery order);
- jobs: `node_f` float64 [N, 7], `node_i` int64 [N, 6] over the nodes of the jobs in progress
  (each job's from its base), `children` (each node's children, numbered within its job),
  `job_i` int64 [J, 3] (node base, children base, nodes not yet resolved).
"""

from __future__ import annotations

import math

from simcore.compiled import compile_kernel
from simcore.dag.graph import TRANSFER

NOW, BEHIND_AT, BEHIND_NOW = range(3)
SEQ, NUM_MSG, NUM_STARTS, NUM_ENDS, NUM_ORDER, NUM_SPANS, NUM_DONE, NUM_SENT, PENDING = (
    range(9))
START, IDEAL, END = range(3)                    # msg_f
WIRE, SIZE, ROUTE, NODE = range(4)              # msg_i
PYTHON_CALLBACK, PYTHON_QUIET = -1, -2          # msg_i[:, NODE] of messages sent from Python
FIRST_LINK, NUM_LINKS = range(2)                # route_i
DELAY_SUM, INV_RATE_SUM, MIN_RATE = range(3)    # route_f
FREE, INV_RATE, DELAY = range(3)                # link_f
LAT, DUR, NVLINK, READY, N_START, FINISH, N_IDEAL = range(7)     # node_f
KIND, N_ROUTE, N_SIZE, CHILD_OFF, NUM_CHILDREN, REMAINING, CAUSE = range(7)    # node_i
NODE_BASE, CHILD_BASE, UNRESOLVED = range(3)    # job_i

IDLE, JOB_DONE, STOPPED, PYTHON_DELIVERY, BEHIND, UNROUTED = range(6)
"""What `run_core` and the job kernels return: nothing left before the limit, a job complete
(its index), stopped, a Python message delivered (its id), a send behind the clock, a job's
transfer on a queue pair without a route (its index among the job's fabric transfers)."""


@compile_kernel(inline=True)
def _push(heap_t, heap_i, n, t, q, m):
    """Push (t, q, m) on the heap of `n` entries; its new size."""
    i = n
    while i > 0:
        p = (i - 1) >> 1
        tp = heap_t[p]
        if tp < t or (tp == t and heap_i[p, 0] < q):
            break
        heap_t[i] = tp
        heap_i[i, 0] = heap_i[p, 0]
        heap_i[i, 1] = heap_i[p, 1]
        i = p
    heap_t[i] = t
    heap_i[i, 0] = q
    heap_i[i, 1] = m
    return n + 1


@compile_kernel(inline=True)
def _pop(heap_t, heap_i, n):
    """Remove the least entry (the caller read it at index 0) of the heap of `n`; its new size."""
    n -= 1
    t = heap_t[n]
    q = heap_i[n, 0]
    m = heap_i[n, 1]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (heap_t[c + 1] < heap_t[c]
                          or (heap_t[c + 1] == heap_t[c] and heap_i[c + 1, 0] < heap_i[c, 0])):
            c += 1
        if t < heap_t[c] or (t == heap_t[c] and q < heap_i[c, 0]):
            break
        heap_t[i] = heap_t[c]
        heap_i[i, 0] = heap_i[c, 0]
        heap_i[i, 1] = heap_i[c, 1]
        i = c
    heap_t[i] = t
    heap_i[i, 0] = q
    heap_i[i, 1] = m
    return n


@compile_kernel(inline=True)
def _reserve(mid, counts, msg_f, msg_i, route_i, route_links, link_f, payload, header, order,
             spans, ends_t, ends_i):
    """`AnalyticalFabric._reserve`: serialise message mid on its path's links, queue its end."""
    start = msg_f[mid, START]
    wire = msg_i[mid, WIRE]
    size = msg_i[mid, SIZE]
    first = (size if size < payload else payload) + header
    r = msg_i[mid, ROUTE]
    k0 = route_i[r, FIRST_LINK]
    x = 0.0
    slack = -math.inf
    s = counts[NUM_SPANS]
    for k in range(k0, k0 + route_i[r, NUM_LINKS]):
        li = route_links[k]
        inv = link_f[li, INV_RATE]
        b = start + x
        f = link_f[li, FREE]
        if f > b:
            b = f
            e = b + wire * inv
            c = e - x - first * inv
            if c > slack:
                slack = c
        else:
            e = b + wire * inv
        link_f[li, FREE] = e
        spans[s] = b
        s += 1
        x += link_f[li, DELAY] + first * inv
    counts[NUM_SPANS] = s
    end = start + msg_f[mid, IDEAL]
    if slack + x > end:
        end = slack + x
    order[counts[NUM_ORDER]] = mid
    counts[NUM_ORDER] += 1
    q = counts[SEQ]
    counts[SEQ] = q + 1
    counts[NUM_ENDS] = _push(ends_t, ends_i, counts[NUM_ENDS], end, q, mid)


@compile_kernel(inline=True)
def _start(mid, start, clock, counts, msg_f, msg_i, route_i, route_links, link_f, payload,
           header, order, spans, starts_t, starts_i, ends_t, ends_i):
    """`AnalyticalFabric._start`: reserve mid now if it starts at the clock and no earlier start
    waits, else queue it until the clock reaches its start."""
    if start <= clock[NOW] and not (counts[NUM_STARTS] > 0 and starts_t[0] <= start):
        _reserve(mid, counts, msg_f, msg_i, route_i, route_links, link_f, payload, header,
                 order, spans, ends_t, ends_i)
    else:
        q = counts[SEQ]
        counts[SEQ] = q + 1
        counts[NUM_STARTS] = _push(starts_t, starts_i, counts[NUM_STARTS], start, q, mid)


@compile_kernel
def send_core(route, size, start, wire, ideal, node, clock, counts, msg_f, msg_i, route_i,
              route_links, link_f, payload, header, order, spans, starts_t, starts_i, ends_t,
              ends_i):
    """A message sent from Python (its route, wire bytes and ideal time planned there): logged
    and started; its id."""
    mid = counts[NUM_MSG]
    counts[NUM_MSG] = mid + 1
    msg_f[mid, START] = start
    msg_f[mid, IDEAL] = ideal
    msg_f[mid, END] = math.nan
    msg_i[mid, WIRE] = wire
    msg_i[mid, SIZE] = size
    msg_i[mid, ROUTE] = route
    msg_i[mid, NODE] = node
    _start(mid, start, clock, counts, msg_f, msg_i, route_i, route_links, link_f, payload,
           header, order, spans, starts_t, starts_i, ends_t, ends_i)
    return mid


@compile_kernel(inline=True)
def _release(job, i, end, stack, sp, node_f, node_i, children, job_i):
    """`DagRun._release`: node i of the job finished at `end`; push on `stack` (sp entries) the
    nodes that now have all their inputs. Returns the new sp."""
    base = job_i[job, NODE_BASE]
    g = base + i
    node_f[g, FINISH] = end
    job_i[job, UNRESOLVED] -= 1
    k0 = job_i[job, CHILD_BASE] + node_i[g, CHILD_OFF]
    for k in range(k0, k0 + node_i[g, NUM_CHILDREN]):
        c = children[k]
        gc = base + c
        if end >= node_f[gc, READY]:
            node_f[gc, READY] = end
            node_i[gc, CAUSE] = i
        node_i[gc, REMAINING] -= 1
        if node_i[gc, REMAINING] == 0:
            stack[sp] = c
            sp += 1
    return sp


@compile_kernel(inline=True)
def _drain(job, stack, sp, clock, counts, msg_f, msg_i, msg_job, route_i, route_f, route_links,
           link_f, payload, header, order, spans, starts_t, starts_i, ends_t, ends_i, node_f,
           node_i, children, job_i):
    """`DagRun._drain`: resolve the job's nodes on `stack` (sp of them) and all they release,
    depth first; a fabric transfer is sent as `ClusterRuntime.send_routed` sends it. Returns
    -1, or the index of a transfer whose start is behind the clock (its times in `clock`)."""
    base = job_i[job, NODE_BASE]
    while sp > 0:
        sp -= 1
        i = stack[sp]
        g = base + i
        t = node_f[g, READY]
        if node_i[g, KIND] == TRANSFER:
            t += node_f[g, LAT]
            node_f[g, N_START] = t
            r = node_i[g, N_ROUTE]
            if r >= 0:
                now = clock[NOW]
                at = t
                if at < now:
                    if at < now - 1e-9:
                        clock[BEHIND_AT] = at
                        clock[BEHIND_NOW] = now
                        return i
                    at = now
                size = node_i[g, N_SIZE]
                first = (size if size < payload else payload) + header
                packets = -(-size // payload)
                if packets == 0:
                    packets = 1
                wire = size + packets * header
                mid = counts[NUM_MSG]
                counts[NUM_MSG] = mid + 1
                msg_f[mid, START] = at
                msg_f[mid, IDEAL] = (route_f[r, DELAY_SUM] + first * route_f[r, INV_RATE_SUM]
                                     + (wire - first) / route_f[r, MIN_RATE])
                msg_f[mid, END] = math.nan
                msg_i[mid, WIRE] = wire
                msg_i[mid, SIZE] = size
                msg_i[mid, ROUTE] = r
                msg_i[mid, NODE] = i
                msg_job[mid] = job
                counts[NUM_SENT] += 1
                counts[PENDING] -= 1
                _start(mid, at, clock, counts, msg_f, msg_i, route_i, route_links, link_f,
                       payload, header, order, spans, starts_t, starts_i, ends_t, ends_i)
                continue
            end = t + node_f[g, NVLINK]
        else:
            node_f[g, N_START] = t
            end = t + node_f[g, DUR]
        sp = _release(job, i, end, stack, sp, node_f, node_i, children, job_i)
    return -1


@compile_kernel
def start_job_core(job, base, cbase, t0, kind, num_inputs, child_off, num_children, child_of,
                   transfer, ic, fabric_nodes, routes, dur, size, lat, stack, clock, counts,
                   msg_f, msg_i, msg_job, route_i, route_f, route_links, link_f, payload, header,
                   order, spans, starts_t, starts_i, ends_t, ends_i, node_f, node_i, children,
                   job_i):
    """`DagRun.start` of a DAG as job `job`, its nodes from `base` and children from `cbase` of
    the jobs' arrays: its structure (`_JobColumns`) and this step's durations, sizes and
    latencies written there, then every node it can resolved. Returns (UNROUTED, the transfer)
    with nothing written where a transfer with bytes has no route; else (JOB_DONE or IDLE, the
    job) or (BEHIND, the node)."""
    for k in range(len(fabric_nodes)):
        if routes[k] < 0 and size[fabric_nodes[k]] > 0:
            return UNROUTED, k
    n = len(kind)
    for i in range(n):
        g = base + i
        node_f[g, LAT] = lat[i]
        node_f[g, DUR] = dur[i]
        node_f[g, NVLINK] = 0.0
        node_f[g, READY] = t0
        node_f[g, N_START] = t0
        node_f[g, FINISH] = 0.0
        node_f[g, N_IDEAL] = 0.0
        node_i[g, KIND] = kind[i]
        node_i[g, N_ROUTE] = -1
        node_i[g, N_SIZE] = size[i]
        node_i[g, CHILD_OFF] = child_off[i]
        node_i[g, NUM_CHILDREN] = num_children[i]
        node_i[g, REMAINING] = num_inputs[i]
        node_i[g, CAUSE] = -1
    for k in range(len(transfer)):      # `_Port.nvlink_s` (a fabric transfer's is unused)
        i = transfer[k]
        if size[i] > 0:
            node_f[base + i, NVLINK] = size[i] / ic[k]
    for k in range(len(fabric_nodes)):
        i = fabric_nodes[k]
        if size[i] > 0:
            node_i[base + i, N_ROUTE] = routes[k]
            counts[PENDING] += 1
    for k in range(len(child_of)):
        children[cbase + k] = child_of[k]
    job_i[job, NODE_BASE] = base
    job_i[job, CHILD_BASE] = cbase
    job_i[job, UNRESOLVED] = n
    sp = 0
    for i in range(n):
        if num_inputs[i] == 0:
            stack[sp] = i
            sp += 1
    behind = _drain(job, stack, sp, clock, counts, msg_f, msg_i, msg_job, route_i, route_f,
                    route_links, link_f, payload, header, order, spans, starts_t, starts_i,
                    ends_t, ends_i, node_f, node_i, children, job_i)
    if behind >= 0:
        return BEHIND, behind
    return (JOB_DONE if job_i[job, UNRESOLVED] == 0 else IDLE), job


@compile_kernel
def run_core(limit, stopping, stack, clock, counts, msg_f, msg_i, msg_job, route_i, route_f,
             route_links, link_f, payload, header, order, spans, done, starts_t, starts_i,
             ends_t, ends_i, node_f, node_i, children, job_i):
    """`AnalyticalFabric.run` up to `limit` with the jobs' transfers delivered here (as
    `DagRun._transfer_done`). Returns (IDLE, -1) when nothing is left at or before the limit,
    (JOB_DONE, the job), (STOPPED, -1) when `stopping` and a job's delivery leaves nothing at the
    clock, (PYTHON_DELIVERY, the message) or (BEHIND, the transfer)."""
    while True:
        ns = counts[NUM_STARTS]
        ne = counts[NUM_ENDS]
        if ns > 0 and starts_t[0] <= limit and (ne == 0 or starts_t[0] <= ends_t[0]):
            start = starts_t[0]
            mid = starts_i[0, 1]
            counts[NUM_STARTS] = _pop(starts_t, starts_i, ns)
            if start > clock[NOW]:
                clock[NOW] = start
            _reserve(mid, counts, msg_f, msg_i, route_i, route_links, link_f, payload, header,
                     order, spans, ends_t, ends_i)
            continue
        if not (ne > 0 and ends_t[0] <= limit):
            return IDLE, -1
        end = ends_t[0]
        mid = ends_i[0, 1]
        counts[NUM_ENDS] = _pop(ends_t, ends_i, ne)
        if end > clock[NOW]:
            clock[NOW] = end
        msg_f[mid, END] = end
        done[counts[NUM_DONE]] = mid
        counts[NUM_DONE] += 1
        i = msg_i[mid, NODE]
        if i == PYTHON_CALLBACK:
            return PYTHON_DELIVERY, mid
        if i < 0:
            continue
        # A job's transfer has arrived: `DagRun._transfer_done`.
        job = msg_job[mid]
        base = job_i[job, NODE_BASE]
        g = base + i
        node_f[g, N_IDEAL] = msg_f[mid, IDEAL]
        sp = _release(job, i, end, stack, 0, node_f, node_i, children, job_i)
        if sp:
            behind = _drain(job, stack, sp, clock, counts, msg_f, msg_i, msg_job, route_i,
                            route_f, route_links, link_f, payload, header, order, spans,
                            starts_t, starts_i, ends_t, ends_i, node_f, node_i, children, job_i)
            if behind >= 0:
                return BEHIND, behind
        if job_i[job, UNRESOLVED] == 0:
            return JOB_DONE, job
        now = clock[NOW]
        if stopping and not (counts[NUM_ENDS] > 0 and ends_t[0] <= now) and not (
                counts[NUM_STARTS] > 0 and starts_t[0] <= now):
            return STOPPED, -1
