"""A run's records held as columns once done: each reads back equal to the record sealed, a
record is sealed only once the instant its request finished has passed (writes of that
instant's observers land), and the columns give the summaries and the request rows the same
floats as the records themselves, to the bit."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from simcore.metrics import engine_summary, summarize
from simcore.records import RecordStore, RequestRecord
from simcore.request_rows import RequestRows
from simcore.token_times import DeliveryLog, TokenTimes


def _ranged(log: DeliveryLog, a: int, b: int) -> TokenTimes:
    t = TokenTimes()
    t.add_range(log, a, b)
    return t


def _mixed_records(seed: int, n: int = 300, *, num_logs: int = 2, pieces: bool = True
                   ) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """Records whose token times are ranges of `num_logs` delivery logs (with steps that
    deliver at one instant), pieces of several ranges, single times (not without `pieces`),
    none; and the same records with the times as plain lists."""
    rng = np.random.default_rng(seed)
    logs = []
    for _ in range(num_logs):
        log = DeliveryLog()
        gaps = rng.exponential(0.02, size=4000)
        gaps[rng.random(4000) < 0.02] = 0.0           # two steps of one instant
        log.times.extend(np.cumsum(gaps).tolist())
        logs.append(log)
    ranged, plain = [], []
    for i in range(n):
        log = logs[int(rng.integers(num_logs))]
        k = int(rng.choice([0, 1, 2, 3, 17, 64, 64, 64, 128]))
        a = int(rng.integers(0, 4000 - k))
        send = log.times[a] - float(rng.uniform(0, 0.5)) if k else float(rng.uniform(0, 50))
        kind = rng.random()
        if kind < 0.8 or k < 2 or not pieces:
            times = _ranged(log, a, a + k)
        else:                           # two ranges, or a single time then a range
            times = TokenTimes()
            if kind < 0.9:
                times.add_range(log, a, a + 1)
                times.add_range(log, a + 2, a + k + 1)
            else:
                times.append(log.times[a])
                times.add_range(log, a + 1, a + k)
        success = bool(k) and rng.random() < 0.95
        fields = dict(
            send_s=send if rng.random() < 0.97 or success else None, success=success,
            error=None if success else str(rng.choice(["timeout", "aborted"])),
            finished_s=None if rng.random() < 0.9 else send + 5.0,
            first_scheduled_s=(send + float(rng.uniform(-0.01, 0.2))
                               if rng.random() < 0.9 else None),
            server_s=float(rng.uniform(0, 0.01)), server_wait_s=float(rng.uniform(0, 0.005)),
            num_preemptions=int(rng.integers(0, 3)),
            num_cached_prompt_tokens=int(rng.integers(0, 64)),
            num_external_prompt_tokens=int(rng.integers(0, 16)),
            replica=None if rng.random() < 0.2 else int(rng.integers(0, 4)),
            network_s=float(rng.uniform(0, 0.1)))
        if fields["send_s"] is None:
            fields["first_scheduled_s"] = None
        prompt = int(rng.integers(1, 2000))
        ranged.append(RequestRecord(f"r{i}", prompt, max(k, 1), send - 0.1,
                                    token_times_s=times, **fields))
        plain.append(RequestRecord(f"r{i}", prompt, max(k, 1), send - 0.1,
                                   token_times_s=list(times), **fields))
    return ranged, plain


@pytest.mark.parametrize("seed", range(3))
def test_sealed_records_read_back_equal(seed):
    ranged, plain = _mixed_records(seed)
    for records in (ranged, plain):
        store = RecordStore.of(records)
        assert len(store) == len(records)
        assert list(store) == records
        assert store[-1] == records[-1] and store[3:7] == records[3:7]
        assert store == records
        np.testing.assert_array_equal(store.end_s, [r.end_s for r in records])
        np.testing.assert_array_equal(store.success, [r.success for r in records])
        assert store.errors == {i: r.error for i, r in enumerate(records) if r.error}


def test_a_record_is_sealed_after_its_instant_has_passed():
    """Writes at the instant a request finished (a step's observers after the client's) land;
    the record is moved into the columns at the next instant; `seal_all` takes the rest."""
    store = RecordStore()
    recs = [RequestRecord(str(i), 4, 1, float(i)) for i in range(3)]
    for r in recs:
        store.append(r)
    store.done(0, 1.0)
    store.done(1, 1.0)
    recs[0].network_s += 0.25                   # same instant: still the live object
    assert store[0] is recs[0]
    store.done(2, 2.0)                          # the clock moved on: 0 and 1 are sealed
    assert store[0] is not recs[0] and store[0] == recs[0] and store[0].network_s == 0.25
    assert store[2] is recs[2]
    with pytest.raises(RuntimeError, match="in flight"):
        RecordStore.of(store)
    store.seal_all()
    assert RecordStore.of(store) is store and store == recs
    assert RecordStore.of([]) == [] and len(RecordStore.of([]).end_s) == 0


@pytest.mark.parametrize("num_logs, pieces", [(2, True), (2, False), (1, False)])
@pytest.mark.parametrize("seed", range(3))
def test_summaries_and_rows_from_columns_equal_record_by_record(seed, num_logs, pieces):
    """Ranges of a log (the rows' ITLs taken by matrix) against plain lists (one request at a
    time), and every row against its record's own arithmetic; with every successful request a
    range, the summary's token times are gathered from one log or several at once."""
    ranged, plain = _mixed_records(seed, num_logs=num_logs, pieces=pieces)
    pcts = [50.0, 90.0, 99.0]
    assert summarize(ranged, selected_percentiles=pcts) == summarize(plain,
                                                                     selected_percentiles=pcts)
    assert engine_summary(ranged) == engine_summary(plain)
    rows = RequestRows.from_records(ranged)
    assert rows == RequestRows.from_records(plain)
    for r, row in zip(plain, rows):
        t = np.asarray(r.token_times_s, dtype=float)
        if r.success and t.size > 1:
            gaps = np.diff(t)
            gaps = gaps[gaps != 0]
            expect = (float(gaps.mean()) * 1e3, float(gaps.max()) * 1e3) if gaps.size else (
                None, None)
            assert (row["mean_itl_ms"], row["max_itl_ms"]) == expect
        else:
            assert "mean_itl_ms" not in row
        if r.first_scheduled_s is not None and r.send_s is not None:
            assert row["queue_ms"] == max(0.0, r.first_scheduled_s - r.send_s - r.server_s) * 1e3


