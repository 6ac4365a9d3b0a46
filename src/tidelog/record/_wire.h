/* Kafka's record-section primitives shared by the compiled scan (_scan.c) and decoder
 * (_codec.c): zig-zag varints with the lengths Kafka allows (5 bytes for int32 fields, 10 for
 * varlongs) and strict UTF-8 for header keys. Header-only: each extension gets its own copy. */
#ifndef TIDELOG_WIRE_H
#define TIDELOG_WIRE_H
#include <stdint.h>

static int read_varint32(const uint8_t **pp, const uint8_t *end, int32_t *out) {
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

static int read_varint64(const uint8_t **pp, const uint8_t *end, int64_t *out) {
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
static int valid_utf8(const uint8_t *p, const uint8_t *end) {
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

#endif
