/* Compiled encoding and decoding of RecordBatch v2 record sections (the producer's, the
 * consumer's and the Spark source's and sink's per-record work), held to the pure-Python
 * reference in tidelog.record.batch and tidelog.record.columns by property tests
 * (tests/test_codec.py).
 *
 * encode_records(records, default_timestamp) -> (section, base_timestamp, max_timestamp)
 *     ProducerRecords as a record section (offset deltas 0..n-1), as batch.encode_records_py.
 *
 * encode_rows(rows, key_offsets, key_data, key_validity, value_offsets, value_data,
 *             value_validity) -> section
 *     Rows of Arrow binary columns (key and value), in the order of the int64 row indices, as
 *     records without headers (the Spark sink's chunks).
 *
 * decode_records(data, count, base_offset, base_timestamp, last_offset_delta, min_offset,
 *                record_type) -> list
 *     One record_type (a tuple subclass: Record) per record at an offset >= min_offset.
 *
 * decode_columns(items, include_headers) -> tuple of column buffers
 *     items: (data, count, base_offset, base_timestamp, last_offset_delta, min_offset,
 *     end_offset) per batch; every record at min_offset <= offset < end_offset lands in Arrow
 *     layout buffers (little-endian int64 offsets and timestamps, int32 offsets + data + validity
 *     bitmaps for keys, values and headers), with no Python object per record.
 *
 * Both parse records with the batch validator's own parser (_wire.h, which _scan.c runs) and
 * refuse what it refuses but for keyless records (a topic rule, not a format one); they raise
 * ValueError with the rule's meaning, which the Python layer turns into CorruptRecord.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_wire.h"

/* What each of the validator's rule codes means, for the error a decoder raises. */
static const char *const REASONS[] = {
    [SCAN_VARINT] = "a varint is cut short or longer than its type allows",
    [SCAN_RECORD_LENGTH] = "the record's length runs past the batch",
    [SCAN_OFFSET_DELTA] = "offset deltas do not rise within the batch",
    [SCAN_KEY_LENGTH] = "the key's length runs past the record",
    [SCAN_VALUE_LENGTH] = "the value's length runs past the record",
    [SCAN_HEADER_COUNT] = "bad header count",
    [SCAN_HEADER_KEY] = "a header key is null or runs past the record",
    [SCAN_HEADER_KEY_UTF8] = "a header key is not UTF-8",
    [SCAN_HEADER_VALUE] = "a header value runs past the record",
    [SCAN_RECORD_END] = "the record's length disagrees with its fields",
    [SCAN_TRAILING] = "trailing bytes after the last record",
    [SCAN_TIMESTAMP] = "the timestamp overflows 64 bits",
    [SCAN_KEY_REQUIRED] = "a record without a key",
};

static PyObject *corrupt(int code, int64_t index) {
    PyErr_Format(PyExc_ValueError, "record %lld: %s", (long long)index, REASONS[code]);
    return NULL;
}

static PyObject *bytes_or_none(const field_t *f) {
    if (f->p == NULL) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)f->p, f->len);
}

static PyObject *headers_tuple(const record_t *r) {
    PyObject *out = PyTuple_New(r->headers);
    if (out == NULL) return NULL;
    const uint8_t *p = r->headers_p;
    for (int32_t h = 0; h < r->headers; h++) {
        field_t key, value;
        next_header(&p, r->stop, &key, &value);
        PyObject *k = PyUnicode_DecodeUTF8((const char *)key.p, key.len, "strict");
        PyObject *v = k ? bytes_or_none(&value) : NULL;
        PyObject *pair = v ? PyTuple_Pack(2, k, v) : NULL;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (pair == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, h, pair);
    }
    return out;
}

