/* mqlog's on-disk layout (docs/FORMAT.md, version 1), for the C log core.
 *
 * The figures here are the single C source of truth; _core.pyx asserts at import that
 * they agree with the Python-visible constants (and so with mqlog.ext.fallback).
 * Every integer on disk is little-endian and setup.py refuses big-endian hosts, so the
 * loads and stores below are plain memcpy: no alignment is assumed anywhere (records
 * and consume-queue entries sit at arbitrary byte offsets).
 */
#ifndef MQLOG_LAYOUT_H
#define MQLOG_LAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* --- the record: a 72-byte header, then topic | key | tags | properties | body ------- */
#define MQ_HEADER_SIZE 72
#define MQ_CRC_START 12              /* the CRC covers every byte after its own field */
#define MQ_MAGIC 0x0152514DU         /* "MQR" 0x01 read as a little-endian u32 */
#define MQ_BLANK_MAGIC 0x0142514DU   /* "MQB" 0x01: pads a segment's tail */
#define MQ_BLANK_SIZE_MIN 8          /* total_size u32 | magic u32 */
#define MQ_ATTR_CONTROL 0x0001       /* reserved: control records get no queue entry */
#define MQ_ATTR_FILLER 0x0002        /* a lost-record filler, written by `mqlog repair` */

/* Byte offsets of the header fields. */
#define MQ_AT_SIZE 0                 /* u32 total_size */
#define MQ_AT_MAGIC 4                /* u32 */
#define MQ_AT_CRC 8                  /* u32 crc32c of [12, total_size) */
#define MQ_AT_ATTRIBUTES 12          /* u16 */
#define MQ_AT_TOPIC_SIZE 14          /* u16 */
#define MQ_AT_QUEUE_ID 16            /* u32 */
#define MQ_AT_BODY_SIZE 20           /* u32 */
#define MQ_AT_EPOCH 24               /* u64 */
#define MQ_AT_QUEUE_OFFSET 32        /* u64 */
#define MQ_AT_POSITION 40            /* u64 */
#define MQ_AT_BORN 48                /* i64 milliseconds */
#define MQ_AT_STORE 56               /* i64 milliseconds */
#define MQ_AT_KEY_SIZE 64            /* u16 */
#define MQ_AT_TAGS_SIZE 66           /* u16 */
#define MQ_AT_PROPERTIES_SIZE 68     /* u32 */

/* --- the consume-queue entry: position u64 | size u32 | tag hash u64 --------------- */
#define MQ_CQ_ENTRY_SIZE 20
#define MQ_CQ_AT_POSITION 0
#define MQ_CQ_AT_SIZE 8
#define MQ_CQ_AT_HASH 12

/* --- FNV-1a 64 of the tags, as stored in the consume-queue entry ---------------------- */
#define MQ_FNV_OFFSET 0xCBF29CE484222325ULL
#define MQ_FNV_PRIME 0x100000001B3ULL

