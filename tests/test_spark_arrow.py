"""The compiled codec's Arrow paths, which the Spark source and sink use: rows encoded straight
from Arrow columns, and the columnar batches the source hands Spark, against the record path.
(Here, not in test_codec.py: they need pyarrow, from the spark extra.)"""

from __future__ import annotations

from array import array

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_codec import batches_st, maybe_bytes
from tidelog.record import ProducerRecord, decode_records, iter_headers
from tidelog.record import _codec as compiled
from tidelog.record.batch import encode_records_py
from tidelog.record.columns import batch_items, decode_columns
from tidelog.spark.arrow import columns_to_batch, records_to_batch

pytestmark = pytest.mark.spark


@settings(max_examples=150)
@given(st.lists(st.tuples(maybe_bytes, maybe_bytes), min_size=1, max_size=40), st.data())
def test_encode_rows_from_arrow_columns(rows: list[tuple], data: st.DataObject) -> None:
    keys = pa.array([k for k, _ in rows], pa.binary())
    values = pa.array([v for _, v in rows], pa.binary())
    order = data.draw(st.permutations(range(len(rows))))
    _, k_offsets, k_data = keys.buffers()
    k_valid = keys.buffers()[0]
    v_valid, v_offsets, v_data = values.buffers()
    section = compiled.encode_rows(
        array("q", order).tobytes(),
        k_offsets,
        k_data if k_data is not None else b"",
        k_valid,
        v_offsets,
        v_data if v_data is not None else b"",
        v_valid,
    )
    want = [ProducerRecord(rows[i][0], rows[i][1], (), 7) for i in order]
    assert section == encode_records_py(want, 7)[0]


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(batches_st(), st.booleans())
def test_arrow_rows_match_the_record_path(buf: bytes, include_headers: bool) -> None:
    """The Spark source's columnar batches hold exactly the rows the per-record path built."""
    items = [item for _, item in batch_items(buf)]
    records = [
        r for pos, h in iter_headers(buf) if not h.is_control for r in decode_records(buf, pos)
    ]
    columnar = columns_to_batch(decode_columns(items, include_headers), "t", 3, include_headers)
    columnar.validate(full=True)
    assert columnar.equals(records_to_batch(records, "t", 3, include_headers))
