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

enum {
    SCAN_OK = 0,
    SCAN_VARINT = 1,         /* a varint is cut short or longer than its type allows */
    SCAN_RECORD_LENGTH = 2,  /* a record's length is < 1 or runs past the batch */
    SCAN_OFFSET_DELTA = 3,   /* offset deltas do not rise within [0, last_offset_delta] */
    SCAN_KEY_LENGTH = 4,
    SCAN_VALUE_LENGTH = 5,
    SCAN_HEADER_COUNT = 6,
    SCAN_HEADER_KEY = 7,     /* a header key is null, negative or runs past the record */
    SCAN_HEADER_KEY_UTF8 = 8,
    SCAN_HEADER_VALUE = 9,
    SCAN_RECORD_END = 10,    /* the fields do not end where the record's length says */
    SCAN_TRAILING = 11,      /* bytes after the last record */
    SCAN_TIMESTAMP = 12,     /* base timestamp + delta overflows 64 bits */
    SCAN_KEY_REQUIRED = 13,  /* a record without a key where keys are required */
};

static int scan(const uint8_t *data, Py_ssize_t size, int64_t count, int64_t base_ts,
                int require_keys, int64_t last_delta, int64_t *index, int64_t *min_ts,
                int64_t *max_ts) {
    const uint8_t *p = data, *end = data + size;
    int32_t n;
    int64_t delta, previous = -1;
    for (int64_t i = 0; i < count; i++) {
        *index = i;
        if (read_varint32(&p, end, &n)) return SCAN_VARINT;
        if (n < 1 || n > end - p) return SCAN_RECORD_LENGTH;
        const uint8_t *stop = p + n;
        p++; /* record attributes */
        if (read_varint64(&p, stop, &delta)) return SCAN_VARINT;
        int64_t ts;
        if (__builtin_add_overflow(base_ts, delta, &ts)) return SCAN_TIMESTAMP;
        if (i == 0 || ts < *min_ts) *min_ts = ts;
        if (i == 0 || ts > *max_ts) *max_ts = ts;
        if (read_varint32(&p, stop, &n)) return SCAN_VARINT;
        if ((int64_t)n <= previous || (int64_t)n > last_delta) return SCAN_OFFSET_DELTA;
        previous = n;
        if (read_varint32(&p, stop, &n)) return SCAN_VARINT;
        if (n == -1) {
            if (require_keys) return SCAN_KEY_REQUIRED;
        } else if (n < 0 || n > stop - p) {
            return SCAN_KEY_LENGTH;
        } else {
            p += n;
        }
        if (read_varint32(&p, stop, &n)) return SCAN_VARINT;
        if (n < -1 || n > stop - p) return SCAN_VALUE_LENGTH;
        if (n > 0) p += n;
        int32_t headers;
        if (read_varint32(&p, stop, &headers)) return SCAN_VARINT;
        if (headers < 0 || headers > stop - p) return SCAN_HEADER_COUNT;
        for (int32_t h = 0; h < headers; h++) {
            if (read_varint32(&p, stop, &n)) return SCAN_VARINT;
            if (n < 0 || n > stop - p) return SCAN_HEADER_KEY;
            if (!valid_utf8(p, p + n)) return SCAN_HEADER_KEY_UTF8;
            p += n;
            if (read_varint32(&p, stop, &n)) return SCAN_VARINT;
            if (n < -1 || n > stop - p) return SCAN_HEADER_VALUE;
            if (n > 0) p += n;
        }
        if (p != stop) return SCAN_RECORD_END;
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
