/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78) for the C log core.
 *
 * Two implementations of one function, chosen once at import by mq_crc32c_setup():
 *   - SSE4.2's crc32 instruction, eight bytes at a time. The function is compiled with
 *     __attribute__((target("sse4.2"))) rather than -msse4.2/-march=native, so the
 *     module still loads on a CPU without it; __builtin_cpu_supports decides at run time.
 *   - slicing-by-8 tables (8 KiB, filled at setup) everywhere else.
 * Both update a raw (pre-inverted) register; mq_crc32c() does the inversions, so its
 * ``value`` argument continues a previous result exactly as crc32c.crc32c(data, value).
 */
#ifndef MQLOG_CRC32C_H
#define MQLOG_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MQ_CRC32C_HAVE_SSE42 1
#include <nmmintrin.h>
#else
#define MQ_CRC32C_HAVE_SSE42 0
#endif

#define MQ_CRC32C_POLY 0x82F63B78U

static uint32_t mq_crc32c_table[8][256];
static int mq_crc32c_use_hw = 0;

static void mq_crc32c_fill_tables(void)
{
    uint32_t i, k, crc;
    for (i = 0; i < 256; i++) {
        crc = i;
        for (k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (MQ_CRC32C_POLY & (0U - (crc & 1U)));
        mq_crc32c_table[0][i] = crc;
    }
    for (i = 0; i < 256; i++) {
        crc = mq_crc32c_table[0][i];
        for (k = 1; k < 8; k++) {
            crc = mq_crc32c_table[0][crc & 0xFF] ^ (crc >> 8);
            mq_crc32c_table[k][i] = crc;
        }
    }
}

/* Portable slicing-by-8: eight table lookups per eight input bytes. */
static uint32_t mq_crc32c_sw(uint32_t crc, const unsigned char *p, size_t n)
{
    uint32_t lo, hi;
    while (n >= 8) {
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= crc;
        crc = mq_crc32c_table[7][lo & 0xFF] ^ mq_crc32c_table[6][(lo >> 8) & 0xFF]
            ^ mq_crc32c_table[5][(lo >> 16) & 0xFF] ^ mq_crc32c_table[4][lo >> 24]
            ^ mq_crc32c_table[3][hi & 0xFF] ^ mq_crc32c_table[2][(hi >> 8) & 0xFF]
            ^ mq_crc32c_table[1][(hi >> 16) & 0xFF] ^ mq_crc32c_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = mq_crc32c_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

#if MQ_CRC32C_HAVE_SSE42
/* Unaligned 8-byte loads cost nothing extra on the CPUs that have SSE4.2, and records
 * are short, so there is no alignment prologue. */
__attribute__((target("sse4.2")))
static uint32_t mq_crc32c_hw(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c = crc, word;
    while (n >= 8) {
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)c;
    while (n--)
        crc = _mm_crc32_u8(crc, *p++);
    return crc;
}
#endif

/* Fill the tables and pick the implementation; call once before any mq_crc32c(). */
static void mq_crc32c_setup(void)
{
    mq_crc32c_fill_tables();
#if MQ_CRC32C_HAVE_SSE42
    __builtin_cpu_init();
    mq_crc32c_use_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
}

static inline uint32_t mq_crc32c(uint32_t value, const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
#if MQ_CRC32C_HAVE_SSE42
    if (mq_crc32c_use_hw)
        return ~mq_crc32c_hw(~value, p, n);
#endif
    return ~mq_crc32c_sw(~value, p, n);
}

/* The table implementation alone, so tests can check it on any CPU. */
static inline uint32_t mq_crc32c_portable(uint32_t value, const void *data, size_t n)
{
    return ~mq_crc32c_sw(~value, (const unsigned char *)data, n);
}

static inline int mq_crc32c_hardware(void) { return mq_crc32c_use_hw; }

#endif /* MQLOG_CRC32C_H */
