/* Kafka's record section, parsed the one way both extensions need: the batch validator's scan
 * (_scan.c) and the decoder (_codec.c). Zig-zag varints with the lengths Kafka allows (5 bytes
 * for int32 fields, 10 for varlongs), strict UTF-8 for header keys, and one record at a time
 * with every bound checked, failing with the validator's rule codes (the same codes, in the
 * same order of checks, as tidelog.record.validation._scan_records_py). Header-only: each
 * extension gets its own copy. */
#ifndef TIDELOG_WIRE_H
#define TIDELOG_WIRE_H
#include <stdint.h>

static inline int read_varint32(const uint8_t **pp, const uint8_t *end, int32_t *out) {
    const uint8_t *p = *pp;
    uint32_t raw = 0;
    for (int i = 0; i < 5; i++) {
        if (p >= end) return -1;
        uint8_t b = *p++;
        if (i == 4 && b > 0x0F) return -1; /* more than 32 bits */
        raw |= (uint32_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *pp = p;
            *out = (int32_t)((raw >> 1) ^ (0u - (raw & 1u)));
            return 0;
        }
    }
    return -1;
}

static inline int read_varint64(const uint8_t **pp, const uint8_t *end, int64_t *out) {
    const uint8_t *p = *pp;
    uint64_t raw = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end) return -1;
        uint8_t b = *p++;
        if (i == 9 && b > 0x01) return -1; /* more than 64 bits */
        raw |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *pp = p;
            *out = (int64_t)((raw >> 1) ^ (0ull - (raw & 1ull)));
            return 0;
        }
    }
    return -1;
}

/* Strict UTF-8, as Python's decoder: no overlongs, no surrogates, nothing above U+10FFFF. */
static inline int valid_utf8(const uint8_t *p, const uint8_t *end) {
    while (p < end) {
        uint8_t c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        if (c < 0xC2) return 0;
        if (c < 0xE0) {
            if (end - p < 2 || (p[1] & 0xC0) != 0x80) return 0;
            p += 2;
            continue;
        }
        if (c < 0xF0) {
            if (end - p < 3) return 0;
            uint8_t lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
            if (p[1] < lo || p[1] > hi || (p[2] & 0xC0) != 0x80) return 0;
            p += 3;
            continue;
        }
        if (c < 0xF5) {
            if (end - p < 4) return 0;
            uint8_t lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
            if (p[1] < lo || p[1] > hi || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
            p += 4;
            continue;
        }
        return 0;
    }
    return 1;
}


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

typedef struct {
    const uint8_t *p; /* where a field's bytes start; NULL for a null field */
    int32_t len;
} field_t;

typedef struct {
    int64_t offset_delta, timestamp;
    int has_timestamp;        /* timestamp was read (also when a later field is bad) */
    field_t key, value;
    int32_t headers;          /* how many */
    const uint8_t *headers_p; /* where the first header starts */
    const uint8_t *stop;      /* end of this record */
} record_t;

/* A nullable length-prefixed field at *pp, within stop: SCAN_OK, SCAN_VARINT or bad_length. */
static inline int parse_field(const uint8_t **pp, const uint8_t *stop, field_t *f, int bad_length) {
    int32_t n;
    if (read_varint32(pp, stop, &n)) return SCAN_VARINT;
    if (n == -1) {
        f->p = NULL;
        f->len = 0;
        return SCAN_OK;
    }
    if (n < 0 || n > stop - *pp) return bad_length;
    f->p = *pp;
    f->len = n;
    *pp += n;
    return SCAN_OK;
}

/* One record at *pp (before end): SCAN_OK with *pp past it and *r filled, or the rule it
 * breaks. *previous is the offset delta of the record before (-1 for the first). */
static inline int parse_record(const uint8_t **pp, const uint8_t *end, int64_t *previous,
                               int64_t last_delta, int64_t base_ts, int require_keys,
                               record_t *r) {
    const uint8_t *p = *pp;
    int32_t n;
    int64_t delta;
    int code;
    r->has_timestamp = 0;
    if (read_varint32(&p, end, &n)) return SCAN_VARINT;
    if (n < 1 || n > end - p) return SCAN_RECORD_LENGTH;
    const uint8_t *stop = p + n;
    p++; /* record attributes */
    if (read_varint64(&p, stop, &delta)) return SCAN_VARINT;
    if (__builtin_add_overflow(base_ts, delta, &r->timestamp)) return SCAN_TIMESTAMP;
    r->has_timestamp = 1;
    if (read_varint32(&p, stop, &n)) return SCAN_VARINT;
    if ((int64_t)n <= *previous || (int64_t)n > last_delta) return SCAN_OFFSET_DELTA;
    *previous = n;
    r->offset_delta = n;
    if ((code = parse_field(&p, stop, &r->key, SCAN_KEY_LENGTH))) return code;
    if (require_keys && r->key.p == NULL) return SCAN_KEY_REQUIRED;
    if ((code = parse_field(&p, stop, &r->value, SCAN_VALUE_LENGTH))) return code;
    if (read_varint32(&p, stop, &r->headers)) return SCAN_VARINT;
    if (r->headers < 0 || r->headers > stop - p) return SCAN_HEADER_COUNT;
    r->headers_p = p;
    for (int32_t h = 0; h < r->headers; h++) {
        if (read_varint32(&p, stop, &n)) return SCAN_VARINT;
        if (n < 0 || n > stop - p) return SCAN_HEADER_KEY;
        if (!valid_utf8(p, p + n)) return SCAN_HEADER_KEY_UTF8;
        p += n;
        field_t value;
        if ((code = parse_field(&p, stop, &value, SCAN_HEADER_VALUE))) return code;
    }
    if (p != stop) return SCAN_RECORD_END;
    r->stop = stop;
    *pp = stop;
    return SCAN_OK;
}

/* The next header of a record parse_record accepted (it checked every bound). */
static inline void next_header(const uint8_t **pp, const uint8_t *stop, field_t *key,
                               field_t *value) {
    parse_field(pp, stop, key, SCAN_HEADER_KEY);
    parse_field(pp, stop, value, SCAN_HEADER_VALUE);
}

#endif
