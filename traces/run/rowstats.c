/* mtpscope: one-pass reductions over a row of logits (n_vocab float32 values), for the recorder.
 *
 * Built on first use by mtpscope.traces.run.row_kernels into the cache folder and loaded with ctypes; the numpy
 * functions of traces/run/target_side.py and traces/run/ranking.py are the reference (and the fall-back) and
 * tests/test_row_kernels.py holds the two against each other and against float64.
 *
 *   mtps_target_stats:  max, then Z = sum exp(x - m) and S = sum exp(x - m) * (x - m) in one pass
 *                       (p(d) = exp(x[d] - m) / Z, H = log Z - S / Z: traces/run/target_side.py's formulas)
 *   mtps_top_k:         the k largest values, best first, ties by the lower index (exact: comparisons only)
 *   mtps_copy_top_k:    mtps_top_k, the row copied to another buffer in the same read
 *   mtps_count_greater: how many values are strictly greater than v (a rank)
 *
 * exp: Cephes' expf (S. L. Moshier, Cephes Math Library 2.2): x = n ln 2 + r with |r| <= ln(2)/2 (ln 2 in two
 * parts, 0.693359375 and -2.12194440e-4), a degree-7 polynomial for exp(r) (relative error about 1e-7 on that
 * range), times 2^n built in the exponent bits; without branches, on vectors; each multiply-add of the reduction,
 * the polynomial and the sum S fused (one rounding: mtps_fma), which halves the instructions per value. Arguments below -87.33 (where
 * float32 exp reaches the denormals) are clamped there: such a term adds at most n_vocab * 1.2e-38 to Z >= 1.
 *
 * One build per instruction set (row_kernels picks the flags for the CPU it runs on): MTPS_W, the lanes of one
 * register (16 with AVX-512, 8 with AVX2, 4 otherwise), follows the compiler's target. The sums always run in
 * 16 logical lanes (MTPS_LANES: 16 / MTPS_W registers side by side), float32 over blocks of MTPS_INNER vectors
 * (16 terms a lane: about 16 * 2^-24 relative), then float64, added in one fixed order. With -ffp-contract=off
 * the compiler fuses nothing itself, and the fused multiply-adds written here round once in every build (FMA
 * instructions, or libm's fmaf in the baseline build), so every build computes the same bits.
 */
#include <math.h>
#include <stdint.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#define MTPS_W 16
#elif defined(__AVX2__)
#define MTPS_W 8
#else
#define MTPS_W 4
#endif
#define MTPS_LANES 16                 /* logical lanes of the sums and of the maximum */
#define MTPS_PARTS (MTPS_LANES / MTPS_W) /* registers per 16 logical lanes */
#define MTPS_INNER 16                 /* 16-value groups per float32 block of the sums */
#define MTPS_EXP_LO (-87.33654f)      /* float32 exp is normal above ln(2^-126) */
#define MTPS_BLOCK 512                /* values per block of the top-k scan */

typedef float mtps_vf __attribute__((vector_size(4 * MTPS_W)));
typedef int32_t mtps_vi __attribute__((vector_size(4 * MTPS_W)));
typedef double mtps_vd __attribute__((vector_size(8 * MTPS_W)));

/* the version of this file's build choices, checked by row_kernels after loading */
int64_t mtps_lanes(void) { return MTPS_W; }

static inline mtps_vf mtps_load(const float *x) {
    mtps_vf v;
    memcpy(&v, x, sizeof v);
    return v;
}

/* lanes where keep is -1 from a, the others from b */
static inline mtps_vf mtps_select(mtps_vi keep, mtps_vf a, mtps_vf b) {
    mtps_vi ab, bb, out;
    memcpy(&ab, &a, sizeof a);
    memcpy(&bb, &b, sizeof b);
    out = (ab & keep) | (bb & ~keep);
    mtps_vf r;
    memcpy(&r, &out, sizeof r);
    return r;
}

/* a * b + c in each lane, rounded once (IEEE fusedMultiplyAdd): the FMA instructions of the AVX-512 and AVX2
 * builds, libm's fmaf (also correctly rounded) lane by lane in the baseline build -- so every build computes the
 * same bits */
