/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78) for the C log core.
 *
 * Two implementations of one function, chosen once at import by mq_crc32c_setup():
 *   - SSE4.2's crc32 instruction, eight bytes at a time. The function is compiled with
 *     __attribute__((target("sse4.2"))) rather than -msse4.2/-march=native, so the
 *     module still loads on a CPU without it; __builtin_cpu_supports decides at run time.
 *     One crc32 waits for the one before it (three cycles of latency, one of
 *     throughput), so a long buffer is cut into blocks of three equal streams whose
 *     registers advance side by side, and joined after each block: the register of
 *     ``A`` followed by ``B`` is that of ``A`` moved over |B| zero bytes, XOR the
 *     register of ``B`` begun at zero (the raw register is linear in GF(2)). Moving a
 *     register over a block's length is four table lookups (tables filled at setup from
 *     the one-zero-bit operator, squared). A fetch answer's frame is checked three times
 *     as fast; a record, shorter than a short block, one stream as before.
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

/* A GF(2) operator on the 32-bit register: column n is the image of bit n. */
static uint32_t mq_gf2_apply(const uint32_t *operator_, uint32_t vector)
{
    uint32_t sum = 0;
    for (int n = 0; vector; n++, vector >>= 1)
        if (vector & 1U)
            sum ^= operator_[n];
    return sum;
}

static void mq_gf2_square(uint32_t *square, const uint32_t *operator_)
{
    for (int n = 0; n < 32; n++)
        square[n] = mq_gf2_apply(operator_, operator_[n]);
}

/* mq_crc32c_zeros[k]: the operator "move the register over 2^k zero bytes". */
static uint32_t mq_crc32c_zeros[64][32];

static void mq_crc32c_fill_zeros(void)
{
    uint32_t *operator_ = mq_crc32c_zeros[0];
    operator_[0] = MQ_CRC32C_POLY;  /* one zero bit: shift right, fold bit 0 back in */
    for (int n = 1; n < 32; n++)
        operator_[n] = 1U << (n - 1);
    for (int bits = 1; bits < 8; bits *= 2) {  /* one bit -> one byte */
        uint32_t square[32];
        mq_gf2_square(square, operator_);
        memcpy(operator_, square, sizeof square);
    }
    for (int k = 1; k < 64; k++)
        mq_gf2_square(mq_crc32c_zeros[k], mq_crc32c_zeros[k - 1]);
}

/* The CRC32C of A then B from crc32c(A), crc32c(B) and |B| (zlib's crc32_combine): the
 * register is linear, so A's moves over |B| zero bytes and B's is added; the
 * inversions at both ends cancel. A frame's CRC over a payload sent from a file
 * (sendfile) whose CRC the log computed without copying it. */
static inline uint32_t mq_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b)
{
    for (int k = 0; size_b; k++, size_b >>= 1)
        if (size_b & 1U)
            crc_a = mq_gf2_apply(mq_crc32c_zeros[k], crc_a);
    return crc_a ^ crc_b;
}

#if MQ_CRC32C_HAVE_SSE42
/* Three streams of this many bytes each make a block (long blocks first, then short). */
#define MQ_CRC32C_LONG 8192
#define MQ_CRC32C_SHORT 256

/* mq_crc32c_shift_*[k][b]: the raw register (b << 8k) moved over LONG / SHORT zero
 * bytes; the register c moved is the XOR of its four bytes' entries. */
static uint32_t mq_crc32c_shift_long[4][256];
static uint32_t mq_crc32c_shift_short[4][256];

/* Fill table with the operator "move over ``bytes`` zero bytes" (a power of two). */
static void mq_crc32c_fill_shift(uint32_t table[4][256], size_t bytes)
{
    uint32_t operator_[32], square[32];
    operator_[0] = MQ_CRC32C_POLY;  /* one zero bit: shift right, fold bit 0 back in */
    for (int n = 1; n < 32; n++)
        operator_[n] = 1U << (n - 1);
    for (size_t bits = 1; bits < 8 * bytes; bits *= 2) {
        mq_gf2_square(square, operator_);
        memcpy(operator_, square, sizeof square);
    }
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++)
            table[k][b] = mq_gf2_apply(operator_, b << (8 * k));
}

static inline uint32_t mq_crc32c_shift(const uint32_t table[4][256], uint32_t crc)
{
    return table[0][crc & 0xFF] ^ table[1][(crc >> 8) & 0xFF]
        ^ table[2][(crc >> 16) & 0xFF] ^ table[3][crc >> 24];
}

/* Whole blocks of three ``stream``-byte streams from *p; returns the register after
 * them and moves *p and *n past them. */
__attribute__((target("sse4.2")))
static inline uint64_t mq_crc32c_hw_blocks(uint64_t c0, const unsigned char **p, size_t *n,
                                           size_t stream, const uint32_t table[4][256])
{
    const unsigned char *at = *p;
    uint64_t c1, c2, word;
    while (*n >= 3 * stream) {
        const unsigned char *end = at + stream;
        c1 = c2 = 0;
        do {  /* Unaligned 8-byte loads cost nothing extra on CPUs with SSE4.2. */
            memcpy(&word, at, 8);
            c0 = _mm_crc32_u64(c0, word);
            memcpy(&word, at + stream, 8);
            c1 = _mm_crc32_u64(c1, word);
            memcpy(&word, at + 2 * stream, 8);
            c2 = _mm_crc32_u64(c2, word);
            at += 8;
        } while (at < end);
        c0 = mq_crc32c_shift(table, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = mq_crc32c_shift(table, (uint32_t)c0) ^ (uint32_t)c2;
        at += 2 * stream;
        *n -= 3 * stream;
    }
    *p = at;
    return c0;
}

__attribute__((target("sse4.2")))
static uint32_t mq_crc32c_hw(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c = crc, word;
    c = mq_crc32c_hw_blocks(c, &p, &n, MQ_CRC32C_LONG, mq_crc32c_shift_long);
    c = mq_crc32c_hw_blocks(c, &p, &n, MQ_CRC32C_SHORT, mq_crc32c_shift_short);
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
    mq_crc32c_fill_zeros();
#if MQ_CRC32C_HAVE_SSE42
    __builtin_cpu_init();
    mq_crc32c_use_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    mq_crc32c_fill_shift(mq_crc32c_shift_long, MQ_CRC32C_LONG);
    mq_crc32c_fill_shift(mq_crc32c_shift_short, MQ_CRC32C_SHORT);
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
