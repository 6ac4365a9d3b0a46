/* The record section of a RecordBatch v2, scanned without building a Python object per record.
 *
 * scan_records(data, count, base_timestamp, require_keys, last_offset_delta)
 *     -> (code, index, min_ts, max_ts)
 *
 * code 0 means the `count` records parse exactly to the end of `data`, with offset deltas rising
 * within [0, last_offset_delta] (so 0..count-1 when count is last_offset_delta + 1, as a
 * producer's batch has, and with gaps after compaction); any other code names the
 * rule that failed (the same codes, in the same order of checks, as the pure-Python reference
 * `tidelog.record.validation._scan_records_py`, which the tests hold this file to) and index is
 * the record it failed in. Kafka's varints: zig-zag, at most 5 bytes for int32 fields and 10 for
 * the timestamp delta (a varlong).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_wire.h"


static int scan(const uint8_t *data, Py_ssize_t size, int64_t count, int64_t base_ts,
                int require_keys, int64_t last_delta, int64_t *index, int64_t *min_ts,
                int64_t *max_ts) {
    const uint8_t *p = data, *end = data + size;
    int64_t previous = -1;
    for (int64_t i = 0; i < count; i++) {
        *index = i;
        record_t r;
        int code = parse_record(&p, end, &previous, last_delta, base_ts, require_keys, &r);
        if (r.has_timestamp) { /* counted even for a record that fails after it (the reference) */
            if (i == 0 || r.timestamp < *min_ts) *min_ts = r.timestamp;
            if (i == 0 || r.timestamp > *max_ts) *max_ts = r.timestamp;
        }
        if (code != SCAN_OK) return code;
    }
    *index = count;
    if (p != end) return SCAN_TRAILING;
    return SCAN_OK;
}

static PyObject *scan_records(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long count, base_ts, last_delta;
    int require_keys;
    if (!PyArg_ParseTuple(args, "y*LLpL", &view, &count, &base_ts, &require_keys, &last_delta))
        return NULL;
    int64_t index = 0, min_ts = 0, max_ts = 0;
    int code;
    Py_BEGIN_ALLOW_THREADS
    code = scan((const uint8_t *)view.buf, view.len, count, base_ts, require_keys, last_delta,
                &index, &min_ts, &max_ts);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("iLLL", code, (long long)index, (long long)min_ts, (long long)max_ts);
}

static PyMethodDef methods[] = {
    {"scan_records", scan_records, METH_VARARGS,
     "scan_records(data, count, base_timestamp, require_keys, last_offset_delta)"
     " -> (code, index, min_ts, max_ts)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