static inline mtps_vf mtps_fma(mtps_vf a, mtps_vf b, mtps_vf c) {
#if MTPS_W == 16
    return (mtps_vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif MTPS_W == 8
    return (mtps_vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    mtps_vf r;
    for (int j = 0; j < MTPS_W; j++)
        r[j] = fmaf(a[j], b[j], c[j]);
    return r;
#endif
}

#define MTPS_SPLAT(v) ((mtps_vf){0} + (v))

/* exp of each lane (x already clamped, see the top of the file): Cephes' reduction and polynomial, each
 * multiply-add fused */
static inline mtps_vf mtps_expv(mtps_vf x) {
    mtps_vf t = mtps_fma(x, MTPS_SPLAT(1.44269504088896341f), MTPS_SPLAT(12582912.0f));
    mtps_vf n = t - 12582912.0f;
    mtps_vf r = mtps_fma(n, MTPS_SPLAT(-0.693359375f), x);
    r = mtps_fma(n, MTPS_SPLAT(2.12194440e-4f), r);
    mtps_vf r2 = r * r;
    mtps_vf p = mtps_fma(r, MTPS_SPLAT(1.9875691500e-4f), MTPS_SPLAT(1.3981999507e-3f));
    p = mtps_fma(p, r, MTPS_SPLAT(8.3334519073e-3f));
    p = mtps_fma(p, r, MTPS_SPLAT(4.1665795894e-2f));
    p = mtps_fma(p, r, MTPS_SPLAT(1.6666665459e-1f));
    p = mtps_fma(p, r, MTPS_SPLAT(5.0000001201e-1f));
    p = mtps_fma(p, r2, r) + 1.0f;
    mtps_vi bits = (__builtin_convertvector(n, mtps_vi) + 127) << 23;
    mtps_vf scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* the largest value of x[0..n) and whether any value is NaN */
static float mtps_max(const float *x, int64_t n, int *has_nan) {
    mtps_vf m = (mtps_vf){0} - INFINITY;
    mtps_vi bad = {0};
    int64_t i = 0;
    for (; i + MTPS_W <= n; i += MTPS_W) {
        mtps_vf v = mtps_load(x + i);
        m = mtps_select(v > m, v, m);
        bad |= v != v;
    }
    float best = -INFINITY;
    int any = 0;
    for (; i < n; i++) {
        best = x[i] > best ? x[i] : best;
        any |= x[i] != x[i];
    }
    for (int j = 0; j < MTPS_W; j++) {
        best = m[j] > best ? m[j] : best;
        any |= bad[j] != 0;
    }
    *has_nan = any;
    return best;
}

/* Z = sum exp(x - m), S = sum exp(x - m) * (x - m) (the clamped argument: a -inf logit adds nothing); value
 * i goes to logical lane i % 16 */
static void mtps_sums(const float *x, int64_t n, float m, double *z_out, double *s_out) {
    const mtps_vf lo = (mtps_vf){0} + MTPS_EXP_LO;
    mtps_vd z[MTPS_PARTS], s[MTPS_PARTS];
    for (int p = 0; p < MTPS_PARTS; p++) {
        z[p] = (mtps_vd){0};
        s[p] = (mtps_vd){0};
    }
    int64_t i = 0;
    for (; i + MTPS_LANES * MTPS_INNER <= n; i += MTPS_LANES * MTPS_INNER) {
        mtps_vf zb[MTPS_PARTS], sb[MTPS_PARTS];
        for (int p = 0; p < MTPS_PARTS; p++) {
            zb[p] = (mtps_vf){0};
            sb[p] = (mtps_vf){0};
        }
        for (int b = 0; b < MTPS_INNER; b++) {
            for (int p = 0; p < MTPS_PARTS; p++) {
                mtps_vf d = mtps_load(x + i + b * MTPS_LANES + p * MTPS_W) - m;
                d = mtps_select(d > lo, d, lo);
                mtps_vf e = mtps_expv(d);
                zb[p] += e;
                sb[p] = mtps_fma(e, d, sb[p]);
            }
        }
        for (int p = 0; p < MTPS_PARTS; p++) {
            z[p] += __builtin_convertvector(zb[p], mtps_vd);
            s[p] += __builtin_convertvector(sb[p], mtps_vd);
        }
    }
    for (; i + MTPS_LANES <= n; i += MTPS_LANES) {
        for (int p = 0; p < MTPS_PARTS; p++) {
            mtps_vf d = mtps_load(x + i + p * MTPS_W) - m;
            d = mtps_select(d > lo, d, lo);
            mtps_vf e = mtps_expv(d);
            z[p] += __builtin_convertvector(e, mtps_vd);
            s[p] += __builtin_convertvector(e * d, mtps_vd);
        }
    }
    double zt = 0.0, st = 0.0;
    /* the last n % 16 values: the same exponential, a register at a time (the lanes past the end hold the clamp),
     * added in index order */
    for (; i < n; i += MTPS_W) {
        float buf[MTPS_W];
        for (int j = 0; j < MTPS_W; j++)
            buf[j] = i + j < n ? x[i + j] - m : MTPS_EXP_LO;
        mtps_vf d = mtps_load(buf);
        d = mtps_select(d > lo, d, lo);
        mtps_vf e = mtps_expv(d), ed = e * d;
        for (int j = 0; j < MTPS_W && i + j < n; j++) {
            zt += (double)e[j];
            st += (double)ed[j];
        }
    }
    for (int p = 0; p < MTPS_PARTS; p++) {
        for (int j = 0; j < MTPS_W; j++) {
            zt += z[p][j];
            st += s[p][j];
        }
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
        mtps_vf d = (mtps_vf){0} + (x[tokens[i]] - m);
        d = mtps_select(d > (mtps_vf){0} + MTPS_EXP_LO, d, (mtps_vf){0} + MTPS_EXP_LO);
        p[i] = (double)mtps_expv(d)[0] / z;
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

/* the largest non-NaN value of x[0..n) (-inf when there is none) */
static float mtps_block_max(const float *x, int64_t n) {
    mtps_vf m = (mtps_vf){0} - INFINITY;
    int64_t i = 0;
    for (; i + MTPS_W <= n; i += MTPS_W) {
        mtps_vf v = mtps_load(x + i);
        m = mtps_select(v > m, v, m); /* (NaN compares false) */
    }
    float best = -INFINITY;
    for (; i < n; i++)
        best = x[i] > best ? x[i] : best;
    for (int j = 0; j < MTPS_W; j++)
        best = m[j] > best ? m[j] : best;
    return best;
}

/* the k-th largest of v[0..n) (k <= n), with best[0..k) as room: an insertion list of the k largest so far */
static float mtps_kth_largest(const float *v, int64_t n, int64_t k, float *best) {
    int64_t len = 0;
    for (int64_t i = 0; i < n; i++) {
        float x = v[i];
        if (len == k && !(x > best[k - 1]))
            continue;
        int64_t pos = len < k ? len : k - 1;
        while (pos > 0 && best[pos - 1] < x) {
            best[pos] = best[pos - 1];
            pos--;
        }
        best[pos] = x;
        if (len < k)
            len++;
    }
    return best[k - 1];
}

/* the indices of the k largest values of x[0..n), best first, ties by the lower index, into ids (room for
 * k; k <= 4096); NaN values are skipped; when dst is not NULL, x is also copied into dst[0..n); returns how many
 * ids were written (min(k, number of non-NaN values)).
 *
 * Two passes. The first copies each block of MTPS_BLOCK values (when dst is given) and takes its largest value,
 * reading the block once. Let t be the k-th largest of those block maxima: the k blocks they come from hold k
 * values >= t, so every one of the k largest values is >= t and lies in a block whose maximum is >= t. The second
 * pass runs an insertion list over those blocks only, in index order (at least k blocks; more only where block
 * maxima tie), so ties keep the lower index. Fewer than k blocks with a non-NaN maximum: every block is scanned. */
static int64_t mtps_scan_top_k(const float *x, float *dst, int64_t n, int64_t k, int64_t *ids) {
    float vals[4096];
    if (k > 4096)
        k = 4096;
    if (k <= 0 || n <= 0) {
        if (dst && n > 0)
            memcpy(dst, x, (size_t)n * sizeof(float));
        return 0;
    }
    int64_t nb = (n + MTPS_BLOCK - 1) / MTPS_BLOCK;
    float stack_bm[1024], stack_finite[1024];
    float *bm = stack_bm, *finite = stack_finite;
    if (nb > 1024) {
        bm = malloc((size_t)nb * 2 * sizeof(float));
        if (!bm)
            return -1;
        finite = bm + nb;
    }
    int64_t n_finite = 0;
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * MTPS_BLOCK, w = n - i0 < MTPS_BLOCK ? n - i0 : MTPS_BLOCK;
        if (w == MTPS_BLOCK) { /* a whole block: one vector loop copies it and takes its maximum */
            mtps_vf m = (mtps_vf){0} - INFINITY;
            for (int j = 0; j < MTPS_BLOCK; j += MTPS_W) {
                mtps_vf v = mtps_load(x + i0 + j);
                if (dst)
                    memcpy(dst + i0 + j, &v, sizeof v);
                m = mtps_select(v > m, v, m); /* (NaN compares false) */
            }
            float best = -INFINITY;
            for (int j = 0; j < MTPS_W; j++)
                best = m[j] > best ? m[j] : best;
            bm[b] = best;
        } else {
            if (dst)
                memcpy(dst + i0, x + i0, (size_t)w * sizeof(float));
            bm[b] = mtps_block_max(x + i0, w);
        }
        if (bm[b] == bm[b] && bm[b] > -INFINITY)
            finite[n_finite++] = bm[b];
    }
    /* a block whose values are all -inf (or NaN) cannot be told apart by its maximum: then scan everything */
    float thr = -INFINITY;
    int scan_all = n_finite < k;
    if (!scan_all)
        thr = mtps_kth_largest(finite, n_finite, k, vals);
    int64_t len = 0;
    for (int64_t b = 0; b < nb; b++) {
        if (!scan_all && !(bm[b] >= thr))
            continue;
        int64_t i0 = b * MTPS_BLOCK, i1 = i0 + MTPS_BLOCK < n ? i0 + MTPS_BLOCK : n;
        if (len == k && i1 - i0 == MTPS_BLOCK) { /* a full list: skip a block with nothing above its k-th (a flat
                                                  * row's blocks all tie at the threshold) */
            float kth = vals[k - 1];
            mtps_vi hit = {0};
            for (int j = 0; j < MTPS_BLOCK; j += MTPS_W)
                hit |= mtps_load(x + i0 + j) > kth; /* (NaN compares false) */
            int any = 0;
            for (int j = 0; j < MTPS_W; j++)
                any |= hit[j];
            if (!any)
                continue;
        }
        for (int64_t i = i0; i < i1; i++) {
            float v = x[i];
            if (v != v)
                continue;
            if (len < k || v > vals[k - 1])
                mtps_insert(vals, ids, &len, k, v, i);
        }
    }
    if (bm != stack_bm)
        free(bm);
    return len;
}

int64_t mtps_top_k(const float *x, int64_t n, int64_t k, int64_t *ids) {
    return mtps_scan_top_k(x, NULL, n, k, ids);
}

/* mtps_top_k of x, and x copied into dst[0..n) in the same read; -2 (the copy made all the same) when one of
 * the first k values is a NaN, where traces/run/ranking.py's top_k_desc gives numpy's answer instead */
int64_t mtps_copy_top_k(const float *x, float *dst, int64_t n, int64_t k, int64_t *ids) {
    int64_t got = mtps_scan_top_k(x, dst, n, k, ids);
    for (int64_t i = 0; i < k && i < n; i++)
        if (x[i] != x[i])
            return -2;
    return got;
}

/* how many values of x[0..n) are strictly greater than v */
int64_t mtps_count_greater(const float *x, int64_t n, float v) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++)
        c += x[i] > v;
    return c;
}
