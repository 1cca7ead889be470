/* mtpscope: one-pass reductions over a row of logits (n_vocab float32 values), for the recorder.
 *
 * Built on first use by mtpscope.traces.run.row_kernels (cc -O3 -ffp-contract=off -shared -fPIC) into the
 * cache folder and loaded with ctypes; the numpy functions of traces/run/target_side.py and
 * traces/run/ranking.py are the reference (and the fall-back) and tests/test_row_kernels.py holds the two
 * against each other and against float64.
 *
 *   mtps_target_stats: max, then Z = sum exp(x - m) and S = sum exp(x - m) * (x - m) in one pass
 *                      (p(d) = exp(x[d] - m) / Z, H = log Z - S / Z: traces/run/target_side.py's formulas)
 *   mtps_top_k:        the k largest values, best first, ties by the lower index (exact: comparisons only)
 *   mtps_count_greater: how many values are strictly greater than v (a rank)
 *
 * exp: Cephes' expf (S. L. Moshier, Cephes Math Library 2.2): x = n ln 2 + r with |r| <= ln(2)/2 (ln 2 in two
 * parts, 0.693359375 and -2.12194440e-4), a degree-7 polynomial for exp(r) (relative error about 1e-7 on that
 * range), times 2^n built in the exponent bits; written without branches so that the compiler vectorizes it.
 * Arguments below -87.33 (where float32 exp reaches the denormals) are clamped there: such a term adds at most
 * n_vocab * 1.2e-38 to Z >= 1. The sums run in float64 lanes (16 partial sums), so their rounding is far below
 * the exponential's. -ffp-contract=off: no fused multiply-adds, so every build computes the same bits.
 * On x86-64 with GCC the functions are compiled for AVX-512, AVX2 and the baseline, chosen at load time
 * (target_clones): AVX2-only CPUs get AVX2 code, and every clone computes the same values.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MTPS_NO_CLONES)
#define MTPS_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define MTPS_CLONES
#endif

#define MTPS_LANES 16
#define MTPS_INNER 16 /* vectors per float32 block of the sums */
#define MTPS_EXP_LO (-87.33654f) /* float32 exp is normal above ln(2^-126) */