static PyObject *decode_records(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long count, base_offset, base_ts, last_delta, min_offset;
    PyTypeObject *record_type;
    if (!PyArg_ParseTuple(args, "y*LLLLLO!", &view, &count, &base_offset, &base_ts, &last_delta,
                          &min_offset, &PyType_Type, &record_type))
        return NULL;
    if (!PyType_IsSubtype(record_type, &PyTuple_Type)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple subclass");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    PyObject *empty = PyTuple_New(0);
    if (out == NULL || empty == NULL) goto fail;
    const uint8_t *p = (const uint8_t *)view.buf, *end = p + view.len;
    int64_t previous = -1;
    for (int64_t i = 0; i < count; i++) {
        record_t r;
        int code = parse_record(&p, end, &previous, last_delta, base_ts, 0, &r);
        if (code != SCAN_OK) {
            corrupt(code, i);
            goto fail;
        }
        int64_t offset = base_offset + r.offset_delta, ts = r.timestamp;
        if (offset < min_offset) continue;
        PyObject *rec = record_type->tp_alloc(record_type, 5);
        if (rec == NULL) goto fail;
        PyObject *items[5] = {PyLong_FromLongLong(offset), PyLong_FromLongLong(ts),
                              bytes_or_none(&r.key), bytes_or_none(&r.value), NULL};
        if (r.headers == 0) {
            Py_INCREF(empty);
            items[4] = empty;
        } else {
            items[4] = headers_tuple(&r);
        }
        int failed = 0;
        for (int k = 0; k < 5; k++) {
            if (items[k] == NULL) failed = 1;
            PyTuple_SET_ITEM(rec, k, items[k]);
        }
        if (failed || PyList_Append(out, rec) < 0) {
            Py_DECREF(rec);
            goto fail;
        }
        Py_DECREF(rec);
    }
    if (p != end) {
        corrupt(SCAN_TRAILING, count);
        goto fail;
    }
    Py_DECREF(empty);
    PyBuffer_Release(&view);
    return out;
fail:
    Py_XDECREF(out);
    Py_XDECREF(empty);
    PyBuffer_Release(&view);
    return NULL;
}

/* ---- columns ------------------------------------------------------------------------------ */

/* A bytes object being filled; sized for the worst case up front and shrunk at the end. */
typedef struct {
    PyObject *obj;
    char *at;
    Py_ssize_t used;
} out_t;

static int out_init(out_t *o, Py_ssize_t capacity, int zero) {
    o->obj = PyBytes_FromStringAndSize(NULL, capacity);
    if (o->obj == NULL) return -1;
    o->at = PyBytes_AS_STRING(o->obj);
    if (zero) memset(o->at, 0, (size_t)capacity);
    o->used = 0;
    return 0;
}

static PyObject *out_finish(out_t *o, Py_ssize_t size) {
    PyObject *obj = o->obj;
    o->obj = NULL;
    if (_PyBytes_Resize(&obj, size) < 0) return NULL;
    return obj;
}

static inline void put_i64(out_t *o, int64_t v) {
    memcpy(o->at + o->used, &v, 8);
    o->used += 8;
}

static inline void put_i32(out_t *o, int32_t v) {
    memcpy(o->at + o->used, &v, 4);
    o->used += 4;
}

/* A binary (or string) column: offsets, data, validity. */
typedef struct {
    out_t offsets, data, validity;
    int64_t rows, nulls;
} column_t;

static int column_init(column_t *c, Py_ssize_t rows, Py_ssize_t bytes) {
    memset(c, 0, sizeof(*c));
    if (out_init(&c->offsets, 4 * (rows + 1), 0) < 0) return -1;
    if (out_init(&c->data, bytes, 0) < 0) return -1;
    if (out_init(&c->validity, (rows + 7) / 8, 1) < 0) return -1;
    put_i32(&c->offsets, 0);
    return 0;
}

static void column_put(column_t *c, const field_t *f) {
    if (f->p == NULL) {
        c->nulls++;
    } else {
        memcpy(c->data.at + c->data.used, f->p, (size_t)f->len);
        c->data.used += f->len;
        ((uint8_t *)c->validity.at)[c->rows >> 3] |= (uint8_t)(1u << (c->rows & 7));
    }
    c->rows++;
    put_i32(&c->offsets, (int32_t)c->data.used);
}

static void column_clear(column_t *c) {
    Py_CLEAR(c->offsets.obj);
    Py_CLEAR(c->data.obj);
    Py_CLEAR(c->validity.obj);
}

/* (offsets, data, validity or None, null count) */
static PyObject *column_finish(column_t *c) {
    PyObject *offsets = out_finish(&c->offsets, c->offsets.used);
    PyObject *data = offsets ? out_finish(&c->data, c->data.used) : NULL;
    PyObject *validity = NULL;
    if (data && c->nulls) {
        validity = out_finish(&c->validity, (c->rows + 7) / 8);
    } else if (data) {
        Py_CLEAR(c->validity.obj);
        validity = Py_NewRef(Py_None);
    }
    PyObject *result = validity ? Py_BuildValue("(NNNL)", offsets, data, validity,
                                                (long long)c->nulls)
                                : NULL;
    if (result == NULL) {
        Py_XDECREF(offsets);
        Py_XDECREF(data);
        Py_XDECREF(validity);
    }
    column_clear(c);
    return result;
}

typedef struct {
    Py_buffer view;
    long long count, base_offset, base_ts, last_delta, min_offset, end_offset;
} item_t;

static PyObject *decode_columns(PyObject *self, PyObject *args) {
    PyObject *items_obj;
    int include_headers;
    if (!PyArg_ParseTuple(args, "Op", &items_obj, &include_headers)) return NULL;
    PyObject *seq = PySequence_Fast(items_obj, "items must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n_items = PySequence_Fast_GET_SIZE(seq);
    item_t *items = PyMem_Calloc((size_t)(n_items ? n_items : 1), sizeof(item_t));
    PyObject *result = NULL;
    out_t offsets = {0}, timestamps = {0}, list_offsets = {0};
    column_t keys = {0}, values = {0}, hkeys = {0}, hvalues = {0};
    Py_ssize_t parsed = 0;
    if (items == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* Upper bounds: records <= sum(count), field bytes <= payload bytes, headers <= bytes / 2. */
    int64_t rows = 0, bytes = 0;
    for (Py_ssize_t i = 0; i < n_items; i++) {
        item_t *it = &items[i];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "y*LLLLLL", &it->view, &it->count,
                              &it->base_offset, &it->base_ts, &it->last_delta, &it->min_offset,
                              &it->end_offset))
            goto done;
        parsed++;
        if (it->count < 0 || it->count > it->view.len) {
            PyErr_Format(PyExc_ValueError, "batch %zd: %lld records cannot fit in %zd bytes", i,
                         it->count, it->view.len);
            goto done;
        }
        rows += it->count;
        bytes += it->view.len;
    }
    if (bytes > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of records in one column batch");
        goto done;
    }
    if (out_init(&offsets, 8 * rows, 0) < 0 || out_init(&timestamps, 8 * rows, 0) < 0 ||
        column_init(&keys, rows, bytes) < 0 || column_init(&values, rows, bytes) < 0)
        goto done;
    if (include_headers &&
        (out_init(&list_offsets, 4 * (rows + 1), 0) < 0 ||
         column_init(&hkeys, bytes / 2, bytes) < 0 || column_init(&hvalues, bytes / 2, bytes) < 0))
        goto done;
    if (include_headers) put_i32(&list_offsets, 0);
    for (Py_ssize_t i = 0; i < n_items; i++) {
        item_t *it = &items[i];
        const uint8_t *p = (const uint8_t *)it->view.buf, *end = p + it->view.len;
        int64_t previous = -1;
        for (int64_t r_i = 0; r_i < it->count; r_i++) {
            record_t r;
            int code = parse_record(&p, end, &previous, it->last_delta, it->base_ts, 0, &r);
            if (code != SCAN_OK) {
                PyErr_Format(PyExc_ValueError, "batch at offset %lld, record %lld: %s",
                             it->base_offset, (long long)r_i, REASONS[code]);
                goto done;
            }
            int64_t ts = r.timestamp;
            int64_t offset = it->base_offset + r.offset_delta;
            if (offset < it->min_offset || offset >= it->end_offset) continue;
            put_i64(&offsets, offset);
            put_i64(&timestamps, ts);
            column_put(&keys, &r.key);
            column_put(&values, &r.value);
            if (include_headers) {
                const uint8_t *h = r.headers_p;
                for (int32_t k = 0; k < r.headers; k++) {
                    field_t hk, hv;
                    next_header(&h, r.stop, &hk, &hv);
                    column_put(&hkeys, &hk);
                    column_put(&hvalues, &hv);
                }
                put_i32(&list_offsets, (int32_t)hkeys.rows);
            }
        }
        if (p != end) {
            PyErr_Format(PyExc_ValueError, "batch at offset %lld: trailing bytes after the last "
                         "record", it->base_offset);
            goto done;
        }
    }
    {
        long long n = (long long)keys.rows;
        PyObject *o = out_finish(&offsets, offsets.used);
        PyObject *t = o ? out_finish(&timestamps, timestamps.used) : NULL;
        PyObject *k = t ? column_finish(&keys) : NULL;
        PyObject *v = k ? column_finish(&values) : NULL;
        PyObject *h = NULL;
        if (v && include_headers) {
            PyObject *lo = out_finish(&list_offsets, list_offsets.used);
            PyObject *hk = lo ? column_finish(&hkeys) : NULL;
            PyObject *hv = hk ? column_finish(&hvalues) : NULL;
            h = hv ? Py_BuildValue("(NNN)", lo, hk, hv) : NULL;
            if (h == NULL) {
                Py_XDECREF(lo);
                Py_XDECREF(hk);
                Py_XDECREF(hv);
            }
        } else if (v) {
            h = Py_NewRef(Py_None);
        }
        if (h) {
            result = Py_BuildValue("(LNNNNN)", n, o, t, k, v, h);
        } else {
            Py_XDECREF(o);
            Py_XDECREF(t);
            Py_XDECREF(k);
            Py_XDECREF(v);
        }
    }
done:
    Py_CLEAR(offsets.obj);
    Py_CLEAR(timestamps.obj);
    Py_CLEAR(list_offsets.obj);
    column_clear(&keys);
    column_clear(&values);
    column_clear(&hkeys);
    column_clear(&hvalues);
    for (Py_ssize_t i = 0; i < parsed; i++) PyBuffer_Release(&items[i].view);
    PyMem_Free(items);
    Py_DECREF(seq);
    return result;
}


/* ---- encoding ----------------------------------------------------------------------------- */

static inline Py_ssize_t varint_size(int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    Py_ssize_t n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

static inline char *put_varint(char *at, int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (z >= 0x80) {
        *at++ = (char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    *at++ = (char)z;
    return at;
}

/* A key, value or header value: bytes (fast) or any buffer; None is null. */
typedef struct {
    Py_buffer view;
    int held, null;
    const char *p;
    Py_ssize_t len;
} bytes_arg;

static int bytes_arg_get(PyObject *obj, bytes_arg *b, const char *what) {
    b->held = 0;
    b->null = obj == Py_None;
    b->p = NULL;
    b->len = 0;
    if (b->null) return 0;
    if (PyBytes_Check(obj)) {
        b->p = PyBytes_AS_STRING(obj);
        b->len = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "a record's %s must be bytes or None, not %.100s", what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    b->held = 1;
    b->p = b->view.buf;
    b->len = b->view.len;
    return 0;
}

static void bytes_arg_release(bytes_arg *b) {
    if (b->held) PyBuffer_Release(&b->view);
    b->held = 0;
}

static inline Py_ssize_t field_size(const bytes_arg *b) {
    return b->null ? 1 : varint_size(b->len) + b->len;
}

static inline char *put_field(char *at, const bytes_arg *b) {
    if (b->null) return put_varint(at, -1);
    at = put_varint(at, b->len);
    memcpy(at, b->p, (size_t)b->len);
    return at + b->len;
}

/* One record: its body size when at is NULL (bytes after the length varint), else written at
 * `at` (length varint and body, body_size from the sizing call) and the end returned through
 * *end. -1 with an exception on a record that is not (bytes|None, bytes|None, headers, ...). */
static Py_ssize_t encode_one(PyObject *rec, int64_t ts_delta, int64_t offset_delta,
                             Py_ssize_t body_size, char *at, char **end) {
    if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) < 3) {
        PyErr_SetString(PyExc_TypeError, "records must be ProducerRecord tuples");
        return -1;
    }
    bytes_arg key, value;
    if (bytes_arg_get(PyTuple_GET_ITEM(rec, 0), &key, "key") < 0) return -1;
    if (bytes_arg_get(PyTuple_GET_ITEM(rec, 1), &value, "value") < 0) {
        bytes_arg_release(&key);
        return -1;
    }
    PyObject *headers = PySequence_Fast(PyTuple_GET_ITEM(rec, 2), "headers must be a sequence");
    Py_ssize_t body = -1;
    if (headers == NULL) goto done;
    Py_ssize_t n_headers = PySequence_Fast_GET_SIZE(headers);
    body = 1 + varint_size(ts_delta) + varint_size(offset_delta) + field_size(&key) +
           field_size(&value) + varint_size(n_headers);
    if (at) {
        at = put_varint(at, body_size);
        *at++ = 0; /* record attributes */
        at = put_varint(at, ts_delta);
        at = put_varint(at, offset_delta);
        at = put_field(at, &key);
        at = put_field(at, &value);
        at = put_varint(at, n_headers);
    }
    for (Py_ssize_t h = 0; h < n_headers; h++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(headers, h);
        int ok = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2 &&
                 PyUnicode_Check(PyTuple_GET_ITEM(pair, 0));
        Py_ssize_t klen = 0;
        const char *k = ok ? PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &klen) : NULL;
        bytes_arg hv;
        if (k == NULL || bytes_arg_get(PyTuple_GET_ITEM(pair, 1), &hv, "header value") < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "headers must be (str, bytes | None) pairs");
            body = -1;
            goto done;
        }
        body += varint_size(klen) + klen + field_size(&hv);
        if (at) {
            at = put_varint(at, klen);
            memcpy(at, k, (size_t)klen);
            at += klen;
            at = put_field(at, &hv);
        }
        bytes_arg_release(&hv);
    }
    if (end) *end = at;
done:
    Py_XDECREF(headers);
    bytes_arg_release(&key);
    bytes_arg_release(&value);
    return body;
}

/* encode_records(records, default_timestamp) -> (record section, base_ts, max_ts) */
static PyObject *encode_records(PyObject *self, PyObject *args) {
    PyObject *records_obj;
    long long default_ts;
    if (!PyArg_ParseTuple(args, "OL", &records_obj, &default_ts)) return NULL;
    PyObject *seq = PySequence_Fast(records_obj, "records must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int64_t *ts = PyMem_Malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    Py_ssize_t *sizes = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n ? n : 1));
    PyObject *out = NULL, *result = NULL;
    if (ts == NULL || sizes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t base = INT64_MAX, max = INT64_MIN;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *t = PyTuple_Check(rec) && PyTuple_GET_SIZE(rec) >= 4 ? PyTuple_GET_ITEM(rec, 3)
                                                                        : Py_None;
        if (t == Py_None) {
            ts[i] = default_ts;
        } else {
            ts[i] = PyLong_AsLongLong(t);
            if (ts[i] == -1 && PyErr_Occurred()) goto done;
        }
        if (ts[i] < base) base = ts[i];
        if (ts[i] > max) max = ts[i];
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t delta;
        if (__builtin_sub_overflow(ts[i], base, &delta)) {
            PyErr_SetString(PyExc_OverflowError, "timestamps too far apart for one batch");
            goto done;
        }
        sizes[i] = encode_one(PySequence_Fast_GET_ITEM(seq, i), delta, i, 0, NULL, NULL);
        if (sizes[i] < 0) goto done;
        total += varint_size(sizes[i]) + sizes[i];
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) goto done;
    char *at = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (encode_one(PySequence_Fast_GET_ITEM(seq, i), ts[i] - base, i, sizes[i], at, &at) < 0)
            goto done;
    }
    if (at != PyBytes_AS_STRING(out) + total) {
        PyErr_SetString(PyExc_RuntimeError, "a record changed while it was being encoded");
        goto done;
    }
    result = Py_BuildValue("(OLL)", out, (long long)(n ? base : default_ts),
                           (long long)(n ? max : default_ts));
done:
    Py_XDECREF(out);
    PyMem_Free(ts);
    PyMem_Free(sizes);
    Py_DECREF(seq);
    return result;
}

/* encode_rows(rows, key_offsets, key_data, key_validity, value_offsets, value_data,
 *             value_validity) -> record section
 * The rows (an int64 buffer of row indices, in the order wanted) of two Arrow binary columns
 * as records with offset deltas 0.. and timestamp delta 0, no headers: the Spark sink's chunks,
 * straight from Arrow buffers. A key column may be absent (None offsets): every key is null. */
static PyObject *encode_rows(PyObject *self, PyObject *args) {
    Py_buffer rows, ko, kd, kv, vo, vd, vv;
    PyObject *ko_obj, *kd_obj, *kv_obj, *vv_obj;
    memset(&ko, 0, sizeof ko);
    memset(&kd, 0, sizeof kd);
    memset(&kv, 0, sizeof kv);
    memset(&vv, 0, sizeof vv);
    if (!PyArg_ParseTuple(args, "y*OOOy*y*O", &rows, &ko_obj, &kd_obj, &kv_obj, &vo, &vd, &vv_obj))
        return NULL;
    PyObject *out = NULL, *result = NULL;
    int has_keys = ko_obj != Py_None;
    if ((has_keys && (PyObject_GetBuffer(ko_obj, &ko, PyBUF_SIMPLE) < 0 ||
                      PyObject_GetBuffer(kd_obj, &kd, PyBUF_SIMPLE) < 0)) ||
        (kv_obj != Py_None && PyObject_GetBuffer(kv_obj, &kv, PyBUF_SIMPLE) < 0) ||
        (vv_obj != Py_None && PyObject_GetBuffer(vv_obj, &vv, PyBUF_SIMPLE) < 0))
        goto done;
    const int64_t *idx = rows.buf;
    Py_ssize_t n = rows.len / 8;
    const int32_t *koff = ko.buf, *voff = vo.buf;
    Py_ssize_t key_rows = has_keys ? ko.len / 4 - 1 : 0, value_rows = vo.len / 4 - 1;
    const uint8_t *kvalid = kv.buf, *vvalid = vv.buf;
    Py_ssize_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        char *at = pass ? PyBytes_AS_STRING(out) : NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t r = idx[i];
            if (r < 0 || r >= value_rows || (has_keys && r >= key_rows) ||
                (kvalid && (Py_ssize_t)(r >> 3) >= kv.len) ||
                (vvalid && (Py_ssize_t)(r >> 3) >= vv.len)) {
                PyErr_Format(PyExc_IndexError, "row %lld out of range", (long long)r);
                goto done;
            }
            bytes_arg key = {.null = 1}, value = {.null = 1};
            if (has_keys && (!kvalid || (kvalid[r >> 3] >> (r & 7)) & 1)) {
                key.null = 0;
                key.p = (const char *)kd.buf + koff[r];
                key.len = koff[r + 1] - koff[r];
            }
            if (!vvalid || (vvalid[r >> 3] >> (r & 7)) & 1) {
                value.null = 0;
                value.p = (const char *)vd.buf + voff[r];
                value.len = voff[r + 1] - voff[r];
            }
            if ((!key.null && (koff[r] < 0 || key.len < 0 || koff[r + 1] > kd.len)) ||
                (!value.null && (voff[r] < 0 || value.len < 0 || voff[r + 1] > vd.len))) {
                PyErr_Format(PyExc_ValueError, "row %lld: offsets run past the column's data",
                             (long long)r);
                goto done;
            }
            Py_ssize_t body = 1 + 1 + varint_size(i) + field_size(&key) + field_size(&value) + 1;
            if (!pass) {
                total += varint_size(body) + body;
                continue;
            }
            at = put_varint(at, body);
            *at++ = 0; /* attributes */
            *at++ = 0; /* timestamp delta */
            at = put_varint(at, i);
            at = put_field(at, &key);
            at = put_field(at, &value);
            *at++ = 0; /* no headers */
        }
        if (!pass) {
            out = PyBytes_FromStringAndSize(NULL, total);
            if (out == NULL) goto done;
        }
    }
    result = out;
    out = NULL;
done:
    Py_XDECREF(out);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&vo);
    PyBuffer_Release(&vd);
    if (ko.obj) PyBuffer_Release(&ko);
    if (kd.obj) PyBuffer_Release(&kd);
    if (kv.obj) PyBuffer_Release(&kv);
    if (vv.obj) PyBuffer_Release(&vv);
    return result;
}

static PyMethodDef methods[] = {
    {"decode_records", decode_records, METH_VARARGS,
     "decode_records(data, count, base_offset, base_timestamp, last_offset_delta, min_offset,"
     " record_type) -> list"},
    {"encode_records", encode_records, METH_VARARGS,
     "encode_records(records, default_timestamp) -> (record section, base_ts, max_ts)"},
    {"encode_rows", encode_rows, METH_VARARGS,
     "encode_rows(rows, key_offsets, key_data, key_validity, value_offsets, value_data,"
     " value_validity) -> record section"},
    {"decode_columns", decode_columns, METH_VARARGS,
     "decode_columns(items, include_headers) -> (rows, offsets, timestamps, keys, values,"
     " headers)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_codec", NULL, -1, methods};

PyMODINIT_FUNC PyInit__codec(void) { return PyModule_Create(&module); }
