"""XID counting: windowed last value that clears, exact totals, bounded memory under a storm."""

from gpuagent.devices.xid import XidBook


def test_last_xid_clears_after_the_window():
    book = XidBook(window_seconds=300)
    book.record(0, 79, when=1000.0)
    assert book.record_for(0, now=1000.5).last_code == 79
    assert book.record_for(0, now=1299.0).last_code == 79
    late = book.record_for(0, now=1301.0)
    assert late.last_code is None and late.recent == {} and late.totals == {79: 1}
    assert late.last_seen_unix == 1000.0


def test_repeats_are_counted_per_code():
    book = XidBook(window_seconds=60)
    for t in range(10):
        book.record(1, 13, when=100.0 + t)
        if t == 5:
            book.record(1, 31, when=105.5)
    record = book.record_for(1, now=110.0)
    assert record.totals == {13: 10, 31: 1} and record.recent == {13: 10, 31: 1}
    assert record.last_code == 13
    assert book.record_for(1, now=162.5).recent == {13: 8, 31: 1}  # seconds 102..109 are in the window
    assert book.record_for(1, now=166.0).recent == {13: 4}
    assert book.record_for(0, now=110.0).totals == {}


def test_storm_memory_is_bounded_by_the_window():
    book = XidBook(window_seconds=10)
    for i in range(50_000):
        book.record(0, 48, when=1000.0 + i / 1000)  # 50 s of 1000 events/s
    record = book.record_for(0, now=1050.0)
    assert record.totals == {48: 50_000}
    assert 9_000 <= record.recent[48] <= 11_000
    assert len(book._buckets[0]) <= 11