static inline float mtps_expf(float x) {
    x = x > MTPS_EXP_LO ? x : MTPS_EXP_LO;
    /* n = round(x / ln 2): adding and removing 1.5 * 2^23 rounds to the nearest integer (|x / ln 2| < 2^22) */
    float t = x * 1.44269504088896341f + 12582912.0f;
    float n = t - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float r2 = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r2 + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* the same exponential on 16 lanes (GCC / clang vector extensions: each clone lowers them to its widest
 * registers); comparisons give 0 / -1 lanes, used as bit masks for the clamp */
typedef float mtps_v16f __attribute__((vector_size(64)));
typedef int32_t mtps_v16i __attribute__((vector_size(64)));
typedef double mtps_v16d __attribute__((vector_size(128)));

/* the largest value of x[0..n) and whether any value is NaN */
MTPS_CLONES
static float mtps_max(const float *x, int64_t n, int *has_nan) {
    mtps_v16f m = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY,
                   -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    mtps_v16i bad = {0};
    int64_t i = 0;
    for (; i + MTPS_LANES <= n; i += MTPS_LANES) {
        mtps_v16f v;
        memcpy(&v, x + i, sizeof v);
        mtps_v16i gt = v > m, mb, vb;
        memcpy(&mb, &m, sizeof m);
        memcpy(&vb, &v, sizeof v);
        mb = (vb & gt) | (mb & ~gt);
        memcpy(&m, &mb, sizeof m);
        bad |= v != v;
    }
    float best = -INFINITY;
    int any = 0;
    for (; i < n; i++) {
        best = x[i] > best ? x[i] : best;
        any |= x[i] != x[i];
    }
    for (int j = 0; j < MTPS_LANES; j++) {
        best = m[j] > best ? m[j] : best;
        any |= bad[j] != 0;
    }
    *has_nan = any;
    return best;
}

static inline mtps_v16f mtps_clamp_lo(mtps_v16f x) {
    const mtps_v16f lo = {MTPS_EXP_LO, MTPS_EXP_LO, MTPS_EXP_LO, MTPS_EXP_LO, MTPS_EXP_LO, MTPS_EXP_LO,
                          MTPS_EXP_LO, MTPS_EXP_LO, MTPS_EXP_LO, MTPS_EXP_LO, MTPS_EXP_LO, MTPS_EXP_LO,
                          MTPS_EXP_LO, MTPS_EXP_LO, MTPS_EXP_LO, MTPS_EXP_LO};
    mtps_v16i keep = x > lo; /* -1 where x is above the clamp */
    mtps_v16i xb, lb, out;
    memcpy(&xb, &x, sizeof x);
    memcpy(&lb, &lo, sizeof lo);
    out = (xb & keep) | (lb & ~keep);
    mtps_v16f r;
    memcpy(&r, &out, sizeof r);
    return r;
}

static inline mtps_v16f mtps_expv(mtps_v16f x) { /* x already clamped: mtps_expf's steps, lane by lane */
    mtps_v16f t = x * 1.44269504088896341f + 12582912.0f;
    mtps_v16f n = t - 12582912.0f;
    mtps_v16f r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    mtps_v16f r2 = r * r;
    mtps_v16f p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r2 + r + 1.0f;
    mtps_v16i bits = (__builtin_convertvector(n, mtps_v16i) + 127) << 23;
    mtps_v16f scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* Z = sum exp(x - m), S = sum exp(x - m) * (x - m) (the clamped argument: a -inf logit adds nothing) */
MTPS_CLONES
static void mtps_sums(const float *x, int64_t n, float m, double *z_out, double *s_out) {
    mtps_v16d z = {0}, s = {0};
    int64_t i = 0;
    /* float32 lane sums over blocks of MTPS_INNER vectors (16 terms a lane: a relative rounding of at most about
     * 16 * 2^-24), each block's added into the float64 lanes */
    for (; i + MTPS_LANES * MTPS_INNER <= n; i += MTPS_LANES * MTPS_INNER) {
        mtps_v16f zb = {0}, sb = {0};
        for (int b = 0; b < MTPS_INNER; b++) {
            mtps_v16f v;
            memcpy(&v, x + i + b * MTPS_LANES, sizeof v);
            mtps_v16f d = mtps_clamp_lo(v - m);
            mtps_v16f e = mtps_expv(d);
            zb += e;
            sb += e * d;
        }
        z += __builtin_convertvector(zb, mtps_v16d);
        s += __builtin_convertvector(sb, mtps_v16d);
    }
    for (; i + MTPS_LANES <= n; i += MTPS_LANES) {
        mtps_v16f v;
        memcpy(&v, x + i, sizeof v);
        mtps_v16f d = mtps_clamp_lo(v - m);
        mtps_v16f e = mtps_expv(d);
        z += __builtin_convertvector(e, mtps_v16d);
        s += __builtin_convertvector(e * d, mtps_v16d);
    }
    double zt = 0.0, st = 0.0;
    for (; i < n; i++) {
        float d = x[i] - m;
        d = d > MTPS_EXP_LO ? d : MTPS_EXP_LO;
        float e = mtps_expf(d);
        zt += (double)e;
        st += (double)(e * d);
    }
    for (int j = 0; j < MTPS_LANES; j++) {
        zt += z[j];
        st += s[j];
    }
    *z_out = zt;
    *s_out = st;
}

/* p[i] and h[i] for each of n_rows rows (rows[i]: n_vocab values; tokens[i] in [0, n_vocab), checked by the
 * caller); NaN where a row holds a NaN or its largest value is not finite */
void mtps_target_stats(const float *const *rows, int64_t n_rows, int64_t n_vocab, const int64_t *tokens,
                       double *p, double *h) {
    for (int64_t i = 0; i < n_rows; i++) {
        const float *x = rows[i];
        int has_nan = 0;
        float m = mtps_max(x, n_vocab, &has_nan);
        p[i] = NAN;
        h[i] = NAN;
        if (has_nan || !isfinite(m))
            continue;
        double z, s;
        mtps_sums(x, n_vocab, m, &z, &s);
        if (!(z > 0.0) || !isfinite(z))
            continue;
        float d = x[tokens[i]] - m;
        d = d > MTPS_EXP_LO ? d : MTPS_EXP_LO;
        p[i] = (double)mtps_expf(d) / z;
        h[i] = log(z) - s / z;
    }
}

/* insert (v, i) into the best-first list vals/ids of length *len (capacity k), after the equal values (an
 * earlier index wins a tie) */
static void mtps_insert(float *vals, int64_t *ids, int64_t *len, int64_t k, float v, int64_t i) {
    int64_t pos = *len < k ? *len : k - 1;
    while (pos > 0 && vals[pos - 1] < v) {
        if (pos < k) {
            vals[pos] = vals[pos - 1];
            ids[pos] = ids[pos - 1];
        }
        pos--;
    }
    vals[pos] = v;
    ids[pos] = i;
    if (*len < k)
        (*len)++;
}

#define MTPS_BLOCK 512

/* the indices of the k largest values of x[0..n), best first, ties by the lower index, into ids (room for
 * k; k <= 4096); NaN values are skipped; returns how many were written (min(k, number of non-NaN values)) */
MTPS_CLONES
int64_t mtps_top_k(const float *x, int64_t n, int64_t k, int64_t *ids) {
    float vals[4096];
    if (k > 4096)
        k = 4096;
    if (k <= 0)
        return 0;
    int64_t len = 0, i = 0;
    /* fill the list with the first k non-NaN values */
    for (; i < n && len < k; i++)
        if (x[i] == x[i])
            mtps_insert(vals, ids, &len, k, x[i], i);
    /* then a block can only matter if its maximum beats the k-th value */
    for (; i < n && (i % MTPS_BLOCK) != 0; i++)
        if (x[i] > vals[k - 1])
            mtps_insert(vals, ids, &len, k, x[i], i);
    for (; i + MTPS_BLOCK <= n; i += MTPS_BLOCK) {
        /* any lane of the block above the k-th value? (NaN compares false) */
        float thr = vals[k - 1];
        mtps_v16i hit = {0};
        for (int j = 0; j < MTPS_BLOCK; j += MTPS_LANES) {
            mtps_v16f v;
            memcpy(&v, x + i + j, sizeof v);
            hit |= v > thr;
        }
        int any = 0;
        for (int j = 0; j < MTPS_LANES; j++)
            any |= hit[j];
        if (!any)
            continue;
        for (int j = 0; j < MTPS_BLOCK; j++)
            if (x[i + j] > vals[k - 1])
                mtps_insert(vals, ids, &len, k, x[i + j], i + j);
    }
    for (; i < n; i++)
        if (x[i] > vals[k - 1])
            mtps_insert(vals, ids, &len, k, x[i], i);
    return len;
}

/* how many values of x[0..n) are strictly greater than v */
MTPS_CLONES
int64_t mtps_count_greater(const float *x, int64_t n, float v) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++)
        c += x[i] > v;
    return c;
}