def test_a_sealed_record_is_not_the_live_object_any_more():
    """Sealing drops the store's reference: a million done requests hold columns, not
    objects."""
    store = RecordStore()
    rec = RequestRecord("x", 4, 1, 0.0, send_s=0.0)
    store.append(rec)
    snapshot = copy.deepcopy(rec)
    store.done(0, 0.0)
    store.seal_all()
    rec.network_s = 9.0                         # written after the seal: not seen
    assert store[0] == snapshot


@pytest.mark.parametrize("num_logs, pieces", [(2, True), (3, False), (1, False)])
def test_a_block_of_token_times_is_the_records_times_concatenated(num_logs, pieces):
    ranged, _ = _mixed_records(7, num_logs=num_logs, pieces=pieces)
    store = RecordStore.of(ranged)
    rng = np.random.default_rng(1)
    for indices in (np.arange(len(store)), np.flatnonzero(store.success),
                    np.sort(rng.choice(len(store), 40, replace=False)), np.arange(0)):
        want = [np.asarray(ranged[i].token_times_s, dtype=float) for i in indices.tolist()]
        got = store.token_block(indices)
        np.testing.assert_array_equal(got, np.concatenate(want) if want else np.empty(0))
        got[:1] = -1.0                  # the block's own buffer: the logs are untouched
        assert store.token_block(indices)[:1].tolist() == [float(x) for x in
                                                            np.concatenate(want or [[]])[:1]]