static inline uint16_t mq_u16(const char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t mq_u32(const char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t mq_u64(const char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline int64_t mq_i64(const char *p) { int64_t v; memcpy(&v, p, 8); return v; }

static inline void mq_put_u16(char *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void mq_put_u32(char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void mq_put_u64(char *p, uint64_t v) { memcpy(p, &v, 8); }
static inline void mq_put_i64(char *p, int64_t v) { memcpy(p, &v, 8); }

/* The fixed part of a record, decoded (or about to be encoded). */
typedef struct {
    uint32_t size;
    uint32_t magic;
    uint32_t crc;
    uint16_t attributes;
    uint16_t topic_size;
    uint32_t queue_id;
    uint32_t body_size;
    uint64_t epoch;
    uint64_t queue_offset;
    uint64_t position;
    int64_t born_timestamp;
    int64_t store_timestamp;
    uint16_t key_size;
    uint16_t tags_size;
    uint32_t properties_size;
} mq_header;

static inline void mq_read_header(const char *p, mq_header *h)
{
    h->size = mq_u32(p + MQ_AT_SIZE);
    h->magic = mq_u32(p + MQ_AT_MAGIC);
    h->crc = mq_u32(p + MQ_AT_CRC);
    h->attributes = mq_u16(p + MQ_AT_ATTRIBUTES);
    h->topic_size = mq_u16(p + MQ_AT_TOPIC_SIZE);
    h->queue_id = mq_u32(p + MQ_AT_QUEUE_ID);
    h->body_size = mq_u32(p + MQ_AT_BODY_SIZE);
    h->epoch = mq_u64(p + MQ_AT_EPOCH);
    h->queue_offset = mq_u64(p + MQ_AT_QUEUE_OFFSET);
    h->position = mq_u64(p + MQ_AT_POSITION);
    h->born_timestamp = mq_i64(p + MQ_AT_BORN);
    h->store_timestamp = mq_i64(p + MQ_AT_STORE);
    h->key_size = mq_u16(p + MQ_AT_KEY_SIZE);
    h->tags_size = mq_u16(p + MQ_AT_TAGS_SIZE);
    h->properties_size = mq_u32(p + MQ_AT_PROPERTIES_SIZE);
}

static inline void mq_write_header(char *p, const mq_header *h)
{
    mq_put_u32(p + MQ_AT_SIZE, h->size);
    mq_put_u32(p + MQ_AT_MAGIC, h->magic);
    mq_put_u32(p + MQ_AT_CRC, h->crc);
    mq_put_u16(p + MQ_AT_ATTRIBUTES, h->attributes);
    mq_put_u16(p + MQ_AT_TOPIC_SIZE, h->topic_size);
    mq_put_u32(p + MQ_AT_QUEUE_ID, h->queue_id);
    mq_put_u32(p + MQ_AT_BODY_SIZE, h->body_size);
    mq_put_u64(p + MQ_AT_EPOCH, h->epoch);
    mq_put_u64(p + MQ_AT_QUEUE_OFFSET, h->queue_offset);
    mq_put_u64(p + MQ_AT_POSITION, h->position);
    mq_put_i64(p + MQ_AT_BORN, h->born_timestamp);
    mq_put_i64(p + MQ_AT_STORE, h->store_timestamp);
    mq_put_u16(p + MQ_AT_KEY_SIZE, h->key_size);
    mq_put_u16(p + MQ_AT_TAGS_SIZE, h->tags_size);
    mq_put_u32(p + MQ_AT_PROPERTIES_SIZE, h->properties_size);
}

/* Sum of the variable fields' sizes; 64-bit so that garbage cannot wrap around. */
static inline uint64_t mq_fields_size(const mq_header *h)
{
    return (uint64_t)h->topic_size + h->key_size + h->tags_size + h->properties_size
        + h->body_size;
}

/* Append n bytes at target; return the end. Topics and tags are a handful of bytes,
 * where a call to libc's memcpy costs more than the copy itself. */
static inline char *mq_append_bytes(char *target, const char *source, size_t n)
{
    uint64_t head8, tail8;
    uint32_t head4, tail4;
    if (n >= 16) {
        memcpy(target, source, n);
    } else if (n >= 8) {  /* two overlapping 8-byte moves */
        memcpy(&head8, source, 8);
        memcpy(&tail8, source + n - 8, 8);
        memcpy(target, &head8, 8);
        memcpy(target + n - 8, &tail8, 8);
    } else if (n >= 4) {
        memcpy(&head4, source, 4);
        memcpy(&tail4, source + n - 4, 4);
        memcpy(target, &head4, 4);
        memcpy(target + n - 4, &tail4, 4);
    } else {
        size_t i;
        for (i = 0; i < n; i++)
            target[i] = source[i];
    }
    return target + n;
}

/* Write a record's header and every field but the body; return where the body goes.
 * The sizes come from the header; a field of size 0 may be NULL. */
static inline char *mq_write_record_head(char *record, const mq_header *h,
                                         const char *topic, const char *key,
                                         const char *tags, const char *properties)
{
    char *cursor = record + MQ_HEADER_SIZE;
    mq_write_header(record, h);
    cursor = mq_append_bytes(cursor, topic, h->topic_size);
    cursor = mq_append_bytes(cursor, key, h->key_size);
    cursor = mq_append_bytes(cursor, tags, h->tags_size);
    return mq_append_bytes(cursor, properties, h->properties_size);
}

/* An entry's size is stored last: a non-zero size publishes the entry to a reader in
 * another process, which reads the size first (consumequeue.py). The release fence keeps
 * the compiler from moving the position and hash stores after it; x86 keeps the order. */
static inline void mq_write_cq_entry(char *p, uint64_t position, uint32_t size,
                                     uint64_t tag_hash)
{
    mq_put_u64(p + MQ_CQ_AT_POSITION, position);
    mq_put_u64(p + MQ_CQ_AT_HASH, tag_hash);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    mq_put_u32(p + MQ_CQ_AT_SIZE, size);
}

static inline uint64_t mq_fnv1a64(const unsigned char *p, size_t n)
{
    uint64_t value;
    if (n == 0)
        return 0;  /* no tags hash to 0, not to the offset basis */
    value = MQ_FNV_OFFSET;
    while (n--)
        value = (value ^ *p++) * MQ_FNV_PRIME;
    return value;
}

#endif /* MQLOG_LAYOUT_H */
