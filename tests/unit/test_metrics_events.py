"""A load's metrics from its events (chload/core/metrics.py): the OpenMetrics text, the
histogram's cumulative buckets, lag, and labels without secrets."""

from __future__ import annotations

import pytest

from chload.core import metrics
from chload.core.run import Event


@pytest.mark.parametrize(("source", "label"), [
    ("data/*.csv", "data/*.csv"),
    ("s3://bucket/in/*.gz", "s3://bucket/in/*.gz"),
    ("https://user:pw@host:8443/a.csv?token=t#x", "https://host:8443/a.csv"),
    ("postgresql://loader:pw@127.0.0.1:5432/shop/public.t", "postgresql://127.0.0.1:5432/shop/public.t"),
])
def test_a_source_label_has_no_userinfo_query_or_fragment(source: str, label: str) -> None:
    assert metrics.without_secrets(source) == label


def test_events_make_counters_a_histogram_and_lag() -> None:
    load = metrics.LoadMetrics("db.t", 'a"b')
    load.on_event(Event("plan", files_total=3))
    load.on_event(Event("done", "u1", 10, 100, rejected=2, seconds=0.07))
    load.on_event(Event("done", "u2", 5, 50, seconds=7.0))
    load.on_event(Event("lag", "kafka://h:9092/t/0", rows=42))
    text = metrics.exposition([load])
    labels = 'table="db.t",source="a\\"b"'
    assert f"chload_rows_loaded_total{{{labels}}} 15" in text
    assert f"chload_bytes_loaded_total{{{labels}}} 150" in text
    assert f"chload_rows_rejected_total{{{labels}}} 2" in text
    assert f'chload_unit_commit_seconds_bucket{{{labels},le="0.05"}} 0' in text
    assert f'chload_unit_commit_seconds_bucket{{{labels},le="0.1"}} 1' in text
    assert f'chload_unit_commit_seconds_bucket{{{labels},le="10.0"}} 2' in text
    assert f'chload_unit_commit_seconds_bucket{{{labels},le="+Inf"}} 2' in text
    assert f"chload_unit_commit_seconds_sum{{{labels}}} 7.07" in text
    assert f'chload_kafka_messages_behind{{{labels},partition="kafka://h:9092/t/0"}} 42' in text
    assert load.lag_seconds() > 0  # one unit planned, not loaded
    load.on_event(Event("fail", "u3", error="x"))
    assert load.lag_seconds() == 0
    assert text.endswith("# EOF\n") and "# TYPE chload_lag_seconds gauge" in text
