/* The sampler's passes over the vocabulary, fused (issue 23, item 3): the float64 exps
 * (top-p's total, the unsorted distribution, min-p's kept mass), the rank count, top-p's
 * threshold sets and its bins.
 *
 * An optional C extension: sampler_fused.py calls it when it was built and falls back to
 * numpy (the same arithmetic, pass by pass) when it was not. Each function reads and
 * writes numpy arrays through the buffer protocol (no numpy headers) and does in one
 * pass what numpy does in two to five: numpy 2.4 has no vectorised float64 exp for
 * AVX2 (6.3 ns a token), and each numpy call costs a pass over memory and a Python call.
 *
 * The exp (kexp) is a Cody-Waite reduction and a degree-13 Taylor polynomial, written so
 * that gcc vectorises it (-O3 -fno-trapping-math, with an AVX2+FMA clone chosen at run time
 * on x86-64; 1.7-2.0 ns a token against numpy's 6.3 for float64 here): within 2 ulp of the
 * correctly rounded exp on x <= 0 (the only arguments the sampler passes: logits minus
 * their maximum), exp(-inf) = 0, NaN stays NaN (tests/test_sampler_kernel.py).
 * Sums are taken in another order than numpy's (several accumulators), so totals differ
 * from numpy's in the last bits: far inside the 1e-9 the chain is held to.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KERNEL_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define KERNEL_AVX2 1
#include <immintrin.h>
#else
#define KERNEL_CLONES
#endif

#define LOG2E 1.4426950408889634074
#define LN2_HI 6.93147180369123816490e-01 /* 32 significant bits: n * LN2_HI is exact */
#define LN2_LO 1.90821492927058770002e-10
#define ROUNDER 6755399441055744.0 /* 0x1.8p52: adding it rounds to an integer */

/* exp(x) for x <= 0 (x < -746 gives 0, as exp underflows there; NaN stays NaN). */
static inline double kexp(double x) {
    double xc = x < -746.0 ? -746.0 : x; /* (vectorised with -fno-trapping-math) */
    double k = xc * LOG2E + ROUNDER;
    double n = k - ROUNDER;
    double r = (xc - n * LN2_HI) - n * LN2_LO;
    /* the Taylor polynomial of degree 13 by Estrin's scheme (a shorter chain of
       dependent operations than Horner's: 1.7 ns a token against 2.1 here) */
    double r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
    double c0 = 1.0 + r, c1 = 0.5 + r * (1.0 / 6.0), c2 = 1.0 / 24.0 + r * (1.0 / 120.0);
    double c3 = 1.0 / 720.0 + r * (1.0 / 5040.0), c4 = 1.0 / 40320.0 + r * (1.0 / 362880.0);
    double c5 = 1.0 / 3628800.0 + r * (1.0 / 39916800.0), c6 = 1.0 / 479001600.0 + r * (1.0 / 6227020800.0);
    double d0 = c0 + r2 * c1, d1 = c2 + r2 * c3, d2 = c4 + r2 * c5;
    double e0 = d0 + r4 * d1, e1 = d2 + r4 * c6;
    double p = e0 + r8 * e1;
    /* 2^(n + 64) is a normal number for n in [-1077, 0]; the product with 2^-64 then
       rounds once, where the result is subnormal, and is exact elsewhere */
    int64_t kb, sb;
    memcpy(&kb, &k, sizeof kb);
    int64_t ni = kb - (int64_t)0x4338000000000000LL; /* the bits of k minus those of ROUNDER: n */
    sb = (ni + 1023 + 64) << 52;
    double scale;
    memcpy(&scale, &sb, sizeof scale);
    double y = p * scale * 0x1p-64;
    return x != x ? x : y;
}

/* ---- the float64 exp, four lanes at a time, by hand (AVX2 + FMA) -----------------------
 * gcc's vectorisation of kexp spills its constants and partial results to the stack (some
 * 75 instructions for four exps); written out with intrinsics, the same reduction (Cody-Waite,
 * k rounded by the 1.5 * 2^52 trick) and the same degree-13 Taylor polynomial (Estrin's
 * scheme, FMAs) take some 30: 0.9 ns a token against 1.6 on this machine
 * (docs/performance.md). The scaling by 2^n is an addition to the exponent's bits where the
 * result is normal (x >= -708), else kexp's two products (a subnormal result, rounded once).
 * Within 2 ulp of numpy's exp on x <= 0 like kexp (tests/test_sampler_kernel.py); every pass
 * below uses it where the CPU has AVX2 and FMA (kernel_fma), kexp otherwise, so the passes of
 * one machine agree with each other bit for bit (a tail of fewer than four lanes is padded:
 * a value's bits do not depend on its lane). */
static int kernel_fma = 0;
/* the long passes by parts (gramcost2, at the end of the file): SPLIT_PART positions a part */
#define SPLIT_PART 8192
static double exp_sum_parts(const float *x, double shift, double *q, Py_ssize_t n);
static double exp_sum_above_parts(const float *x, double shift, float v, int64_t *ids, double *qs, Py_ssize_t n,
                                  Py_ssize_t *kout, double *qf, int stored);

/* One part's figures (scan_body): its sums (t, the side's a and ak), the largest forbidden and
   allowed values, how many forbidden, and the count of allowed ids written up to its end. */
typedef struct {
    double t, a, ak;
    float fmax, smax;
    Py_ssize_t forbidden, c;
} scan_part_out;

#ifdef KERNEL_AVX2
/* the helper thread (at the end of the file): offer a scan's parts, take a part, a part it did, the end */
static int split_scan(const float *x, const float *wk, const uint32_t *w, double shift, Py_ssize_t body, int many,
                      int64_t *ids, float *src, double *q, float *smp);
static int split_take(Py_ssize_t p);
static scan_part_out split_scanned(Py_ssize_t p);
static void split_end(void);
static int split_raw(const float *x, float m, Py_ssize_t n, Py_ssize_t half, int want64, float *copy);
static int split_dist(const void *x, int f32, double shift, double t, double *w, double *bp, Py_ssize_t block,
                      Py_ssize_t n);
static double split_dist_wz(Py_ssize_t j);
#endif
/* A pass in two halves (chain15): fn(arg, 0) on the calling thread and fn(arg, 1) on the helper where it is
   free and takes it; else fn(arg, 2) after the first on the calling thread (the second half, which may go
   on from the first's state: a one-thread pass); each half writes its own results, the caller combines
   them (at the end of the file). */
typedef void (*half_fn)(void *arg, int half);
static void run_halves(half_fn fn, void *arg, Py_ssize_t n);

#ifdef KERNEL_AVX2
#pragma GCC push_options
#pragma GCC target("avx2,fma")
static inline __attribute__((always_inline)) __m256d exp4(__m256d x) {
    __m256d xc = _mm256_max_pd(_mm256_set1_pd(-746.0), x); /* (NaN: x, its second operand) */
    __m256d k = _mm256_fmadd_pd(xc, _mm256_set1_pd(LOG2E), _mm256_set1_pd(ROUNDER));
    __m256d n = _mm256_sub_pd(k, _mm256_set1_pd(ROUNDER));
    __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(LN2_HI), xc);
    r = _mm256_fnmadd_pd(n, _mm256_set1_pd(LN2_LO), r);
    /* kexp's polynomial, by Estrin's scheme (Horner's chain of 13 dependent FMAs is slower) */
    __m256d r2 = _mm256_mul_pd(r, r), r4 = _mm256_mul_pd(r2, r2), r8 = _mm256_mul_pd(r4, r4);
    __m256d c0 = _mm256_add_pd(_mm256_set1_pd(1.0), r);
    __m256d c1 = _mm256_fmadd_pd(r, _mm256_set1_pd(1.0 / 6.0), _mm256_set1_pd(0.5));
    __m256d c2 = _mm256_fmadd_pd(r, _mm256_set1_pd(1.0 / 120.0), _mm256_set1_pd(1.0 / 24.0));
    __m256d c3 = _mm256_fmadd_pd(r, _mm256_set1_pd(1.0 / 5040.0), _mm256_set1_pd(1.0 / 720.0));
    __m256d c4 = _mm256_fmadd_pd(r, _mm256_set1_pd(1.0 / 362880.0), _mm256_set1_pd(1.0 / 40320.0));
    __m256d c5 = _mm256_fmadd_pd(r, _mm256_set1_pd(1.0 / 39916800.0), _mm256_set1_pd(1.0 / 3628800.0));
    __m256d c6 = _mm256_fmadd_pd(r, _mm256_set1_pd(1.0 / 6227020800.0), _mm256_set1_pd(1.0 / 479001600.0));
    __m256d d0 = _mm256_fmadd_pd(r2, c1, c0), d1 = _mm256_fmadd_pd(r2, c3, c2), d2 = _mm256_fmadd_pd(r2, c5, c4);
    __m256d e0 = _mm256_fmadd_pd(r4, d1, d0), e1 = _mm256_fmadd_pd(r4, c6, d2);
    __m256d p = _mm256_fmadd_pd(r8, e1, e0);
    __m256i kb = _mm256_castpd_si256(k); /* its low bits hold n */
    __m256d y;
    if (!_mm256_movemask_pd(_mm256_cmp_pd(xc, _mm256_set1_pd(-708.0), _CMP_LT_OQ))) {
        y = _mm256_castsi256_pd(_mm256_add_epi64(_mm256_castpd_si256(p), _mm256_slli_epi64(kb, 52)));
    } else { /* 2^(n + 64), a normal number for n in [-1077, 0], then 2^-64: one rounding */
        __m256i ni = _mm256_sub_epi64(kb, _mm256_set1_epi64x(0x4338000000000000LL));
        __m256i sb = _mm256_slli_epi64(_mm256_add_epi64(ni, _mm256_set1_epi64x(1023 + 64)), 52);
        y = _mm256_mul_pd(_mm256_mul_pd(p, _mm256_castsi256_pd(sb)), _mm256_set1_pd(0x1p-64));
    }
    return _mm256_blendv_pd(y, x, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
}

/* exp4 of float64(x8) - shift, eight floats: the low four into *e0, the high four into *e1. */
static inline __attribute__((always_inline)) void exp8(__m256 x8, __m256d vs, __m256d *e0, __m256d *e1) {
    *e0 = exp4(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x8)), vs));
    *e1 = exp4(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x8, 1)), vs));
}

/* The passes' loop: z = (x[i] - shift) (times inv_t if SCALED), e = exp4(z), e stored into w
   (if W), s += e (returned), a += e * z (into *wz, if WZ); x float32 (F32) or float64. */
static inline __attribute__((always_inline)) double pass4(const void *xv, int F32, double shift, int SCALED,
                                                          double inv_t, double *w, int W, Py_ssize_t n,
                                                          double *wz, int WZ) {
    const float *x32 = (const float *)xv;
    const double *x64 = (const double *)xv;
    __m256d vs = _mm256_set1_pd(shift), vt = _mm256_set1_pd(inv_t);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, a0 = s0, a1 = s0;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256d z0, z1;
        if (F32) {
            __m256 v = _mm256_loadu_ps(x32 + i);
            z0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), vs);
            z1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), vs);
        } else {
            z0 = _mm256_sub_pd(_mm256_loadu_pd(x64 + i), vs);
            z1 = _mm256_sub_pd(_mm256_loadu_pd(x64 + i + 4), vs);
        }
        if (SCALED) {
            z0 = _mm256_mul_pd(z0, vt);
            z1 = _mm256_mul_pd(z1, vt);
        }
        __m256d e0 = exp4(z0), e1 = exp4(z1);
        if (W) {
            _mm256_storeu_pd(w + i, e0);
            _mm256_storeu_pd(w + i + 4, e1);
        }
        s0 = _mm256_add_pd(s0, e0);
        s1 = _mm256_add_pd(s1, e1);
        if (WZ) {
            a0 = _mm256_add_pd(a0, _mm256_mul_pd(e0, z0));
            a1 = _mm256_add_pd(a1, _mm256_mul_pd(e1, z1));
        }
    }
    double ls[4], la[4], s, a;
    _mm256_storeu_pd(ls, _mm256_add_pd(s0, s1));
    _mm256_storeu_pd(la, _mm256_add_pd(a0, a1));
    s = (ls[0] + ls[1]) + (ls[2] + ls[3]);
    a = (la[0] + la[1]) + (la[2] + la[3]);
    for (; i < n; i += 4) { /* the tail, padded to four lanes */
        double tx[4] = {0.0, 0.0, 0.0, 0.0}, te[4], tz[4];
        Py_ssize_t m = n - i < 4 ? n - i : 4;
        for (Py_ssize_t j = 0; j < m; j++) tx[j] = F32 ? (double)x32[i + j] : x64[i + j];
        __m256d z = _mm256_sub_pd(_mm256_loadu_pd(tx), vs);
        if (SCALED) z = _mm256_mul_pd(z, vt);
        _mm256_storeu_pd(te, exp4(z));
        _mm256_storeu_pd(tz, z);
        for (Py_ssize_t j = 0; j < m; j++) {
            if (W) w[i + j] = te[j];
            s += te[j];
            if (WZ) a += te[j] * tz[j];
        }
    }
    if (WZ) *wz += a;
    return s;
}

/* pass4 with its flags as constants (one loop each). */
__attribute__((noinline)) static double pass4_f32(const float *x, double shift, double t, double *w, Py_ssize_t n,
                                                  double *wz) {
    int scaled = t != 1.0;
    double inv_t = 1.0 / t;
    if (w && wz)
        return scaled ? pass4(x, 1, shift, 1, inv_t, w, 1, n, wz, 1) : pass4(x, 1, shift, 0, 1.0, w, 1, n, wz, 1);
    if (wz)
        return scaled ? pass4(x, 1, shift, 1, inv_t, NULL, 0, n, wz, 1) : pass4(x, 1, shift, 0, 1.0, NULL, 0, n, wz, 1);
    if (w) return pass4(x, 1, shift, 0, 1.0, w, 1, n, NULL, 0);
    return pass4(x, 1, shift, 0, 1.0, NULL, 0, n, NULL, 0);
}

__attribute__((noinline)) static double pass4_f64(const double *x, double shift, double t, double *w, Py_ssize_t n,
                                                  double *wz) {
    int scaled = t != 1.0;
    double inv_t = 1.0 / t;
    if (w && wz)
        return scaled ? pass4(x, 0, shift, 1, inv_t, w, 1, n, wz, 1) : pass4(x, 0, shift, 0, 1.0, w, 1, n, wz, 1);
    if (wz)
        return scaled ? pass4(x, 0, shift, 1, inv_t, NULL, 0, n, wz, 1) : pass4(x, 0, shift, 0, 1.0, NULL, 0, n, wz, 1);
    if (w) return pass4(x, 0, shift, 0, 1.0, w, 1, n, NULL, 0);
    return pass4(x, 0, shift, 0, 1.0, NULL, 0, n, NULL, 0);
}
/* LUT[m]: the 32-bit lanes that move the 64-bit lanes set in the 4-bit mask m to the front. */
static int32_t compress_lut[16][8];

static void compress_lut_init(void) {
    for (int m = 0; m < 16; m++) {
        int k = 0;
        for (int j = 0; j < 4; j++)
            if (m >> j & 1) {
                compress_lut[m][2 * k] = 2 * j;
                compress_lut[m][2 * k + 1] = 2 * j + 1;
                k++;
            }
        for (; k < 4; k++) compress_lut[m][2 * k] = compress_lut[m][2 * k + 1] = 0;
    }
}

/* Four positions (from i) and their exps e, those of the mask m moved to ids + k and qs + k
   (four lanes written, the count kept returned: the caller's arrays have room). */
static inline __attribute__((always_inline)) Py_ssize_t compress4(unsigned m, Py_ssize_t i, __m256d e, int64_t *ids,
                                                                    double *qs) {
    __m256i perm = _mm256_loadu_si256((const __m256i *)compress_lut[m]);
    __m256i pos = _mm256_add_epi64(_mm256_set1_epi64x((long long)i), _mm256_set_epi64x(3, 2, 1, 0));
    _mm256_storeu_si256((__m256i *)ids, _mm256_permutevar8x32_epi32(pos, perm));
    _mm256_storeu_pd(qs, _mm256_castsi256_pd(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(e), perm)));
    return __builtin_popcount(m);
}

/* exp_sum_above's tail, x[body:n] (fewer than eight): its exps by the padded pass, stored into qf
   where it is not NULL, added to s one by one (exp_tail's order, docs/trace-format.md), and those at
   or above v picked to ids + *k and qs + *k; the new sum returned. `stored`: the exps read from qf
   (the constraint's scan computed them: the same bits), not computed. */
static double above_tail(const float *x, double shift, float v, Py_ssize_t body, Py_ssize_t n, int64_t *ids,
                         double *qs, Py_ssize_t *k, double *qf, double s, int stored) {
    double w[8];
    if (stored)
        memcpy(w, qf + body, (size_t)(n - body) * sizeof(double));
    else
        (void)pass4_f32(x + body, shift, 1.0, w, n - body, NULL); /* (its own sum: not used) */
    for (Py_ssize_t j = 0; body + j < n; j++) {
        if (qf && !stored) qf[body + j] = w[j];
        s += w[j];
        if (x[body + j] >= v) {
            ids[*k] = body + j;
            qs[(*k)++] = w[j];
        }
    }
    return s;
}

/* Eight exps of x + i: exp4 of float64(x) - shift, or read from q + i where STORED (the
   constraint's scan wrote them: the same bits, docs/performance.md "chain9"). */
static inline __attribute__((always_inline)) void above_exps(__m256 x8, __m256d vs, const double *q, Py_ssize_t i,
                                                             const int STORED, __m256d *e0, __m256d *e1) {
    if (STORED) {
        *e0 = _mm256_loadu_pd(q + i);
        *e1 = _mm256_loadu_pd(q + i + 4);
    } else {
        exp8(x8, vs, e0, e1);
    }
}

/* exp_sum_above's pass in one loop: the exps in registers, the positions at or above v and
   their exps moved out by a table of permutations (no branch per position kept); every exp
   stored into qf too where it is not NULL (exp_sum's q, the same bits), or, STORED, read from it. */
static inline __attribute__((always_inline)) double above4_body(const float *x, double shift, float v, int64_t *ids,
                                                                double *qs, Py_ssize_t n, Py_ssize_t *kout,
                                                                double *qf, const int STORED) {
    __m256d vs = _mm256_set1_pd(shift), s0 = _mm256_setzero_pd(), s1 = s0;
    __m256 vv = _mm256_set1_ps(v);
    Py_ssize_t i = 0, k = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x8 = _mm256_loadu_ps(x + i);
        __m256d e0, e1;
        above_exps(x8, vs, qf, i, STORED, &e0, &e1);
        s0 = _mm256_add_pd(s0, e0);
        s1 = _mm256_add_pd(s1, e1);
        if (qf && !STORED) {
            _mm256_storeu_pd(qf + i, e0);
            _mm256_storeu_pd(qf + i + 4, e1);
        }
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(x8, vv, _CMP_GE_OQ));
        if (m) { /* (a branch: most groups of eight on a large vocabulary hold none) */
            k += compress4(m & 15, i, e0, ids + k, qs + k);
            k += compress4(m >> 4, i + 4, e1, ids + k, qs + k);
        }
    }
    double ls[4];
    _mm256_storeu_pd(ls, _mm256_add_pd(s0, s1));
    double total = (ls[0] + ls[1]) + (ls[2] + ls[3]);
    if (i < n) total = above_tail(x, shift, v, i, n, ids, qs, &k, qf, total, STORED);
    *kout = k;
    return total;
}

__attribute__((noinline)) static double exp_sum_above4(const float *x, double shift, float v, int64_t *ids,
                                                       double *qs, Py_ssize_t n, Py_ssize_t *kout, double *qf,
                                                       int stored) {
    if (stored) return above4_body(x, shift, v, ids, qs, n, kout, qf, 1);
    return above4_body(x, shift, v, ids, qs, n, kout, qf, 0);
}
#pragma GCC pop_options
#define FMA_PASS(CALL) \
    if (kernel_fma) return CALL
#else
#define FMA_PASS(CALL)
#endif

KERNEL_CLONES
static void exp_many(const double *x, double *out, Py_ssize_t n) {
#ifdef KERNEL_AVX2
    if (kernel_fma) {
        pass4_f64(x, 0.0, 1.0, out, n, NULL);
        return;
    }
#endif
#pragma omp simd
    for (Py_ssize_t i = 0; i < n; i++) out[i] = kexp(x[i]);
}

/* q[i] = exp(double(src[i]) - shift) (stored if q is not NULL); returns their sum. */
KERNEL_CLONES
static double exp_sum_f32(const float *src, double shift, double *q, Py_ssize_t n) {
    FMA_PASS(exp_sum_parts(src, shift, q, n));
    double s = 0.0;
    if (q) {
#pragma omp simd reduction(+ : s)
        for (Py_ssize_t i = 0; i < n; i++) {
            double w = kexp((double)src[i] - shift);
            q[i] = w;
            s += w;
        }
    } else {
#pragma omp simd reduction(+ : s)
        for (Py_ssize_t i = 0; i < n; i++) s += kexp((double)src[i] - shift);
    }
    return s;
}

/* One block of the distribution: w[i] = exp(z) with z = (x[i] - shift) / t (times 1 / t,
   a vector division costs 0.13 ms on 262,144 tokens: z within 1.5 ulp of the quotient, so w
   within |z| * 3.3e-16 relative of numpy's, ~1e-14 on real logits; nothing when t is 1);
   returns the block's sum of w, adds sum(w * z) to *wz. The _sums variants store nothing:
   the same sums, with the 8 bytes a token of the weights' store not written (a caller that
   needs a few weights afterwards recomputes them, with block_f32 itself: the same bits). */
#define BLOCK_BODY(LOAD, STORE)                           \
    double s = 0.0, a = 0.0;                              \
    if (t == 1.0) {                                       \
        _Pragma("omp simd reduction(+ : s, a)")           \
        for (Py_ssize_t i = 0; i < n; i++) {              \
            double z = (LOAD) - shift;                    \
            double e = kexp(z);                           \
            STORE;                                        \
            s += e;                                       \
            a += e * z;                                   \
        }                                                 \
    } else {                                              \
        double inv_t = 1.0 / t;                           \
        _Pragma("omp simd reduction(+ : s, a)")           \
        for (Py_ssize_t i = 0; i < n; i++) {              \
            double z = ((LOAD) - shift) * inv_t;          \
            double e = kexp(z);                           \
            STORE;                                        \
            s += e;                                       \
            a += e * z;                                   \
        }                                                 \
    }                                                     \
    *wz += a;                                             \
    return s;

KERNEL_CLONES
static double block_f32(const float *x, double shift, double t, double *w, Py_ssize_t n, double *wz) {
    FMA_PASS(pass4_f32(x, shift, t, w, n, wz));
    BLOCK_BODY((double)x[i], w[i] = e)
}

KERNEL_CLONES
static double block_f32_sums(const float *x, double shift, double t, Py_ssize_t n, double *wz) {
    FMA_PASS(pass4_f32(x, shift, t, NULL, n, wz));
    BLOCK_BODY((double)x[i], (void)0)
}

KERNEL_CLONES
static double block_f64(const double *x, double shift, double t, double *w, Py_ssize_t n, double *wz) {
    FMA_PASS(pass4_f64(x, shift, t, w, n, wz));
    BLOCK_BODY(x[i], w[i] = e)
}

KERNEL_CLONES
static double block_f64_sums(const double *x, double shift, double t, Py_ssize_t n, double *wz) {
    FMA_PASS(pass4_f64(x, shift, t, NULL, n, wz));
    BLOCK_BODY(x[i], (void)0)
}

/* The sum of exp(z[i]). */
KERNEL_CLONES
static double sum_exp_f64(const double *z, Py_ssize_t n) {
    FMA_PASS(pass4_f64(z, 0.0, 1.0, NULL, n, NULL));
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (Py_ssize_t i = 0; i < n; i++) s += kexp(z[i]);
    return s;
}

/* The positions i of x with x[i] >= v, in order, into ids; returns how many (branchless:
   every position is written, the count moves on only for those kept). */
static Py_ssize_t at_least_f32(const float *x, float v, int64_t *ids, Py_ssize_t n) {
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        ids[k] = i;
        k += x[i] >= v;
    }
    return k;
}

#ifdef KERNEL_AVX2
/* The same, eight at a time: a compare and its bit mask, then one step per position kept
   (a few percent of them): 0.2 ns a token against the loop's 0.8. */
__attribute__((target("avx2,bmi"))) static Py_ssize_t at_least_avx2(const float *x, float v, int64_t *ids,
                                                                     Py_ssize_t n) {
    __m256 vv = _mm256_set1_ps(v);
    Py_ssize_t k = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vv, _CMP_GE_OQ));
        while (m) {
            ids[k++] = i + __builtin_ctz(m);
            m &= m - 1;
        }
    }
    for (; i < n; i++) {
        ids[k] = i;
        k += x[i] >= v;
    }
    return k;
}

/* The first i >= from with x[i] == v, eight at a time; -1 where none. */
__attribute__((target("avx2,bmi"))) static Py_ssize_t first_equal_avx2(const float *x, float v, Py_ssize_t from,
                                                                        Py_ssize_t n) {
    __m256 vv = _mm256_set1_ps(v);
    Py_ssize_t i = from;
    for (; i + 8 <= n; i += 8) {
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vv, _CMP_EQ_OQ));
        if (m) return i + __builtin_ctz(m);
    }
    for (; i < n; i++)
        if (x[i] == v) return i;
    return -1;
}
#endif

/* top-p's bins: idx[i] = (int)min((x[i] - lo) * scale, top), every step in float32 as
   numpy does it (truncated as numpy's cast), and hist[b] the sum of q over bin b, added in
   order as np.bincount does (the same sums, bit for bit). */
/* A logit's bin: float32 (x - lo) * scale, the top where not below it (a NaN's too), truncated. Every pass that
   bins logits (bin_index, the upper bins' keeping pass and its sample, chain17) takes these steps. */
static inline __attribute__((always_inline)) int32_t bin_of(float x, float lo, float scale, float top) {
    float v = (x - lo) * scale;
    return (int32_t)(v < top ? v : top);
}

KERNEL_CLONES
static void bin_index(const float *x, float lo, float scale, float top, int32_t *idx, Py_ssize_t n) {
#pragma omp simd
    for (Py_ssize_t i = 0; i < n; i++) idx[i] = bin_of(x[i], lo, scale, top);
}

static void bin_sums(const int32_t *idx, const double *q, double *hist, Py_ssize_t bins, Py_ssize_t n) {
    memset(hist, 0, (size_t)bins * sizeof(double));
    for (Py_ssize_t i = 0; i < n; i++) hist[idx[i]] += q[i];
}

/* How many of x are greater than v. (Its loop aligned to 64 bytes, chain15: 12 or 17.5 us on 250,000 hot
   floats from one build to another of the same code.) */
KERNEL_CLONES __attribute__((optimize("align-loops=64")))
static Py_ssize_t count_greater_f32(const float *x, float v, Py_ssize_t n) {
    Py_ssize_t c = 0;
    for (Py_ssize_t first = 0; first < n; first += 1 << 30) { /* 32-bit counts: 8 lanes a vector */
        Py_ssize_t m = n - first < (1 << 30) ? n - first : (1 << 30);
        unsigned int part = 0;
#pragma omp simd reduction(+ : part)
        for (Py_ssize_t i = 0; i < m; i++) part += x[first + i] > v;
        c += part;
    }
    return c;
}

KERNEL_CLONES
static Py_ssize_t count_greater_f64(const double *x, double v, Py_ssize_t n) {
    Py_ssize_t c = 0;
#pragma omp simd reduction(+ : c)
    for (Py_ssize_t i = 0; i < n; i++) c += x[i] > v;
    return c;
}

/* ---- the raw softmax in float32, numpy's bits (issue 23, item 3) -------------------
 *
 * sampler.sample's raw softmax was numpy's float32 passes: shifted = logits - max, e =
 * np.exp(shifted), e.sum(), np.einsum("i,i->", e, shifted). raw_sums does them in one pass,
 * nothing stored, with numpy 2.4's arithmetic operation for operation, so the same bits:
 * - the exp: numpy's AVX2+FMA simd_exp_FLOAT (umath/loops_exponent_log.dispatch.c.src):
 *   Cody-Waite with two FMAs, a 5/2 rational polynomial, the scaling by 2^k by the exponent's
 *   bits (a division where the result is subnormal); each lane alone, so any grouping works;
 * - the sum: np.add.reduce's pairwise sum (umath/loops_utils.h.src): halves down to blocks of
 *   at most 128, each summed by 8 accumulators, then ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7));
 * - the einsum: einsum_sumprod.c.src at numpy's baseline (SSE, no FMA): 4 lanes, 16 products
 *   a step added last group first, the rest 4 at a time, lanes summed by two hadds, in the
 *   iterator's buffers of 8192 added to the output one after another.
 * sampler_fused checks it against numpy at import and uses it only if every bit matches
 * (another numpy, another CPU: numpy's own passes). */
#ifdef KERNEL_AVX2
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off") /* numpy is built as ISO C11: no contraction */
#pragma GCC target("avx2,fma")
#define RAW_LEAF 128
#define RAW_CHUNK 8192

typedef struct {
    __m128 acc;     /* the einsum's 4 lanes in this buffer of 8192 */
    float pend[16]; /* products waiting for a whole group of 16 */
    int npend;
    Py_ssize_t in_chunk; /* products added to acc in this buffer */
    float out;           /* the einsum's output, the buffers' sums added in order */
    double sum64;        /* the float32 e's summed in float64 (raw_sums64: top-p's bound) */
    int want64;          /* whether to sum them (raw_sums64) */
    /* the helper thread's half (split_raw): each buffer's sum and each float64 addend recorded
       in order instead of added (the caller adds them after its own half: the same order) */
    float *rec_out;
    int nrec_out;
    double *rec64;
    Py_ssize_t nrec64;
    /* the logits copied on the way (raw_sums' `copy`: the penalties' copy, made here while the pass
       reads them): copy[i] = base[i] for every position the pass reads (NULL: none) */
    float *copy;
    const float *base;
} raw_dot;

static inline void raw_add64(raw_dot *d, double v) {
    if (d->rec64) d->rec64[d->nrec64++] = v;
    else d->sum64 += v;
}

static float split_raw_merge(raw_dot *d); /* (the helper's half added in: at the end of the file) */

static inline __m256 np_exp8(__m256 x) {
    const __m256 zeros = _mm256_setzero_ps(), inf = _mm256_set1_ps(INFINITY);
    const __m256 magic = _mm256_set1_ps(0x1.800000p+23f);
    __m256 nan_mask = _mm256_cmp_ps(x, x, _CMP_NEQ_UQ);
    x = _mm256_blendv_ps(x, zeros, nan_mask);
    __m256 xmax_mask = _mm256_cmp_ps(x, _mm256_set1_ps(88.72283935546875f), _CMP_GE_OQ);
    __m256 xmin_mask = _mm256_cmp_ps(x, _mm256_set1_ps(-103.97208404541015625f), _CMP_LE_OQ);
    x = _mm256_blendv_ps(x, zeros, _mm256_or_ps(_mm256_or_ps(nan_mask, xmin_mask), xmax_mask));
    __m256 quadrant = _mm256_mul_ps(x, _mm256_set1_ps(1.442695040888963407359924681001892137F));
    quadrant = _mm256_sub_ps(_mm256_add_ps(quadrant, magic), magic);
    x = _mm256_fmadd_ps(quadrant, _mm256_set1_ps(-6.93145752e-1f), x);
    x = _mm256_fmadd_ps(quadrant, _mm256_set1_ps(-1.42860677e-6f), x);
    x = _mm256_fmadd_ps(quadrant, zeros, x);
    __m256 num = _mm256_fmadd_ps(_mm256_set1_ps(5.082762527590693718096e-04f), x,
                                 _mm256_set1_ps(6.757896990527504603057e-03f));
    num = _mm256_fmadd_ps(num, x, _mm256_set1_ps(5.114512081637298353406e-02f));
    num = _mm256_fmadd_ps(num, x, _mm256_set1_ps(2.473615434895520810817e-01f));
    num = _mm256_fmadd_ps(num, x, _mm256_set1_ps(7.257664613233124478488e-01f));
    num = _mm256_fmadd_ps(num, x, _mm256_set1_ps(9.999999999980870924916e-01f));
    __m256 den = _mm256_fmadd_ps(_mm256_set1_ps(2.159509375685829852307e-02f), x,
                                 _mm256_set1_ps(-2.742335390411667452936e-01f));
    den = _mm256_fmadd_ps(den, x, _mm256_set1_ps(1.0f));
    __m256 poly = _mm256_div_ps(num, den);
    /* poly * 2^quadrant (numpy's fma_scalef_ps) */
    const __m256 minq = _mm256_set1_ps(-125.0f);
    __m256 denormal_mask = _mm256_cmp_ps(quadrant, minq, _CMP_LE_OQ);
    if (_mm256_movemask_ps(denormal_mask) != 0) {
        __m256 quad_diff = _mm256_sub_ps(zeros, _mm256_sub_ps(quadrant, minq));
        quad_diff = _mm256_blendv_ps(zeros, quad_diff, denormal_mask);
        __m256i two_power_diff = _mm256_sllv_epi32(_mm256_set1_epi32(1), _mm256_cvtps_epi32(quad_diff));
        quadrant = _mm256_max_ps(quadrant, minq);
        __m256i exponent = _mm256_slli_epi32(_mm256_cvtps_epi32(quadrant), 23);
        poly = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(poly), exponent));
        __m256 denorm_poly = _mm256_div_ps(poly, _mm256_cvtepi32_ps(two_power_diff));
        poly = _mm256_blendv_ps(poly, denorm_poly, denormal_mask);
    } else {
        __m256i exponent = _mm256_slli_epi32(_mm256_cvtps_epi32(quadrant), 23);
        poly = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(poly), exponent));
    }
    poly = _mm256_blendv_ps(poly, _mm256_set1_ps(__builtin_nanf("")), nan_mask);
    poly = _mm256_blendv_ps(poly, inf, xmax_mask);
    return _mm256_blendv_ps(poly, zeros, xmin_mask);
}

/* e[i] = numpy's float32 exp(x[i] - m), s[i] = x[i] - m, for n <= RAW_LEAF. */
static void raw_exp_block(const float *x, float m, float *s, float *e,
                                                              Py_ssize_t n) {
    __m256 vm = _mm256_set1_ps(m);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
        _mm256_storeu_ps(s + i, v);
        _mm256_storeu_ps(e + i, np_exp8(v));
    }
    if (i < n) {
        float tx[8] = {0}, ts[8], te[8];
        memcpy(tx, x + i, (size_t)(n - i) * sizeof(float));
        __m256 v = _mm256_sub_ps(_mm256_loadu_ps(tx), vm);
        _mm256_storeu_ps(ts, v);
        _mm256_storeu_ps(te, np_exp8(v));
        memcpy(s + i, ts, (size_t)(n - i) * sizeof(float));
        memcpy(e + i, te, (size_t)(n - i) * sizeof(float));
    }
}

/* numpy's pairwise sum of one block (n <= 128). */
static float raw_leaf_sum(const float *e, Py_ssize_t n) {
    if (n < 8) {
        float res = -0.0f;
        for (Py_ssize_t i = 0; i < n; i++) res += e[i];
        return res;
    }
    __m256 r = _mm256_loadu_ps(e);
    Py_ssize_t i = 8, m = n - n % 8;
    for (; i < m; i += 8) r = _mm256_add_ps(r, _mm256_loadu_ps(e + i));
    float a[8];
    _mm256_storeu_ps(a, r);
    float res = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (; i < n; i++) res += e[i];
    return res;
}

/* The einsum's step over 16 products p (its 4 loads, added last first; a mul then an add:
   numpy's baseline has no FMA). */
static inline __m128 raw_dot16(const float *p, __m128 acc) {
    __m128 ab3 = _mm_add_ps(_mm_loadu_ps(p + 12), acc);
    __m128 ab2 = _mm_add_ps(_mm_loadu_ps(p + 8), ab3);
    __m128 ab1 = _mm_add_ps(_mm_loadu_ps(p + 4), ab2);
    return _mm_add_ps(_mm_loadu_ps(p), ab1);
}

/* The end of one of the einsum's buffers: the products left, 4 at a time (zeros after
   them), then the lanes' sum added to the output. */
static void raw_dot_flush(raw_dot *d) {
    __m128 acc = d->acc;
    for (int j = 0; j < d->npend; j += 4) {
        float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k = 0; k < 4 && j + k < d->npend; k++) t[k] = d->pend[j + k];
        acc = _mm_add_ps(_mm_loadu_ps(t), acc);
    }
    __m128 h = _mm_hadd_ps(acc, acc);
    if (d->rec_out) d->rec_out[d->nrec_out++] = _mm_cvtss_f32(_mm_hadd_ps(h, h));
    else d->out = d->out + _mm_cvtss_f32(_mm_hadd_ps(h, h));
    d->acc = _mm_setzero_ps();
    d->npend = 0;
    d->in_chunk = 0;
}

/* Feeds n products (in order) to the einsum. */
static void raw_dot_feed(raw_dot *d, const float *p, Py_ssize_t n) {
    while (n > 0) {
        if (d->npend == 0 && n >= 16) {
            d->acc = raw_dot16(p, d->acc);
            p += 16, n -= 16;
        } else {
            d->pend[d->npend++] = *p++;
            n--;
            if (d->npend < 16) continue;
            d->acc = raw_dot16(d->pend, d->acc);
            d->npend = 0;
        }
        d->in_chunk += 16;
        if (d->in_chunk == RAW_CHUNK) raw_dot_flush(d);
    }
}

/* A leaf of a multiple of 16 where the einsum has no products waiting and its buffer does
   not end inside: the same operations in registers, nothing stored (the usual leaf of
   both models' vocabularies; 0.03 ms less on 262,144 tokens). */
static inline __attribute__((always_inline)) float raw_leaf_body(const float *x, float m, Py_ssize_t n, raw_dot *d,
                                                                 int SUM64) {
    __m256 vm = _mm256_set1_ps(m), r = _mm256_setzero_ps();
    __m128 acc = d->acc;
    __m256d a64 = _mm256_setzero_pd();
    float *cp = d->copy ? d->copy + (x - d->base) : NULL;
    for (Py_ssize_t i = 0; i < n; i += 16) {
        __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        if (cp) _mm256_storeu_ps(cp + i, x0), _mm256_storeu_ps(cp + i + 8, x1);
        __m256 s0 = _mm256_sub_ps(x0, vm), s1 = _mm256_sub_ps(x1, vm);
        __m256 e0 = np_exp8(s0), e1 = np_exp8(s1);
        r = i == 0 ? _mm256_add_ps(e0, e1) : _mm256_add_ps(_mm256_add_ps(r, e0), e1);
        if (SUM64) { /* raw_sums64: the e's widened to float64 (exact) and added */
            a64 = _mm256_add_pd(a64, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e0)),
                                                   _mm256_cvtps_pd(_mm256_extractf128_ps(e0, 1))));
            a64 = _mm256_add_pd(a64, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e1)),
                                                   _mm256_cvtps_pd(_mm256_extractf128_ps(e1, 1))));
        }
        __m256 p0 = _mm256_mul_ps(e0, s0), p1 = _mm256_mul_ps(e1, s1);
        acc = _mm_add_ps(_mm256_extractf128_ps(p1, 1), acc);
        acc = _mm_add_ps(_mm256_castps256_ps128(p1), acc);
        acc = _mm_add_ps(_mm256_extractf128_ps(p0, 1), acc);
        acc = _mm_add_ps(_mm256_castps256_ps128(p0), acc);
    }
    d->acc = acc;
    d->in_chunk += n;
    if (d->in_chunk == RAW_CHUNK) raw_dot_flush(d);
    if (SUM64) {
        double l64[4];
        _mm256_storeu_pd(l64, a64);
        raw_add64(d, (l64[0] + l64[1]) + (l64[2] + l64[3]));
    }
    float a[8];
    _mm256_storeu_ps(a, r);
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

static float raw_leaf_fast(const float *x, float m, Py_ssize_t n, raw_dot *d) {
    return d->want64 ? raw_leaf_body(x, m, n, d, 1) : raw_leaf_body(x, m, n, d, 0);
}

/* The pairwise sum of e = exp(x - m) over x[0:n], numpy's recursion; the products e * s
   fed to the einsum on the way (the leaves come in order). */
static float raw_pairwise(const float *x, float m, Py_ssize_t n, raw_dot *d) {
    if (n <= RAW_LEAF && n % 16 == 0 && d->npend == 0 && d->in_chunk + n <= RAW_CHUNK)
        return raw_leaf_fast(x, m, n, d);
    if (n <= RAW_LEAF) {
        float s[RAW_LEAF], e[RAW_LEAF], p[RAW_LEAF];
        if (d->copy) memcpy(d->copy + (x - d->base), x, (size_t)n * sizeof(float));
        raw_exp_block(x, m, s, e, n);
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(p + i, _mm256_mul_ps(_mm256_loadu_ps(e + i), _mm256_loadu_ps(s + i)));
        for (; i < n; i++) p[i] = e[i] * s[i];
        raw_dot_feed(d, p, n);
        if (d->want64)
            for (i = 0; i < n; i++) raw_add64(d, (double)e[i]);
        return raw_leaf_sum(e, n);
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    float left = raw_pairwise(x, m, n2, d);
    return left + raw_pairwise(x + n2, m, n - n2, d);
}

/* raw_pairwise over the whole row, its last buffer flushed; the top split's second half
   (numpy's n2: n / 2 less n / 2 % 8) on the helper thread where it is offered and the first half
   ends on a buffer's end (the einsum's state then starts afresh there, as the helper's does). */
static float raw_run(const float *x, float m, Py_ssize_t n, raw_dot *d) {
    if (n == 0) return 0.0f;
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    float total;
    if (n > RAW_LEAF && n2 % RAW_CHUNK == 0 && split_raw(x, m, n, n2, d->want64, d->copy)) {
        float left = raw_pairwise(x, m, n2, d), right;
        int aligned = d->npend == 0 && d->in_chunk == 0;
        if (split_take(1) || !aligned) {
            right = raw_pairwise(x + n2, m, n - n2, d);
        } else {
            right = split_raw_merge(d);
        }
        split_end();
        total = left + right;
    } else {
        total = raw_pairwise(x, m, n, d);
    }
    if (d->in_chunk || d->npend) raw_dot_flush(d);
    return total;
}
#pragma GCC pop_options
#endif

/* ---- the Python side: buffers in, numbers out ------------------------------------- */

/* A contiguous 1-D buffer of `fmt` ('f': float32, 'd': float64, 'q': int64, 'i': int32;
   0: 'f' or 'd'). */
static int get_buf(PyObject *obj, Py_buffer *view, int writable, char fmt) {
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    char got = f[0];
    if (got == 'l' && view->itemsize == 8) got = 'q';
    int ok = f[0] && !f[1] && view->ndim == 1 && (fmt ? got == fmt : (got == 'f' || got == 'd'));
    ok = ok && (((got == 'f' || got == 'i') && view->itemsize == 4) || ((got == 'd' || got == 'q') && view->itemsize == 8));
    if (!ok) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "expected a contiguous 1-D array of format '%c'", fmt ? fmt : 'f');
        return -1;
    }
    return 0;
}

static int check_len(Py_buffer *out, Py_ssize_t n) {
    if (out->shape[0] < n) {
        PyErr_SetString(PyExc_ValueError, "output array too short");
        return -1;
    }
    return 0;
}

/* Every one of the m token ids within a vocabulary of n: 0, or -1 with an IndexError set. */
static int ids_within(const int64_t *ids, Py_ssize_t m, Py_ssize_t n) {
    for (Py_ssize_t j = 0; j < m; j++)
        if (ids[j] < 0 || ids[j] >= n) {
            PyErr_SetString(PyExc_IndexError, "a token id outside the vocabulary");
            return -1;
        }
    return 0;
}

/* get_buf for n objects, in order (fmts: their formats; writable: a bit each, 1 << i for the i-th):
   0, or -1 with those already taken released. */
static int get_bufs(PyObject *const *objs, Py_buffer *views, const char *fmts, unsigned writable, int n) {
    for (int i = 0; i < n; i++) {
        if (get_buf(objs[i], &views[i], (int)(writable >> i & 1u), fmts[i]) < 0) {
            while (i-- > 0) PyBuffer_Release(&views[i]);
            return -1;
        }
    }
    return 0;
}

/* get_bufs' n views released, the last first. */
static void release_bufs(Py_buffer *views, int n) {
    while (n-- > 0) PyBuffer_Release(&views[n]);
}

PyDoc_STRVAR(exp_doc, "exp(x, out): out[i] = exp(x[i]) for float64 x <= 0 (x's length).");

static PyObject *py_exp(PyObject *self, PyObject *args) {
    PyObject *xo, *oo;
    Py_buffer x, o;
    if (!PyArg_ParseTuple(args, "OO", &xo, &oo)) return NULL;
    if (get_buf(xo, &x, 0, 'd') < 0) return NULL;
    if (get_buf(oo, &o, 1, 'd') < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    Py_ssize_t n = x.shape[0];
    if (check_len(&o, n) == 0) {
        Py_BEGIN_ALLOW_THREADS exp_many((const double *)x.buf, (double *)o.buf, n);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&o);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(exp_sum_doc,
             "exp_sum(src, shift, out) -> float: out[i] = exp(float64(src[i]) - shift) for float32 src\n"
             "(out None: not stored), and their sum.");

static PyObject *py_exp_sum(PyObject *self, PyObject *args) {
    PyObject *so, *oo;
    double shift;
    Py_buffer s, o;
    if (!PyArg_ParseTuple(args, "OdO", &so, &shift, &oo)) return NULL;
    if (get_buf(so, &s, 0, 'f') < 0) return NULL;
    int has_out = oo != Py_None;
    if (has_out && get_buf(oo, &o, 1, 'd') < 0) {
        PyBuffer_Release(&s);
        return NULL;
    }
    Py_ssize_t n = s.shape[0];
    double total = 0.0;
    if (!has_out || check_len(&o, n) == 0) {
        double *q = has_out ? (double *)o.buf : NULL;
        Py_BEGIN_ALLOW_THREADS total = exp_sum_f32((const float *)s.buf, shift, q, n);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&s);
    if (has_out) PyBuffer_Release(&o);
    if (PyErr_Occurred()) return NULL;
    return PyFloat_FromDouble(total);
}

PyDoc_STRVAR(distribution_doc,
             "distribution(x, shift, t, weights, blocks, block) -> (norm, sum_wz): for float32 or float64 x,\n"
             "z = (x - shift) / t, weights = exp(z), blocks[j] the sum of the j-th block of `block`\n"
             "weights, norm the sum of the weights, sum_wz the sum of weights * z (weights None: not stored,\n"
             "the same sums).");

/* The distribution's blocks j0..j1-1 (of `block` positions, the last one up to n): each block's sum
   into bp[j], its sum of w * z added to *wz or, with rec, into rec[j - j0] (from 0.0: the same
   number, *wz never being -0.0); the weights into w where it is not NULL. */
static void dist_blocks(const void *xv, int f32, double shift, double t, double *w, double *bp, Py_ssize_t block,
                        Py_ssize_t n, Py_ssize_t j0, Py_ssize_t j1, double *wz, double *rec) {
    for (Py_ssize_t j = j0; j < j1; j++) {
        Py_ssize_t first = j * block, m = n - first < block ? n - first : block;
        const float *x32 = (const float *)xv + first;
        const double *x64 = (const double *)xv + first;
        double a = 0.0, *acc = rec ? &a : wz, s;
        if (w)
            s = f32 ? block_f32(x32, shift, t, w + first, m, acc) : block_f64(x64, shift, t, w + first, m, acc);
        else
            s = f32 ? block_f32_sums(x32, shift, t, m, acc) : block_f64_sums(x64, shift, t, m, acc);
        bp[j] = s;
        if (rec) rec[j - j0] = a;
    }
}

/* The distribution's pass: its blocks in order, or by parts of SPLIT_PART positions with the helper
   thread (split_dist), each block's sums then added in the same order: the same bits either way. */
static void dist_pass(const void *xv, int f32, double shift, double t, double *w, double *bp, Py_ssize_t block,
                      Py_ssize_t n, double *norm, double *wz) {
    Py_ssize_t nb = (n + block - 1) / block;
#ifdef KERNEL_AVX2
    if (split_dist(xv, f32, shift, t, w, bp, block, n)) {
        Py_ssize_t per = SPLIT_PART / block;
        for (Py_ssize_t p = 0, j0 = 0; j0 < nb; p++, j0 += per) {
            Py_ssize_t j1 = j0 + per < nb ? j0 + per : nb;
            if (split_take(p)) {
                for (Py_ssize_t j = j0; j < j1; j++) {
                    dist_blocks(xv, f32, shift, t, w, bp, block, n, j, j + 1, wz, NULL);
                    *norm += bp[j];
                }
            } else {
                for (Py_ssize_t j = j0; j < j1; j++) {
                    *norm += bp[j];
                    *wz += split_dist_wz(j);
                }
            }
        }
        split_end();
        return;
    }
#endif
    for (Py_ssize_t j = 0; j < nb; j++) {
        dist_blocks(xv, f32, shift, t, w, bp, block, n, j, j + 1, wz, NULL);
        *norm += bp[j];
    }
}

static PyObject *py_distribution(PyObject *self, PyObject *args) {
    PyObject *xo, *wo, *bo;
    double shift, t;
    Py_ssize_t block;
    Py_buffer x, w, b;
    if (!PyArg_ParseTuple(args, "OddOOn", &xo, &shift, &t, &wo, &bo, &block)) return NULL;
    if (block <= 0) {
        PyErr_SetString(PyExc_ValueError, "block must be positive");
        return NULL;
    }
    if (get_buf(xo, &x, 0, 0) < 0) return NULL;
    int store = wo != Py_None;
    if (store && get_buf(wo, &w, 1, 'd') < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    if (get_buf(bo, &b, 1, 'd') < 0) {
        PyBuffer_Release(&x);
        if (store) PyBuffer_Release(&w);
        return NULL;
    }
    Py_ssize_t n = x.shape[0], nb = (n + block - 1) / block;
    double norm = 0.0, wz = 0.0;
    if ((!store || check_len(&w, n) == 0) && check_len(&b, nb) == 0) {
        int f32 = x.itemsize == 4;
        double *wp = store ? (double *)w.buf : NULL, *bp = (double *)b.buf;
        Py_BEGIN_ALLOW_THREADS dist_pass(x.buf, f32, shift, t, wp, bp, block, n, &norm, &wz);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    if (store) PyBuffer_Release(&w);
    PyBuffer_Release(&b);
    if (PyErr_Occurred()) return NULL;
    return Py_BuildValue("(dd)", norm, wz);
}

/* min-p's pass: the positions at or above v in order, their float64 values minus shift, and the largest
   value below v (min-p's cut token, sampler_cuts.cut_below's pass), in one read. v: the least float32 whose
   float64 is at least the floor, so that x >= v exactly where float64(x) >= floor (NaN: neither). */
static Py_ssize_t min_p_plain(const float *x, float v, double shift, Py_ssize_t from, Py_ssize_t n, int64_t *ids,
                              double *z, Py_ssize_t k, float *below) {
    float m = *below;
    for (Py_ssize_t i = from; i < n; i++) {
        if (x[i] >= v) {
            ids[k] = i;
            z[k] = (double)x[i] - shift;
            k++;
        } else if (x[i] < v && x[i] > m)
            m = x[i];
    }
    *below = m;
    return k;
}

#ifdef KERNEL_AVX2
/* The same, eight at a time: the compare's lanes at or above v (few: min-p keeps the head) written in
   order from its bits, the others' max by a blend (max_below_avx2's). */
__attribute__((target("avx2"))) static Py_ssize_t min_p_avx2(const float *x, float v, double shift, Py_ssize_t n,
                                                             int64_t *ids, double *z, float *below) {
    const __m256 vv = _mm256_set1_ps(v), ninf = _mm256_set1_ps(-INFINITY);
    __m256 m0 = ninf, m1 = ninf;
    Py_ssize_t i = 0, k = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        m0 = _mm256_max_ps(m0, _mm256_blendv_ps(ninf, a, _mm256_cmp_ps(a, vv, _CMP_LT_OQ)));
        m1 = _mm256_max_ps(m1, _mm256_blendv_ps(ninf, b, _mm256_cmp_ps(b, vv, _CMP_LT_OQ)));
        unsigned bits = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, vv, _CMP_GE_OQ)) |
                        (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(b, vv, _CMP_GE_OQ)) << 8;
        while (bits) {
            Py_ssize_t j = i + __builtin_ctz(bits);
            ids[k] = j;
            z[k] = (double)x[j] - shift;
            k++;
            bits &= bits - 1;
        }
    }
    float lanes_m[8], m = -INFINITY;
    _mm256_storeu_ps(lanes_m, _mm256_max_ps(m0, m1));
    for (int l = 0; l < 8; l++) m = lanes_m[l] > m ? lanes_m[l] : m;
    *below = m;
    return min_p_plain(x, v, shift, i, n, ids, z, k, below);
}
#endif

static Py_ssize_t first_equal(const float *x, float v, Py_ssize_t from, Py_ssize_t n);

PyDoc_STRVAR(min_p_doc,
             "min_p(src, floor, shift, ids, z, ties=0) -> (k, mass, at, again): the k positions i of float32 src\n"
             "with float64(src[i]) >= floor, in order, into ids[:k] (int64), z[:k] = float64(src[i]) - shift,\n"
             "mass the sum of exp(z[:k]), at the first position of the largest src[i] below the floor (-1 where\n"
             "there is none or it is -inf: cut_below's answer at the least float32 at or above it), and, where\n"
             "ties is nonzero, the next position of an equal value (-1: none; not looked for: -2).");

static PyObject *py_min_p(PyObject *self, PyObject *args) {
    PyObject *so, *io, *zo;
    double floor_, shift;
    Py_buffer s, ib, zb;
    int ties = 0;
    if (!PyArg_ParseTuple(args, "OddOO|p", &so, &floor_, &shift, &io, &zo, &ties)) return NULL;
    if (get_buf(so, &s, 0, 'f') < 0) return NULL;
    if (get_buf(io, &ib, 1, 'q') < 0) {
        PyBuffer_Release(&s);
        return NULL;
    }
    if (get_buf(zo, &zb, 1, 'd') < 0) {
        PyBuffer_Release(&s);
        PyBuffer_Release(&ib);
        return NULL;
    }
    Py_ssize_t n = s.shape[0], k = 0, at = -1, again = ties ? -1 : -2;
    double *z = (double *)zb.buf;
    if (check_len(&ib, n) == 0 && check_len(&zb, n) == 0) {
        const float *src = (const float *)s.buf;
        int64_t *ids = (int64_t *)ib.buf;
        float v = (float)floor_, below = -INFINITY;
        if ((double)v < floor_) v = nextafterf(v, INFINITY);
        Py_BEGIN_ALLOW_THREADS
#ifdef KERNEL_AVX2
        if (__builtin_cpu_supports("avx2"))
            k = min_p_avx2(src, v, shift, n, ids, z, &below);
        else
#endif
            k = min_p_plain(src, v, shift, 0, n, ids, z, 0, &below);
        if (below > -INFINITY) at = first_equal(src, below, 0, n);
        if (ties && at >= 0) again = first_equal(src, below, at + 1, n);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&s);
    PyBuffer_Release(&ib);
    if (PyErr_Occurred()) {
        PyBuffer_Release(&zb);
        return NULL;
    }
    double mass;
    Py_BEGIN_ALLOW_THREADS mass = sum_exp_f64(z, k);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&zb);
    return Py_BuildValue("(ndnn)", k, mass, at, again);
}

PyDoc_STRVAR(count_greater_doc, "count_greater(x, i) -> int: how many entries of x (float32 or float64) exceed x[i].");

/* count_greater over two halves of a long row, the second on the helper thread where it is awake
   (run_halves; chain24): integer counts, the same whoever counts them. */
typedef struct {
    const void *x;
    int f32;
    double v;
    Py_ssize_t n, mid, c[2];
} greater_halves;

static void greater_half(void *arg, int h) {
    greater_halves *t = (greater_halves *)arg;
    int s = h ? 1 : 0;
    Py_ssize_t from = s ? t->mid : 0, to = s ? t->n : t->mid;
    t->c[s] = t->f32 ? count_greater_f32((const float *)t->x + from, (float)t->v, to - from)
                     : count_greater_f64((const double *)t->x + from, t->v, to - from);
}

static PyObject *py_count_greater(PyObject *self, PyObject *args) {
    PyObject *xo;
    Py_ssize_t i;
    Py_buffer x;
    if (!PyArg_ParseTuple(args, "On", &xo, &i)) return NULL;
    if (get_buf(xo, &x, 0, 0) < 0) return NULL;
    Py_ssize_t n = x.shape[0], c = 0;
    if (i < 0 || i >= n) {
        PyBuffer_Release(&x);
        PyErr_SetString(PyExc_IndexError, "index out of range");
        return NULL;
    }
    int f32 = x.itemsize == 4;
    double v = f32 ? (double)((const float *)x.buf)[i] : ((const double *)x.buf)[i];
    greater_halves t = {x.buf, f32, v, n, n >= 65536 ? (n / 2) & ~(Py_ssize_t)63 : n, {0, 0}};
    if (t.mid < n) /* (a row long enough for two threads: Gemma's 262,144) */
        run_halves(greater_half, &t, n);
    else
        greater_half(&t, 0);
    c = t.c[0] + t.c[1];
    PyBuffer_Release(&x);
    return PyLong_FromSsize_t(c);
}

static Py_ssize_t at_least(const float *x, float v, int64_t *ids, Py_ssize_t n) {
#ifdef KERNEL_AVX2
    if (__builtin_cpu_supports("avx2")) return at_least_avx2(x, v, ids, n);
#endif
    return at_least_f32(x, v, ids, n);
}

/* top-p's pass over the vocabulary (issue 23, item 3): the sum of q = exp(double(x[i]) - shift)
   over every i, and the positions with x[i] >= v (float32, as at_least) with their q, in order,
   into ids and qs (the deep set: a few percent of the vocabulary); nothing else stored. With
   AVX2 and FMA one loop (exp_sum_above4); otherwise a block's exps into a buffer in L1
   (exp_sum's kexp, vectorised), then the block's positions at or above v picked from it. */
#define ABOVE_BLOCK 512

KERNEL_CLONES
static double exp_block_f32(const float *x, double shift, double *w, Py_ssize_t n) {
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (Py_ssize_t i = 0; i < n; i++) {
        double e = kexp((double)x[i] - shift);
        w[i] = e;
        s += e;
    }
    return s;
}

static double exp_sum_above(const float *x, double shift, float v, int64_t *ids, double *qs, Py_ssize_t n,
                            Py_ssize_t *kout, double *qf) {
#ifdef KERNEL_AVX2
    if (kernel_fma) return exp_sum_above_parts(x, shift, v, ids, qs, n, kout, qf, 0);
#endif
    double w[ABOVE_BLOCK], total = 0.0;
    Py_ssize_t k = 0;
    for (Py_ssize_t first = 0; first < n; first += ABOVE_BLOCK) {
        Py_ssize_t m = n - first < ABOVE_BLOCK ? n - first : ABOVE_BLOCK;
        total += exp_block_f32(x + first, shift, w, m);
        if (qf) memcpy(qf + first, w, (size_t)m * sizeof(double));
        for (Py_ssize_t i = 0; i < m; i++) { /* (branchless: every position written, kept or not) */
            ids[k] = first + i;
            qs[k] = w[i];
            k += x[first + i] >= v;
        }
    }
    *kout = k;
    return total;
}

PyDoc_STRVAR(exp_sum_above_doc,
             "exp_sum_above(x, shift, v, ids, q, full=None) -> (total, k): for float32 x, the sum of\n"
             "exp(float64(x[i]) - shift) over every i, and the k positions with x[i] >= float32(v), in order, into\n"
             "ids[:k] (int64) with their exps into q[:k] (float64; both x's length); `full` (float64, x's length):\n"
             "every exp stored there too (exp_sum's out, the same bits). `stored` true: `full` holds those exps\n"
             "already (constraint_scan's q: the same bits), read and not computed; only where the CPU has AVX2\n"
             "and FMA (constraint_scan wrote q), else a ValueError.");

static PyObject *py_exp_sum_above(PyObject *self, PyObject *args) {
    PyObject *xo, *io, *qo, *fo = Py_None;
    double shift, v;
    int stored = 0;
    Py_buffer x, ib, qb, fb;
    if (!PyArg_ParseTuple(args, "OddOO|Op", &xo, &shift, &v, &io, &qo, &fo, &stored)) return NULL;
#ifdef KERNEL_AVX2
    int can_store = kernel_fma;
#else
    int can_store = 0;
#endif
    if (stored && (fo == Py_None || !can_store)) {
        PyErr_SetString(PyExc_ValueError, "exp_sum_above: stored exps need `full` and a CPU with AVX2 and FMA");
        return NULL;
    }
    if (get_buf(xo, &x, 0, 'f') < 0) return NULL;
    if (get_buf(io, &ib, 1, 'q') < 0) goto fail_x;
    if (get_buf(qo, &qb, 1, 'd') < 0) goto fail_i;
    int full = fo != Py_None;
    if (full && get_buf(fo, &fb, 1, 'd') < 0) goto fail_q;
    Py_ssize_t n = x.shape[0], k = 0;
    double total = 0.0;
    if (check_len(&ib, n) == 0 && check_len(&qb, n) == 0 && (!full || check_len(&fb, n) == 0)) {
        double *qf = full ? (double *)fb.buf : NULL;
        Py_BEGIN_ALLOW_THREADS
#ifdef KERNEL_AVX2
        if (stored)
            total = exp_sum_above_parts((const float *)x.buf, shift, (float)v, (int64_t *)ib.buf, (double *)qb.buf, n,
                                        &k, qf, 1);
        else
#endif
            total = exp_sum_above((const float *)x.buf, shift, (float)v, (int64_t *)ib.buf, (double *)qb.buf, n, &k, qf);
        Py_END_ALLOW_THREADS
    }
    if (full) PyBuffer_Release(&fb);
fail_q:
    PyBuffer_Release(&qb);
fail_i:
    PyBuffer_Release(&ib);
fail_x:
    PyBuffer_Release(&x);
    if (PyErr_Occurred()) return NULL;
    return Py_BuildValue("(dn)", total, k);
}

PyDoc_STRVAR(at_least_doc,
             "at_least(x, v, ids) -> k: the k positions i of float32 x with x[i] >= float32(v), in order,\n"
             "into ids[:k] (int64, x's length).");

static PyObject *py_at_least(PyObject *self, PyObject *args) {
    PyObject *xo, *io;
    double v;
    Py_buffer x, ib;
    if (!PyArg_ParseTuple(args, "OdO", &xo, &v, &io)) return NULL;
    if (get_buf(xo, &x, 0, 'f') < 0) return NULL;
    if (get_buf(io, &ib, 1, 'q') < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    Py_ssize_t n = x.shape[0], k = 0;
    if (check_len(&ib, n) == 0) {
        Py_BEGIN_ALLOW_THREADS k = at_least((const float *)x.buf, (float)v, (int64_t *)ib.buf, n);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&ib);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(k);
}

/* The stages' cut token (sampler_cuts, issue 24's waterfall), read-only: one pass for the
   largest x[i] below v and how many x[i] equal v, then a search for the largest's first
   position that stops there (first_equal). */
static Py_ssize_t first_equal(const float *x, float v, Py_ssize_t from, Py_ssize_t n) {
    Py_ssize_t i = from < 0 ? 0 : from;
#ifdef KERNEL_AVX2
    if (__builtin_cpu_supports("avx2")) return first_equal_avx2(x, v, i, n);
#endif
    for (; i < n; i++)
        if (x[i] == v) return i;
    return -1;
}

static float max_below_plain(const float *x, float v, Py_ssize_t n, Py_ssize_t *n_eq) {
    float m = -INFINITY;
    Py_ssize_t c = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        float y = x[i] < v ? x[i] : -INFINITY;
        m = y > m ? y : m;
        c += x[i] == v;
    }
    *n_eq = c;
    return m;
}

#ifdef KERNEL_AVX2
/* The same, eight at a time in two chains (gcc's vectorisation of the loop above ran at 0.3 ns
   a token; this at ~0.08): the values below v kept by a blend, their max, the ties counted by
   subtracting the compare's all-ones lanes. */
__attribute__((target("avx2"))) static float max_below_avx2(const float *x, float v, Py_ssize_t n,
                                                            Py_ssize_t *n_eq) {
    const __m256 vv = _mm256_set1_ps(v), ninf = _mm256_set1_ps(-INFINITY);
    __m256 m0 = ninf, m1 = ninf;
    __m256i c0 = _mm256_setzero_si256(), c1 = _mm256_setzero_si256();
    Py_ssize_t i = 0, c = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        m0 = _mm256_max_ps(m0, _mm256_blendv_ps(ninf, a, _mm256_cmp_ps(a, vv, _CMP_LT_OQ)));
        m1 = _mm256_max_ps(m1, _mm256_blendv_ps(ninf, b, _mm256_cmp_ps(b, vv, _CMP_LT_OQ)));
        c0 = _mm256_sub_epi32(c0, _mm256_castps_si256(_mm256_cmp_ps(a, vv, _CMP_EQ_OQ)));
        c1 = _mm256_sub_epi32(c1, _mm256_castps_si256(_mm256_cmp_ps(b, vv, _CMP_EQ_OQ)));
        if ((i & ((1 << 26) - 1)) == 0) { /* (32-bit lane counts: flushed long before they could wrap) */
            int32_t lanes[8];
            _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi32(c0, c1));
            for (int l = 0; l < 8; l++) c += lanes[l];
            c0 = c1 = _mm256_setzero_si256();
        }
    }
    float lanes_m[8];
    int32_t lanes[8];
    _mm256_storeu_ps(lanes_m, _mm256_max_ps(m0, m1));
    _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi32(c0, c1));
    float m = -INFINITY;
    for (int l = 0; l < 8; l++) {
        m = lanes_m[l] > m ? lanes_m[l] : m;
        c += lanes[l];
    }
    Py_ssize_t tail_eq = 0;
    float t = max_below_plain(x + i, v, n - i, &tail_eq);
    *n_eq = c + tail_eq;
    return t > m ? t : m;
}
#endif

static float max_below(const float *x, float v, Py_ssize_t n, Py_ssize_t *n_eq) {
#ifdef KERNEL_AVX2
    if (__builtin_cpu_supports("avx2")) return max_below_avx2(x, v, n, n_eq);
#endif
    return max_below_plain(x, v, n, n_eq);
}

PyDoc_STRVAR(cut_below_doc,
             "cut_below(x, v) -> (i, n_eq): for float32 x, the first position of the largest x[i] < v (float32;\n"
             "-1 where there is none or it is -inf), and how many x[i] == v.");

static PyObject *py_cut_below(PyObject *self, PyObject *args) {
    PyObject *xo;
    double v;
    Py_buffer x;
    if (!PyArg_ParseTuple(args, "Od", &xo, &v)) return NULL;
    if (get_buf(xo, &x, 0, 'f') < 0) return NULL;
    const float *p = (const float *)x.buf;
    Py_ssize_t n = x.shape[0], i = -1, n_eq = 0;
    Py_BEGIN_ALLOW_THREADS float m = max_below(p, (float)v, n, &n_eq);
    if (m > -INFINITY) i = first_equal(p, m, 0, n);
    Py_END_ALLOW_THREADS PyBuffer_Release(&x);
    return Py_BuildValue("(nn)", i, n_eq);
}

/* cut_below among the tokens a mask allows (one byte a token, nonzero: allowed; the
   constraint's, sampler_constraint): the same passes, a forbidden token never counted. */
static float max_below_masked_plain(const float *x, const uint8_t *mask, float v, Py_ssize_t n, Py_ssize_t *n_eq) {
    float m = -INFINITY;
    Py_ssize_t c = 0;
#pragma omp simd reduction(max : m) reduction(+ : c)
    for (Py_ssize_t i = 0; i < n; i++) {
        float y = mask[i] && x[i] < v ? x[i] : -INFINITY;
        m = y > m ? y : m;
        c += mask[i] && x[i] == v;
    }
    *n_eq = c;
    return m;
}

#ifdef KERNEL_AVX2
/* The same, eight at a time in two chains as max_below_avx2 (the loop above, gcc's vectorisation,
   ran at 0.75 ns a token): each lane's value kept where the mask's byte is set and it is below v,
   the ties counted where the byte is set. A max and a count: the same in any order. */
__attribute__((target("avx2"))) static float max_below_masked_avx2(const float *x, const uint8_t *mask, float v,
                                                                   Py_ssize_t n, Py_ssize_t *n_eq) {
    const __m256 vv = _mm256_set1_ps(v), ninf = _mm256_set1_ps(-INFINITY);
    const __m256i zero = _mm256_setzero_si256();
    __m256 m0 = ninf, m1 = ninf;
    __m256i c0 = zero, c1 = zero;
    Py_ssize_t i = 0, c = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        __m256 fa = _mm256_castsi256_ps(
            _mm256_cmpeq_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(mask + i))), zero));
        __m256 fb = _mm256_castsi256_ps(
            _mm256_cmpeq_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(mask + i + 8))), zero));
        m0 = _mm256_max_ps(m0, _mm256_blendv_ps(ninf, a, _mm256_andnot_ps(fa, _mm256_cmp_ps(a, vv, _CMP_LT_OQ))));
        m1 = _mm256_max_ps(m1, _mm256_blendv_ps(ninf, b, _mm256_andnot_ps(fb, _mm256_cmp_ps(b, vv, _CMP_LT_OQ))));
        c0 = _mm256_sub_epi32(c0, _mm256_castps_si256(_mm256_andnot_ps(fa, _mm256_cmp_ps(a, vv, _CMP_EQ_OQ))));
        c1 = _mm256_sub_epi32(c1, _mm256_castps_si256(_mm256_andnot_ps(fb, _mm256_cmp_ps(b, vv, _CMP_EQ_OQ))));
        if ((i & ((1 << 26) - 1)) == 0) { /* (32-bit lane counts: flushed long before they could wrap) */
            int32_t lanes[8];
            _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi32(c0, c1));
            for (int l = 0; l < 8; l++) c += lanes[l];
            c0 = c1 = zero;
        }
    }
    float lanes_m[8];
    int32_t lanes[8];
    _mm256_storeu_ps(lanes_m, _mm256_max_ps(m0, m1));
    _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi32(c0, c1));
    float m = -INFINITY;
    for (int l = 0; l < 8; l++) {
        m = lanes_m[l] > m ? lanes_m[l] : m;
        c += lanes[l];
    }
    Py_ssize_t tail_eq = 0;
    float t = max_below_masked_plain(x + i, mask + i, v, n - i, &tail_eq);
    *n_eq = c + tail_eq;
    return t > m ? t : m;
}
#endif

static float max_below_masked(const float *x, const uint8_t *mask, float v, Py_ssize_t n, Py_ssize_t *n_eq) {
#ifdef KERNEL_AVX2
    if (kernel_fma) return max_below_masked_avx2(x, mask, v, n, n_eq);
#endif
    return max_below_masked_plain(x, mask, v, n, n_eq);
}

PyDoc_STRVAR(cut_below_mask_doc,
             "cut_below_mask(x, v, mask) -> (i, n_eq): cut_below among the positions where mask (bytes, one a\n"
             "position; nonzero: allowed) is set.");

static PyObject *py_cut_below_mask(PyObject *self, PyObject *args) {
    PyObject *xo, *mo;
    double v;
    Py_buffer x, mb;
    if (!PyArg_ParseTuple(args, "OdO", &xo, &v, &mo)) return NULL;
    if (get_buf(xo, &x, 0, 'f') < 0) return NULL;
    if (PyObject_GetBuffer(mo, &mb, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    Py_ssize_t n = x.shape[0], i = -1, n_eq = 0;
    if (mb.len != n) {
        PyBuffer_Release(&x);
        PyBuffer_Release(&mb);
        PyErr_SetString(PyExc_ValueError, "cut_below_mask: the mask must hold one byte a position");
        return NULL;
    }
    const float *p = (const float *)x.buf;
    const uint8_t *mask = (const uint8_t *)mb.buf;
    Py_BEGIN_ALLOW_THREADS float m = max_below_masked(p, mask, (float)v, n, &n_eq);
    if (m > -INFINITY)
        for (i = first_equal(p, m, 0, n); i >= 0 && !mask[i]; i = first_equal(p, m, i + 1, n)) {
        }
    Py_END_ALLOW_THREADS PyBuffer_Release(&x);
    PyBuffer_Release(&mb);
    return Py_BuildValue("(nn)", i, n_eq);
}

PyDoc_STRVAR(first_equal_doc, "first_equal(x, v, start) -> i: the first i >= start with x[i] == v (float32), -1 if none.");

static PyObject *py_first_equal(PyObject *self, PyObject *args) {
    PyObject *xo;
    double v;
    Py_ssize_t start, i;
    Py_buffer x;
    if (!PyArg_ParseTuple(args, "Odn", &xo, &v, &start)) return NULL;
    if (get_buf(xo, &x, 0, 'f') < 0) return NULL;
    i = first_equal((const float *)x.buf, (float)v, start, x.shape[0]);
    PyBuffer_Release(&x);
    return PyLong_FromSsize_t(i);
}

PyDoc_STRVAR(bin_masses_doc,
             "bin_masses(x, lo, scale, bins, q, idx, hist): idx[i] = int(min((x[i] - lo) * scale, bins - 1))\n"
             "in float32 (x float32, idx int32), hist (float64, bins) the sums of q (float64) by bin.");

static PyObject *py_bin_masses(PyObject *self, PyObject *args) {
    PyObject *xo, *qo, *io, *ho;
    double lo, scale;
    Py_ssize_t bins;
    Py_buffer x, q, ib, h;
    if (!PyArg_ParseTuple(args, "OddnOOO", &xo, &lo, &scale, &bins, &qo, &io, &ho)) return NULL;
    if (bins <= 0 || bins > (1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "bins out of range");
        return NULL;
    }
    if (get_buf(xo, &x, 0, 'f') < 0) return NULL;
    if (get_buf(qo, &q, 0, 'd') < 0) goto fail_x;
    if (get_buf(io, &ib, 1, 'i') < 0) goto fail_q;
    if (get_buf(ho, &h, 1, 'd') < 0) goto fail_i;
    Py_ssize_t n = x.shape[0];
    if (check_len(&q, n) == 0 && check_len(&ib, n) == 0 && check_len(&h, bins) == 0) {
        Py_BEGIN_ALLOW_THREADS bin_index((const float *)x.buf, (float)lo, (float)scale, (float)(bins - 1),
                                         (int32_t *)ib.buf, n);
        bin_sums((const int32_t *)ib.buf, (const double *)q.buf, (double *)h.buf, bins, n);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&h);
fail_i:
    PyBuffer_Release(&ib);
fail_q:
    PyBuffer_Release(&q);
fail_x:
    PyBuffer_Release(&x);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* top-p's whole cut-off by the bins (sampler_math.top_p_bins) in one call, its numpy steps
   one for one: the float32 bins of (x - lo) * scale, their masses summed in order, summed
   again from the top bin down, the bin where the target is reached, the positions above it
   (in order), and that bin's positions sorted by logit, largest first (equal ones in order),
   their masses summed in that order until the target is reached. Returns the count kept
   (into kept) and their mass, or -1 where numpy's own path must run (a non-finite logit, one
   value only, a spread too narrow for float32's scale). */
typedef struct {
    float v;
    int64_t pos;
} cut_entry;

static int cut_cmp(const void *a, const void *b) {
    const cut_entry *p = (const cut_entry *)a, *q = (const cut_entry *)b;
    if (p->v != q->v) return p->v > q->v ? -1 : 1;
    return p->pos < q->pos ? -1 : (p->pos > q->pos);
}

/* The least and the greatest of x[:n] (n > 0), as a pass from x[0] keeping x[i] where it is
   smaller (greater) finds them: each AVX2 lane starts from x[0] too and takes x[i] where
   x[i] < lane (maxps/minps: the second operand kept unless the first is greater/smaller, the
   pass's own rule), so a NaN at x[0] stays, a NaN elsewhere is passed over, in any lane. Equal
   values but 0.0 and -0.0 are the same value; those two give the same bins and span. */
#ifdef KERNEL_AVX2
__attribute__((target("avx2"))) static Py_ssize_t min_max_avx2(const float *x, Py_ssize_t n, float *lo_out,
                                                              float *mx_out) {
    __m256 vmx = _mm256_set1_ps(x[0]), vlo = vmx, wmx = vmx, wlo = vmx;
    Py_ssize_t i = 1;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), c = _mm256_loadu_ps(x + i + 8);
        vmx = _mm256_max_ps(a, vmx), vlo = _mm256_min_ps(a, vlo);
        wmx = _mm256_max_ps(c, wmx), wlo = _mm256_min_ps(c, wlo);
    }
    vmx = _mm256_max_ps(wmx, vmx), vlo = _mm256_min_ps(wlo, vlo);
    float hm[8], hl[8];
    _mm256_storeu_ps(hm, vmx);
    _mm256_storeu_ps(hl, vlo);
    float mx = hm[0], lo = hl[0];
    for (int j = 1; j < 8; j++) {
        mx = hm[j] > mx ? hm[j] : mx;
        lo = hl[j] < lo ? hl[j] : lo;
    }
    *lo_out = lo, *mx_out = mx;
    return i;
}
#endif

/* The least and the greatest of x[:n] (n > 0), as a pass from x[0] keeping x[i] where it is
   smaller (greater) finds them: each AVX2 lane starts from x[0] too and keeps x[i] by the same
   rule (maxps(x, lane): x where x > lane, else the lane, a NaN x passed over), so a NaN at x[0]
   stays and one elsewhere is passed over, in any lane. Equal values are the same value but 0.0
   and -0.0, which give the same span and bins. */
static void min_max(const float *x, Py_ssize_t n, float *lo_out, float *mx_out) {
    float mx = x[0], lo = x[0];
    Py_ssize_t i = 1;
#ifdef KERNEL_AVX2
    if (kernel_fma && n >= 64) {
        i = min_max_avx2(x, n, &lo, &mx);
    }
#endif
    for (; i < n; i++) {
        mx = x[i] > mx ? x[i] : mx;
        lo = x[i] < lo ? x[i] : lo;
    }
    *lo_out = lo, *mx_out = mx;
}

/* top_p_cut's options (chain12): `marks` (nmarks ascending positions): their places in the kept order into
   mark_at (-1: not kept). `cut` (out): the most likely position not kept, where the cut bin holds one (-1:
   the bin kept whole; -2: every position kept). */
typedef struct {
    const int64_t *marks;
    Py_ssize_t nmarks;
    int64_t *mark_at;
    Py_ssize_t cut;
} cut_opts;

/* top_p_cut's split: the positions whose bin is above b into kept[:*na], in order, and those of
   bin b into idx[:*ni], in order (each written over a slot of idx already read: the j-th of them
   sits at or after position j); each mark's place where its bin is above b, -2 where it is b (placed
   after the bin's sort), else -1. Eight bins at a time by AVX2 (the positions above b moved to the
   front of two four-lane stores by compress_lut, as exp_sum_above picks its deep set: ~8x fewer
   stores than a position at a time); the rest, or without AVX2, branchless (a flat row keeps
   most positions in no order a branch predicts; every position written, the count moves on). */
#ifdef KERNEL_AVX2
/* The marks in positions [i, i + 8) from *mi (the first at *next): their places from na (gt: the group's lanes
   above b, eq: at b); *next moved on (PY_SSIZE_T_MAX: none left). The caller's locals, kept in registers: a
   mark's count read from memory at every group waited on the stores before it (~5 cycles a group). */
static inline __attribute__((always_inline)) void split_marks(const cut_opts *o, Py_ssize_t *mi, Py_ssize_t *next,
                                                              Py_ssize_t i, unsigned gt, unsigned eq, Py_ssize_t na) {
    while (*next < i + 8) {
        int bit = (int)(*next - i);
        o->mark_at[*mi] =
            gt >> bit & 1u ? na + __builtin_popcount(gt & ((1u << bit) - 1u)) : -1 - (Py_ssize_t)(eq >> bit & 1u);
        ++*mi;
        *next = *mi < o->nmarks ? o->marks[*mi] : PY_SSIZE_T_MAX;
    }
}

__attribute__((target("avx2,popcnt"))) static Py_ssize_t split_bins_avx2(int32_t *idx, int32_t b, int64_t *kept,
                                                                       cut_opts *o, Py_ssize_t n, Py_ssize_t *mi_io,
                                                                       Py_ssize_t *na_out, Py_ssize_t *ni_out) {
    Py_ssize_t na = 0, ni = 0, i = 0, mi = 0;
    const __m256i vb = _mm256_set1_epi32(b);
    Py_ssize_t next = o && o->nmarks ? o->marks[0] : PY_SSIZE_T_MAX;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(idx + i));
        unsigned gt = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(v, vb)));
        unsigned eq = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(v, vb)));
        if (__builtin_expect(next < i + 8, 0)) split_marks(o, &mi, &next, i, gt, eq, na);
        for (int h = 0; h < 2; h++) { /* (four lanes written at kept + na: na <= i + 4h, so within n) */
            unsigned m = gt >> (4 * h) & 15u;
            __m256i perm = _mm256_loadu_si256((const __m256i *)compress_lut[m]);
            __m256i pos = _mm256_add_epi64(_mm256_set1_epi64x((long long)(i + 4 * h)), _mm256_set_epi64x(3, 2, 1, 0));
            _mm256_storeu_si256((__m256i *)(kept + na), _mm256_permutevar8x32_epi32(pos, perm));
            na += __builtin_popcount(m);
        }
        while (eq) { /* (rare: the cut bin's positions, each after the group was read) */
            idx[ni++] = (int32_t)(i + __builtin_ctz(eq));
            eq &= eq - 1;
        }
    }
    *na_out = na, *ni_out = ni, *mi_io = mi;
    return i;
}
#endif

static void split_bins(int32_t *idx, int32_t b, int64_t *kept, cut_opts *o, Py_ssize_t n, Py_ssize_t *na_out,
                       Py_ssize_t *ni_out) {
    Py_ssize_t na = 0, ni = 0, i = 0, mi = 0;
#ifdef KERNEL_AVX2
    if (kernel_fma) i = split_bins_avx2(idx, b, kept, o, n, &mi, &na, &ni);
#endif
    for (; i < n; i++) {
        int32_t v = idx[i];
        while (o && mi < o->nmarks && o->marks[mi] <= i) { /* (marks before i: none, they are positions) */
            o->mark_at[mi] = o->marks[mi] == i && v > b ? na : -1 - (o->marks[mi] == i && v == b);
            mi++;
        }
        kept[na] = i;
        idx[ni] = (int32_t)i; /* (ni <= i: a slot already read) */
        na += v > b;
        ni += v == b;
    }
    *na_out = na, *ni_out = ni;
}

/* The cut bin's kept entries in[:keep] (largest first) after the split's na; the marks in that bin placed. */
static void cut_bin_out(const cut_entry *in, Py_ssize_t keep, Py_ssize_t na, int64_t *kept, cut_opts *o) {
    for (Py_ssize_t j = 0; j < keep; j++) kept[na + j] = in[j].pos;
    if (!o) return;
    for (Py_ssize_t m = 0; m < o->nmarks; m++) {
        if (o->mark_at[m] != -2) continue;
        o->mark_at[m] = -1;
        for (Py_ssize_t j = 0; j < keep; j++)
            if (in[j].pos == o->marks[m]) o->mark_at[m] = na + j;
    }
}

/* top_p_cut's end, once the cut bin b is known: its positions idx[:ni] (in order) sorted by logit, largest
   first (equal ones by position), their masses added to mass_above until the target, the kept ones after
   the na above it; the cut position (o->cut, kept[na + keep]); the count kept (-2: no memory). */
static Py_ssize_t cut_bin_finish(const float *x, const double *q, double target, const int32_t *idx, Py_ssize_t ni,
                                 Py_ssize_t na, double mass_above, int64_t *kept, Py_ssize_t n, double *mass,
                                 cut_opts *o) {
    cut_entry *in = (cut_entry *)malloc((size_t)(ni ? ni : 1) * sizeof(cut_entry));
    if (!in) return -2;
    for (Py_ssize_t j = 0; j < ni; j++) in[j] = (cut_entry){x[idx[j]], idx[j]};
    qsort(in, (size_t)ni, sizeof(cut_entry), cut_cmp);
    double part = 0.0, cum = 0.0;
    Py_ssize_t keep = ni;
    for (Py_ssize_t j = 0; j < ni; j++) {
        part += q[in[j].pos];
        cum = mass_above + part;
        if (cum >= target) {
            keep = j + 1;
            break;
        }
    }
    cut_bin_out(in, keep, na, kept, o);
    /* (after them, the most likely position not kept where the cut bin holds one: its largest, the first
       of equal ones; every lower bin holds smaller logits. -1: the bin was kept whole) */
    Py_ssize_t cut = na + keep < n ? (keep < ni ? in[keep].pos : -1) : -2;
    if (cut != -2) kept[na + keep] = cut;
    if (o) o->cut = cut;
    free(in);
    *mass = cum;
    return na + keep;
}

/* ==== chain17: top_p_cut's bins over the upper bins alone (a flat row's top-p over every candidate) ====
 * On Gemma's flat rows under a JSON schema top-p keeps 3-14% of ~250,000 candidates, and the bins over every
 * position read them all three times (their index written, their masses added by bin, the index split). Only
 * the bins from the top down to the cut bin b decide anything: the cumulative sums from the top before it
 * (each bin's sum in position order, as np.bincount's), the positions above it and in it. So where a floor
 * bin B0 is known at or below b, the same answer comes from the positions of bins >= B0 alone: one pass over
 * the logits computes each bin index (the same float32 steps as bin_index) and keeps those >= B0 (position
 * and bin, in order); their masses are added by bin in that order (the same sums, bit for bit, for every bin
 * >= B0); the cumulative sums from the top (monotone: the masses are finite and >= 0) reach the target at the
 * same first bin as over all 2,048; the split and the cut bin's sort as before. B0 from the strided sample
 * (every 32nd logit, counted by bin; each bin's weight exp of its centre): the bin where the sample's mass
 * from the top reaches halfway from the target's share to 1, eight bins lower. Where the exact sums do not
 * reach the target by B0 (the sample misled), the bins over every position as before. */
/* The floor bin from the sample of x[::32] (0: none worth it). `share`: the target's share of the total. */
static int32_t partial_floor(const float *x, Py_ssize_t n, float lo, float scale, float top, Py_ssize_t bins,
                             double share) {
    int32_t *count = (int32_t *)calloc((size_t)bins, sizeof(int32_t));
    if (!count) return 0;
    for (Py_ssize_t i = 0; i < n; i += 32) count[bin_of(x[i], lo, scale, top)]++;
    /* bin j's weight exp(-(bins - 1 - j + 0.5) / scale) relative to the top bin's centre: by the ratio */
    double r = exp(-1.0 / (double)scale), w = 1.0, all = 0.0, acc = 0.0, want;
    for (Py_ssize_t j = bins - 1; j >= 0 && w > 0.0; j--, w *= r) all += count[j] * w;
    want = (share + (1.0 - share) * 0.5) * all;
    Py_ssize_t j = bins - 1;
    for (w = 1.0; j > 0; j--, w *= r) {
        acc += count[j] * w;
        if (acc >= want) break;
    }
    free(count);
    return (int32_t)(j > 8 ? j - 8 : 0);
}

/* The positions i in [from, n) of x whose bin (bin_of) is >= b0 into pos[c:], their bins into
   bin[c:], in order, from c; the new count (branchless: every position written, the count moves on). */
static Py_ssize_t bins_from_plain(const float *x, float lo, float scale, float top, int32_t b0, int32_t *pos,
                                  int32_t *bin, Py_ssize_t base, Py_ssize_t from, Py_ssize_t n, Py_ssize_t c) {
    for (Py_ssize_t i = from; i < n; i++) {
        int32_t bi = bin_of(x[i], lo, scale, top);
        pos[c] = (int32_t)(base + i);
        bin[c] = bi;
        c += bi >= b0;
    }
    return c;
}

#ifdef KERNEL_AVX2
/* LUT8[m]: the 32-bit lanes of the 8-bit mask m moved to the front (the rest 0). */
static int32_t compress8_lut[256][8];

static void compress8_lut_init(void) {
    for (int m = 0; m < 256; m++) {
        int k = 0;
        for (int j = 0; j < 8; j++)
            if (m >> j & 1) compress8_lut[m][k++] = j;
        for (; k < 8; k++) compress8_lut[m][k] = 0;
    }
}

/* The same eight at a time (bin_index's steps: subtract, multiply, min with top (minps: the top where not
   below it, a NaN's too), truncate), the kept lanes' positions and bins moved to the front of one eight-lane
   store each (c <= i: within the caller's n); the count, the first position not done in *i_out. */
__attribute__((target("avx2,popcnt"))) static Py_ssize_t bins_from_avx2(const float *x, float lo, float scale,
                                                                       float top, int32_t b0, int32_t *pos,
                                                                       int32_t *bin, Py_ssize_t base, Py_ssize_t n,
                                                                       Py_ssize_t *i_out) {
    const __m256 vlo = _mm256_set1_ps(lo), vsc = _mm256_set1_ps(scale), vtop = _mm256_set1_ps(top);
    const __m256i vb = _mm256_set1_epi32(b0 - 1), iota = _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0);
    Py_ssize_t c = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_min_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vlo), vsc), vtop);
        __m256i bi = _mm256_cvttps_epi32(v);
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(bi, vb)));
        __m256i perm = _mm256_loadu_si256((const __m256i *)compress8_lut[m]);
        __m256i p8 = _mm256_add_epi32(_mm256_set1_epi32((int)(base + i)), iota);
        _mm256_storeu_si256((__m256i *)(pos + c), _mm256_permutevar8x32_epi32(p8, perm));
        _mm256_storeu_si256((__m256i *)(bin + c), _mm256_permutevar8x32_epi32(bi, perm));
        c += __builtin_popcount(m);
    }
    *i_out = i;
    return c;
}
#endif

/* The keeping pass over two halves, the second on the helper thread where it is awake (run_halves): each
   half's positions and bins from its own start (pos, bin; pos + mid, bin + mid), the second's then moved
   after the first's. */
typedef struct {
    const float *x;
    float lo, scale, top;
    int32_t b0;
    int32_t *pos, *bin;
    Py_ssize_t n, mid, c[2];
} bins_halves;

static void bins_half(void *arg, int h) {
    bins_halves *t = (bins_halves *)arg;
    h = h ? 1 : 0;
    Py_ssize_t from = h ? t->mid : 0, to = h ? t->n : t->mid, c = 0, i = 0;
    int32_t *pos = t->pos + from, *bin = t->bin + from;
#ifdef KERNEL_AVX2
    if (kernel_fma) c = bins_from_avx2(t->x + from, t->lo, t->scale, t->top, t->b0, pos, bin, from, to - from, &i);
#endif
    t->c[h] = bins_from_plain(t->x + from, t->lo, t->scale, t->top, t->b0, pos, bin, from, i, to - from, c);
}

/* The split over the kept entries (pos[:c], bin[:c]): positions above b into kept[:*na_out] (int64), those at b
   into cut[:*ni_out] (int32), in order, the marks placed as split_bins places them (a mark not among them: -1).
   In place: kept's int64 slot na (na <= j) ends at byte 8j + 8, pos[j] (pos at kept's byte 4n: see the caller)
   starts at byte 4n + 4j, past it for j <= n - 2; cut[ni] (ni <= j) is bin[j]'s slot or one already read.
   One entry: its marks (at or before its position) placed, its position written. */
typedef struct {
    int32_t b;
    Py_ssize_t na, ni, mi, nm;
    int64_t next;
} split_state;

static inline __attribute__((always_inline)) void split_one(split_state *z, int32_t p, int32_t v, int64_t *kept,
                                                            int32_t *cut, cut_opts *o) {
    while (__builtin_expect(z->next <= p, 0)) {
        o->mark_at[z->mi] = z->next == p && v > z->b ? z->na : -1 - (z->next == p && v == z->b);
        z->next = ++z->mi < z->nm ? o->marks[z->mi] : INT64_MAX;
    }
    kept[z->na] = p;
    cut[z->ni] = p;
    z->na += v > z->b;
    z->ni += v == z->b;
}

#ifdef KERNEL_AVX2
/* Eight entries at a time where no mark falls among them (the positions above b widened and moved to the front
   of two four-lane stores by compress_lut, as split_bins_avx2 does; the few at b one by one; the writes end at
   byte 8j + 64 <= 4n + 4(j + 8) for j <= n - 8): the next entry's index. */
__attribute__((target("avx2,popcnt"))) static Py_ssize_t split_partial_avx2(split_state *z, const int32_t *pos,
                                                                          const int32_t *bin, Py_ssize_t c,
                                                                          int64_t *kept, int32_t *cut, cut_opts *o) {
    const __m256i vb = _mm256_set1_epi32(z->b);
    Py_ssize_t j = 0;
    for (; j + 8 <= c; j += 8) {
        __m256i p8 = _mm256_loadu_si256((const __m256i *)(pos + j)), b8 = _mm256_loadu_si256((const __m256i *)(bin + j));
        int32_t g[8], gb[8];
        if (__builtin_expect(z->next <= pos[j + 7], 0)) {
            _mm256_storeu_si256((__m256i *)g, p8);
            _mm256_storeu_si256((__m256i *)gb, b8);
            for (int l = 0; l < 8; l++) split_one(z, g[l], gb[l], kept, cut, o);
            continue;
        }
        unsigned gt = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(b8, vb)));
        unsigned eq = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(b8, vb)));
        if (__builtin_expect(eq != 0, 0)) _mm256_storeu_si256((__m256i *)g, p8);
        for (int h = 0; h < 2; h++) {
            unsigned mh = gt >> (4 * h) & 15u;
            __m256i w = _mm256_cvtepi32_epi64(h ? _mm256_extracti128_si256(p8, 1) : _mm256_castsi256_si128(p8));
            __m256i perm = _mm256_loadu_si256((const __m256i *)compress_lut[mh]);
            _mm256_storeu_si256((__m256i *)(kept + z->na), _mm256_permutevar8x32_epi32(w, perm));
            z->na += __builtin_popcount(mh);
        }
        while (eq) { /* (rare: the cut bin's positions) */
            cut[z->ni++] = g[__builtin_ctz(eq)];
            eq &= eq - 1;
        }
    }
    return j;
}
#endif

static void split_partial(const int32_t *pos, const int32_t *bin, Py_ssize_t c, int32_t b, int64_t *kept,
                          int32_t *cut, cut_opts *o, Py_ssize_t *na_out, Py_ssize_t *ni_out) {
    split_state z = {b, 0, 0, 0, o ? o->nmarks : 0, o && o->nmarks ? o->marks[0] : INT64_MAX};
    Py_ssize_t j = 0;
#ifdef KERNEL_AVX2
    if (kernel_fma) j = split_partial_avx2(&z, pos, bin, c, kept, cut, o);
#endif
    for (; j < c; j++) split_one(&z, pos[j], bin[j], kept, cut, o);
    for (; z.mi < z.nm; z.mi++) o->mark_at[z.mi] = -1;
    *na_out = z.na, *ni_out = z.ni;
}

/* top_p_cut over the bins >= a floor from the sample (above): the count kept, or -3 where it cannot decide
   (no floor worth it, the sums short of the target by the floor: the bins over every position decide), -2.
   The kept positions (int32) in the second half of kept's bytes, their bins in idx, until the split. */
static Py_ssize_t top_p_cut_upper(const float *x, const double *q, double target, double share, Py_ssize_t bins,
                                  float lo, float scale, int32_t *idx, int64_t *kept, Py_ssize_t n, double *mass,
                                  cut_opts *o) {
    float top = (float)(bins - 1);
    int32_t b0 = partial_floor(x, n, lo, scale, top, bins, share);
    if (b0 <= 0) return -3;
    int32_t *pos = (int32_t *)kept + n, *bin = idx;
    bins_halves t = {x, lo, scale, top, b0, pos, bin, n, (n / 2) & ~(Py_ssize_t)63, {0, 0}};
    run_halves(bins_half, &t, n);
    memmove(pos + t.c[0], pos + t.mid, (size_t)t.c[1] * sizeof(int32_t));
    memmove(bin + t.c[0], bin + t.mid, (size_t)t.c[1] * sizeof(int32_t));
    Py_ssize_t c = t.c[0] + t.c[1];
    double *hist = (double *)calloc((size_t)bins, sizeof(double));
    if (!hist) return -2;
    for (Py_ssize_t j = 0; j < c; j++) hist[bin[j]] += q[pos[j]];
    /* from_top[i] = hist[bins - 1] + ... + hist[bins - 1 - i], added in that order (numpy's cumsum); the
       first i where it reaches the target (numpy's searchsorted "left": the sums only grow) */
    double ft = 0.0, prev = 0.0;
    Py_ssize_t at = -1;
    for (Py_ssize_t k = 0; k <= bins - 1 - b0; k++) {
        prev = ft;
        ft = k ? ft + hist[bins - 1 - k] : hist[bins - 1];
        if (ft >= target) {
            at = k;
            break;
        }
    }
    free(hist);
    if (at < 0) return -3;
    int32_t b = (int32_t)(bins - 1 - at); /* (at < bins - 1 here: b0 > 0) */
    double mass_above = at > 0 ? prev : 0.0;
    Py_ssize_t na = 0, ni = 0;
    split_partial(pos, bin, c, b, kept, idx, o, &na, &ni);
    return cut_bin_finish(x, q, target, idx, ni, na, mass_above, kept, n, mass, o);
}

/* (whether the last top_p_cut of this thread answered by the upper bins: py_top_p_cut's, for the tests) */
static __thread int tpc_upper;

/* `share` (the target's share of the total, where the masses are finite; 0: none): where positive and x
   is long, the bins over the upper bins alone are tried first (top_p_cut_upper: the same answer). */
static Py_ssize_t top_p_cut(const float *x, const double *q, double target, Py_ssize_t bins, int32_t *idx,
                            int64_t *kept, Py_ssize_t n, double *mass, cut_opts *o, double share) {
    float mx, lo;
    min_max(x, n, &lo, &mx);
    double span = (double)mx - (double)lo;
    tpc_upper = 0;
    if (!(isfinite(mx) && isfinite(lo) && span > 0.0 && (double)bins / span < 1e30)) return -1;
    if (share > 0.0 && share < 1.0 && n >= 32 * 4096 && n < ((int64_t)1 << 31)) {
        Py_ssize_t k = top_p_cut_upper(x, q, target, share, bins, lo, (float)((double)bins / span), idx, kept, n,
                                       mass, o);
        tpc_upper = k >= 0;
        if (k != -3) return k;
    }
    double *hist = (double *)malloc((size_t)bins * sizeof(double));
    if (!hist) return -2;
    bin_index(x, lo, (float)((double)bins / span), (float)(bins - 1), idx, n);
    bin_sums(idx, q, hist, bins, n);
    /* from_top = cumsum(hist[::-1]) (in place); first = searchsorted(from_top, target, "left") */
    for (Py_ssize_t i = 0; i < bins / 2; i++) {
        double t = hist[i];
        hist[i] = hist[bins - 1 - i];
        hist[bins - 1 - i] = t;
    }
    for (Py_ssize_t i = 1; i < bins; i++) hist[i] = hist[i - 1] + hist[i];
    Py_ssize_t lo_i = 0, hi_i = bins; /* (numpy's binary search: the first i with hist[i] >= target) */
    while (lo_i < hi_i) {
        Py_ssize_t mid = lo_i + (hi_i - lo_i) / 2;
        if (hist[mid] < target) lo_i = mid + 1;
        else hi_i = mid;
    }
    Py_ssize_t b = bins - 1 - (lo_i < bins - 1 ? lo_i : bins - 1);
    double mass_above = b < bins - 1 ? hist[bins - 2 - b] : 0.0;
    free(hist);
    Py_ssize_t na = 0, ni = 0;
    split_bins(idx, (int32_t)b, kept, o, n, &na, &ni);
    return cut_bin_finish(x, q, target, idx, ni, na, mass_above, kept, n, mass, o);
}

PyDoc_STRVAR(top_p_cut_doc,
             "top_p_cut(x, q, target, bins, idx, kept) -> (k, mass): sampler_math.top_p_bins in one call for\n"
             "float32 x and float64 q (idx: int32 scratch, kept: int64, both x's length): the k positions kept\n"
             "into kept[:k] (those above the cut-off's bin in order, then that bin's, largest first) and their\n"
             "mass; kept[k] (k < len(x)): the most likely position not kept, if that bin holds one, else -1;\n"
             "k -1: numpy's path must run (a non-finite logit, one value, a spread too narrow). `share` (optional,\n"
             "0 < share < 1: target's share of q's total, every q finite): the upper bins alone first (the same\n"
             "answer: top_p_deep's path over every candidate of a long x), and a third item, whether they answered.");

static PyObject *py_top_p_cut(PyObject *self, PyObject *args) {
    PyObject *xo, *qo, *io, *ko;
    double target, mass = 0.0, share = 0.0;
    Py_ssize_t bins, k = -1;
    Py_buffer x, q, ib, kb;
    if (!PyArg_ParseTuple(args, "OOdnOO|d", &xo, &qo, &target, &bins, &io, &ko, &share)) return NULL;
    if (bins <= 1 || bins > (1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "bins out of range");
        return NULL;
    }
    if (get_buf(xo, &x, 0, 'f') < 0) return NULL;
    if (get_buf(qo, &q, 0, 'd') < 0) goto fail_x;
    if (get_buf(io, &ib, 1, 'i') < 0) goto fail_q;
    if (get_buf(ko, &kb, 1, 'q') < 0) goto fail_i;
    Py_ssize_t n = x.shape[0];
    if (n > 0 && check_len(&q, n) == 0 && check_len(&ib, n) == 0 && check_len(&kb, n) == 0) {
        Py_BEGIN_ALLOW_THREADS k = top_p_cut((const float *)x.buf, (const double *)q.buf, target, bins,
                                             (int32_t *)ib.buf, (int64_t *)kb.buf, n, &mass, NULL, share);
        Py_END_ALLOW_THREADS
        if (k == -2) PyErr_NoMemory();
    }
    PyBuffer_Release(&kb);
fail_i:
    PyBuffer_Release(&ib);
fail_q:
    PyBuffer_Release(&q);
fail_x:
    PyBuffer_Release(&x);
    if (PyErr_Occurred()) return NULL;
    if (PyTuple_GET_SIZE(args) > 6) return Py_BuildValue("(ndO)", k, mass, tpc_upper && k >= 0 ? Py_True : Py_False);
    return Py_BuildValue("(nd)", k, mass);
}

/* The k largest of x[::stride] (float32), largest first, into out: the values np.partition
   of the strided sample gives (an order statistic is one value, however found), by a min-heap
   of k over one pass of the sample (few values enter it) instead of a copy and a partition of
   the whole sample. Returns -1 where numpy's partition must decide (a NaN: numpy's order). */
static void heap_down(float *h, Py_ssize_t k, Py_ssize_t i) {
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < k && h[l] < h[m]) m = l;
        if (r < k && h[r] < h[m]) m = r;
        if (m == i) return;
        float t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static int float_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : (x < y);
}

/* keys[:c] largest first (an LSD radix sort of their complements, eight bits a pass; tmp: c more). */
static uint32_t *keys_desc(uint32_t *keys, uint32_t *tmp, Py_ssize_t c) {
    for (int shift = 0; shift < 32; shift += 8) {
        Py_ssize_t cnt[257] = {0};
        for (Py_ssize_t j = 0; j < c; j++) cnt[((~keys[j]) >> shift & 255u) + 1]++;
        for (int d = 0; d < 256; d++) cnt[d + 1] += cnt[d];
        for (Py_ssize_t j = 0; j < c; j++) tmp[cnt[(~keys[j]) >> shift & 255u]++] = keys[j];
        uint32_t *sw = keys;
        keys = tmp, tmp = sw;
    }
    return keys; /* (four passes: the sorted keys are back in `keys`' own memory) */
}

/* Scratch memory kept by the calling thread from call to call, a block a slot (0: top_p_deep's head
   masses), up to TLS_KEEP bytes; larger requests are malloc'd and freed. The head's 64 KB malloc'd and
   freed at every call were page-faulted in again at every call (glibc hands the freed top of its heap
   back): 27 -> 19 kcycles a call for the head's test on the default model's rows. (sample_top_bins' keys
   the same way measured slower on Gemma's rows, 97 -> 132-171 kcycles: a kept block is out of the caches
   after the forward pass, a fresh page is zeroed into them; left to malloc.) */
#define TLS_KEEP ((size_t)1 << 20)
static __thread void *tls_buf[1];
static __thread size_t tls_cap[1];

static void *tls_scratch(int slot, size_t bytes) {
    if (bytes > TLS_KEEP) return malloc(bytes ? bytes : 1);
    if (tls_cap[slot] < bytes || !tls_buf[slot]) {
        free(tls_buf[slot]);
        size_t cap = bytes < 65536 ? 65536 : bytes;
        tls_buf[slot] = malloc(cap);
        tls_cap[slot] = tls_buf[slot] ? cap : 0;
        if (!tls_buf[slot]) return NULL;
    }
    return tls_buf[slot];
}

static void tls_done(int slot, void *p) {
    if (p != tls_buf[slot]) free(p);
}

/* sample_top for a larger k (the deep set's 257 of ~8,000 on Gemma: numpy's partition ~37 us, the heap's
   inserts branch unpredictably): the sampled values as order-preserving 32-bit keys; a threshold from
   every eighth of them (their (k / 8 + slack)-th largest: some 450 keys reach it where k is 257); the keys
   at or above it sorted, their k largest. The k largest values, largest first: what numpy's partition and
   sort give (equal values are the same whatever their order; -0.0 and 0.0 compare equal, as every use of
   them does). -1: a NaN, or fewer than k at or above the threshold (numpy's way then). */
static int sample_top_bins(const float *x, Py_ssize_t n, Py_ssize_t stride, Py_ssize_t k, float *out) {
    Py_ssize_t s = (n + stride - 1) / stride, m = 0, ns = 0, c = 0;
    uint32_t *key = (uint32_t *)malloc((size_t)(4 * s + 2) * sizeof(uint32_t)); /* (key, sub, pick, tmp) */
    if (!key) return -2;
    uint32_t *sub = key + s, *pick = sub + s / 8 + 1, *tmp = pick + s;
    for (Py_ssize_t i = 0; i < n; i += stride) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        if ((u & 0x7fffffffu) > 0x7f800000u) {
            free(key);
            return -1;
        }
        key[m++] = u & 0x80000000u ? ~u : u | 0x80000000u;
    }
    for (Py_ssize_t j = 0; j < m; j += 8) sub[ns++] = key[j];
    Py_ssize_t r = k / 8 + 8 + 3 * (Py_ssize_t)sqrt((double)(k / 8 + 1)); /* (the threshold's rank among them) */
    if (r > ns) r = ns;
    uint32_t floor_key = keys_desc(sub, tmp, ns)[r - 1];
    for (Py_ssize_t j = 0; j < m; j++) { /* (branchless: every key written, the count moved on) */
        pick[c] = key[j];
        c += key[j] >= floor_key;
    }
    int ok = c >= k ? 0 : -1;
    if (ok == 0) {
        uint32_t *a = keys_desc(pick, tmp, c);
        for (Py_ssize_t j = 0; j < k; j++) {
            uint32_t u = a[j] & 0x80000000u ? a[j] & 0x7fffffffu : ~a[j];
            memcpy(out + j, &u, sizeof u);
        }
    }
    free(key);
    return ok;
}

static int sample_top(const float *x, Py_ssize_t n, Py_ssize_t stride, Py_ssize_t k, float *h) {
    if (k > 64 && (n + stride - 1) / stride > 4096) return sample_top_bins(x, n, stride, k, h);
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < n; i += stride) {
        float v = x[i];
        if (v != v) return -1;
        if (m < k) {
            h[m++] = v;
            if (m == k)
                for (Py_ssize_t j = k / 2; j-- > 0;) heap_down(h, k, j);
        } else if (v > h[0]) {
            h[0] = v;
            heap_down(h, k, 0);
        }
    }
    qsort(h, (size_t)m, sizeof(float), float_desc);
    return 0;
}

PyDoc_STRVAR(sample_top_doc,
             "sample_top(x, stride, out) -> ok: the len(out) largest of float32 x[::stride], largest first, into\n"
             "float32 out (fewer than len(out) sampled: all of them); False where x holds a NaN (numpy's order).\n"
             "Above 64 of more than 4,096 sampled: by a threshold from every eighth (sample_top_bins), else a heap.");

static PyObject *py_sample_top(PyObject *self, PyObject *args) {
    PyObject *xo, *oo;
    Py_ssize_t stride;
    Py_buffer x, o;
    int ok = -1;
    if (!PyArg_ParseTuple(args, "OnO", &xo, &stride, &oo)) return NULL;
    if (stride <= 0) {
        PyErr_SetString(PyExc_ValueError, "stride must be positive");
        return NULL;
    }
    if (get_buf(xo, &x, 0, 'f') < 0) return NULL;
    if (get_buf(oo, &o, 1, 'f') < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    Py_ssize_t n = x.shape[0], k = o.shape[0];
    if (k > 0) {
        Py_BEGIN_ALLOW_THREADS ok = sample_top((const float *)x.buf, n, stride, k, (float *)o.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&o);
    return PyBool_FromLong(ok == 0);
}

/* ==== chain10: top-p's search over a large vocabulary in one call (sampler_math.top_p_positions) ====
 * What top_p_positions did in Python and numpy around the kernel's passes, the same steps in the same
 * order: the deep set's threshold from the strided sample (its 257 largest: sample_top_bins), the one
 * pass for the total and the deep set (exp_sum_above), the deep set's logits gathered, the head's test
 * (numpy's pairwise sum of the head's masses), numpy's pairwise sum of the deep set's masses, and the
 * bins (top_p_cut) inside the deep set or over everything. Each float64 sum is added in the order the
 * Python steps added it (pw_sum: numpy's pairwise recursion for a contiguous float64 array). */
static double pw_rec(const double *a, Py_ssize_t n) {
    if (n < 8) {
        double res = -0.0;
        for (Py_ssize_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        Py_ssize_t i = 8;
        for (; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return pw_rec(a, n2) + pw_rec(a + n2, n - n2);
}

/* numpy's add.reduce: its identity 0.0 plus the pairwise sum (0.0 for no entries, as numpy's) */
static double pw_sum(const double *a, Py_ssize_t n) { return 0.0 + pw_rec(a, n); }

/* top_p_deep's answers (its `code`) */
#define TPD_PYTHON 0 /* numpy's steps decide from the start (no deep set, a NaN sampled, the sample's bins short) */
#define TPD_FIRST 1  /* the most likely alone: kabs[0] */
#define TPD_REST 2   /* the deep set made; the head's cut (ties) or numpy's bins are the caller's from there */
#define TPD_DEEP 3   /* the bins inside the deep set: kept[:k] positions in it, kabs[:k] in x */
#define TPD_ALL 4    /* the bins over everything: kabs[:k] */
#define TPD_HEAD 5   /* the head's cut: as TPD_DEEP's, cut -1 */
#define TPD_ON (-3)  /* (top_p_head's: no cut in the head, the bins follow) */

typedef struct {
    double total, mass;
    Py_ssize_t nd, k, cut;
    float a_head;
} tpd_out;

static int top_k_pass(const float *x, const uint8_t *mask, Py_ssize_t n, Py_ssize_t k, int64_t *ids);

/* top_p_deep's head (_top_p_deep's): the deep set's 64 largest by top_k_pass (where the 65 largest are
   distinct: else TPD_REST, numpy's order of ties is the caller's), their masses' pairwise sum for the
   test, then their running sum, largest first (the lexsort's order: the values are distinct), to the
   target: where it ends before the 64th, the kept ones as positions in the deep set (kept) and in x (kabs),
   their mass, cut -1 (the caller looks for the cut inside the deep set): TPD_HEAD; else TPD_ON (the bins). */
static int top_p_head(const int64_t *ids, const double *qd, const float *xd, Py_ssize_t nd, double target,
                      int64_t *kept, int64_t *kabs, tpd_out *o) {
    int64_t at[64];
    double qa[64], cum = 0.0;
    if (!top_k_pass(xd, NULL, nd, 64, at)) return TPD_REST;
    for (int j = 0; j < 64; j++) qa[j] = qd[at[j]];
    if (!(pw_sum(qa, 64) * (1.0 + 1e-9) >= target)) return TPD_ON;
    for (int j = 0; j < 63; j++) {
        cum += qa[j];
        if (cum >= target) {
            for (int i = 0; i <= j; i++) kept[i] = at[i], kabs[i] = ids[at[i]];
            o->k = j + 1, o->mass = cum, o->cut = -1;
            return TPD_HEAD;
        }
    }
    return TPD_ON;
}

/* chain12: top_p_deep's reported top (want > 0): where the bins ran (inside the deep set or over every
   position) and the total is finite (no NaN or +inf among the logits), the deep set's `want` largest by
   top_k_pass (its want + 1 largest distinct: they are every position's, as the deep set holds each logit at
   or above its threshold, the sample's 257th largest), placed in the kept order by the split (the kept set
   is a prefix of the order by logit: it holds them where it holds want + 1 positions): top[:n_top], the
   answer top_k_pass over the kept logits gives (its want + 1 largest the same distinct values, no NaN);
   n_top 0 where not so. */
typedef struct {
    Py_ssize_t want;
    int64_t *top;
    Py_ssize_t n_top;
} tpd_extra;

/* The deep set's `want` largest as marks (ascending positions of the split's array: the deep set's own,
   or x's where `ids`) with their ranks: the count, 0 where top_k_pass gives none. */
static Py_ssize_t top_marks(const float *xd, Py_ssize_t nd, const int64_t *ids, Py_ssize_t want, int64_t *marks,
                            int64_t *rank) {
    int64_t at[256];
    if (want <= 0 || want > 256 || !top_k_pass(xd, NULL, nd, want, at)) return 0;
    for (Py_ssize_t r = 0; r < want; r++) { /* (insertion by position: at most 256) */
        int64_t p = ids ? ids[at[r]] : at[r];
        Py_ssize_t j = r;
        for (; j > 0 && marks[j - 1] > p; j--) marks[j] = marks[j - 1], rank[j] = rank[j - 1];
        marks[j] = p, rank[j] = r;
    }
    return want;
}

/* The marks' places in the kept order, by rank, into ex->top (n_top: want, or 0 where one was not kept
   or fewer than want + 1 were). */
static void top_placed(tpd_extra *ex, const cut_opts *c, const int64_t *rank, Py_ssize_t k) {
    ex->n_top = 0;
    if (c->nmarks == 0 || k < c->nmarks + 1) return;
    for (Py_ssize_t j = 0; j < c->nmarks; j++) {
        if (c->mark_at[j] < 0) return;
        ex->top[rank[j]] = c->mark_at[j];
    }
    ex->n_top = c->nmarks;
}

/* top_p_deep's bins (inside the deep set where its masses hold the target, else over every position):
   TPD_DEEP, TPD_ALL, TPD_REST (top_p_cut refused) or -2 (no memory). */
static int top_p_bins_of(const float *x, Py_ssize_t n, const double *full, const int64_t *ids, const double *qd,
                         const float *xd, int32_t *idx, int64_t *kept, int64_t *kabs, Py_ssize_t bins,
                         double target, tpd_out *o, tpd_extra *ex) {
    Py_ssize_t nd = o->nd;
    int64_t marks[256], rank[256], mark_at[256];
    int finite = isfinite(o->total);
    cut_opts c = {marks, 0, mark_at, -2};
    double mass = 0.0;
    int deep = pw_sum(qd, nd) >= target;
    if (finite) c.nmarks = top_marks(xd, nd, deep ? NULL : ids, ex->want, marks, rank);
    if (deep) {
        Py_ssize_t k = top_p_cut(xd, qd, target, bins, idx, kept, nd, &mass, &c, 0.0);
        if (k < 0) return k == -2 ? -2 : TPD_REST;
        for (Py_ssize_t j = 0; j < k; j++) kabs[j] = ids[kept[j]];
        o->k = k, o->mass = mass;
        o->cut = k < nd ? (kept[k] >= 0 ? ids[kept[k]] : -1) : -2;
        top_placed(ex, &c, rank, k);
        return TPD_DEEP;
    }
    Py_ssize_t k = top_p_cut(x, full, target, bins, idx, kabs, n, &mass, &c, finite ? target / o->total : 0.0);
    if (k < 0) return k == -2 ? -2 : TPD_REST;
    o->k = k, o->mass = mass, o->cut = c.cut;
    top_placed(ex, &c, rank, k);
    return TPD_ALL;
}

static int top_p_deep(const float *x, Py_ssize_t n, double shift, double top_p, double *full, int stored,
                      int64_t *ids, double *qd, float *xd, int32_t *idx, int64_t *kept, int64_t *kabs, Py_ssize_t bins,
                      tpd_out *o, tpd_extra *ex, const float *smp) {
    float above[257];
    Py_ssize_t s = (n + 31) / 32;
    /* (smp: x[::32] already, the constraint's scan wrote it beside x: the same samples, read as one row) */
    if (s <= 4 * 256 || sample_top_bins(smp ? smp : x, smp ? s : n, smp ? 1 : 32, 257, above) != 0)
        return TPD_PYTHON;
    Py_ssize_t nd = 0;
#ifdef KERNEL_AVX2
    if (stored) o->total = exp_sum_above_parts(x, shift, above[256], ids, qd, n, &nd, full, 1);
    else
#endif
        o->total = exp_sum_above(x, shift, above[256], ids, qd, n, &nd, full);
    o->nd = nd, o->a_head = above[63], o->cut = -2, o->k = 0, o->mass = 0.0;
    Py_ssize_t b = 0; /* (the first largest logit: every token of it is in the deep set, in order) */
    for (Py_ssize_t j = 0; j < nd; j++) {
        xd[j] = x[ids[j]];
        b = xd[j] > xd[b] ? j : b;
    }
    /* unit: the most likely token's mass, exp(0) = 1 at the candidates' largest logit; stored exps at a
       larger shift (the constraint's pass's, at the raw max) are all scaled by it (chain24) */
    double target = top_p * o->total, unit = nd ? qd[b] : 1.0;
    if (target <= unit) {
        kabs[0] = ids[b], o->k = 1, o->mass = unit;
        return TPD_FIRST;
    }
    if (target <= 64.0 * unit) { /* (the head's test: its masses' sum, as numpy's q_deep[head].sum()) */
        double *hq = (double *)tls_scratch(0, (size_t)nd * sizeof(double));
        if (!hq) return -2;
        Py_ssize_t c = 0, c4 = 0;
        double h4 = 0.0;
        for (Py_ssize_t j = 0; j < nd; j++) { /* (branchless: every mass written, the count moved on) */
            hq[c] = qd[j];
            c += xd[j] >= above[63];
            int in4 = xd[j] >= above[3];
            h4 += in4 ? qd[j] : 0.0;
            c4 += in4;
        }
        double h = pw_sum(hq, c);
        tls_done(0, hq);
        /* (chain24: where 64 or more positions reach the sample's 4th largest (~128 do), the 64 largest are
           among them, their masses at most h4 (a plain sum: within 1e-14 of it). Short of the target by the
           margin, no running sum of the 64 reaches it: top_p_head would say TPD_ON (or, on ties, leave numpy's
           steps to find the same), and the bins follow without its search of the deep set.) */
        int short4 = c4 >= 64 && h4 * (1.0 + 1e-9) < target;
        int head = h * (1.0 + 1e-9) >= target && !short4 ? top_p_head(ids, qd, xd, nd, target, kept, kabs, o) : TPD_ON;
        if (head != TPD_ON) return head;
    }
    return top_p_bins_of(x, n, full, ids, qd, xd, idx, kept, kabs, bins, target, o, ex);
}

PyDoc_STRVAR(pairwise_sum_doc, "pairwise_sum(q) -> float: numpy's q.sum() for contiguous float64 q (top_p_deep's sums).");

static PyObject *py_pairwise_sum(PyObject *self, PyObject *args) {
    PyObject *qo;
    Py_buffer q;
    if (!PyArg_ParseTuple(args, "O", &qo)) return NULL;
    if (get_buf(qo, &q, 0, 'd') < 0) return NULL;
    double s = pw_sum((const double *)q.buf, q.shape[0]);
    PyBuffer_Release(&q);
    return PyFloat_FromDouble(s);
}

/* ==== sampler_tail's distribution and draw (the sorted form's few candidates) ====
 * sampler_tail._figures in two calls around numpy's log2: the same operations in the same order on
 * the same float64 values as its Python floats (the sums numpy's pairwise order, pw_sum), so the
 * same bits: tests/test_sampler_tail.py. */
PyDoc_STRVAR(tail_norm_doc,
             "tail_norm(w, probs, nz) -> (s, k): for float64 weights w, s = numpy's w.sum() (pairwise_sum),\n"
             "probs[i] = w[i] / s, and the positive ones of probs, in order, into nz[:k] (probs, nz: float64, at\n"
             "least w's length).");

static PyObject *py_tail_norm(PyObject *self, PyObject *args) {
    PyObject *o[3];
    Py_buffer v[3];
    if (!PyArg_ParseTuple(args, "OOO", &o[0], &o[1], &o[2])) return NULL;
    if (get_bufs(o, v, "ddd", 0x6, 3) < 0) return NULL;
    Py_ssize_t n = v[0].shape[0], k = 0;
    if (check_len(&v[1], n) < 0 || check_len(&v[2], n) < 0) {
        release_bufs(v, 3);
        return NULL;
    }
    const double *w = (const double *)v[0].buf;
    double *p = (double *)v[1].buf, *nz = (double *)v[2].buf, s = pw_sum(w, n);
    for (Py_ssize_t i = 0; i < n; i++) { /* (branchless: every q written, the count moved on) */
        double q = w[i] / s;
        p[i] = q;
        nz[k] = q;
        k += q > 0;
    }
    release_bufs(v, 3);
    return Py_BuildValue("(dn)", s, k);
}

PyDoc_STRVAR(tail_draw_doc,
             "tail_draw(probs, prod, lg, u) -> (entropy, pick, rank): from float64 probs (tail_norm's, at least\n"
             "one), prod (its k positive ones; overwritten with prod[i] * lg[i]) and lg (their log2s, numpy's,\n"
             "k long): entropy = -(numpy's pairwise sum of the products), 0.0 where k < 2; pick =\n"
             "bisect.bisect_right(the running sums of probs, added in order as itertools.accumulate, u), at most\n"
             "len(probs) - 1; rank = 1 + how many of probs[:pick] exceed probs[pick].");

static PyObject *py_tail_draw(PyObject *self, PyObject *args) {
    PyObject *o[3];
    Py_buffer v[3];
    double u;
    if (!PyArg_ParseTuple(args, "OOOd", &o[0], &o[1], &o[2], &u)) return NULL;
    if (get_bufs(o, v, "ddd", 0x2, 3) < 0) return NULL;
    Py_ssize_t n = v[0].shape[0], k = v[1].shape[0];
    if (n < 1) PyErr_SetString(PyExc_ValueError, "tail_draw: no probabilities");
    if (n < 1 || check_len(&v[2], k) < 0) {
        release_bufs(v, 3);
        return NULL;
    }
    const double *p = (const double *)v[0].buf, *lg = (const double *)v[2].buf;
    double *prod = (double *)v[1].buf, entropy = 0.0, cum = 0.0;
    for (Py_ssize_t i = 0; i < k; i++) prod[i] *= lg[i];
    if (k > 1) entropy = -pw_sum(prod, k);
    Py_ssize_t pick = 0, rank = 1;
    for (; pick < n; pick++) { /* (the running sums never fall: the first above u is bisect_right's) */
        cum = pick ? cum + p[pick] : p[0];
        if (cum > u) break;
    }
    if (pick > n - 1) pick = n - 1;
    for (Py_ssize_t i = 0; i < pick; i++) rank += p[i] > p[pick];
    release_bufs(v, 3);
    return Py_BuildValue("(dnn)", entropy, pick, rank);
}

PyDoc_STRVAR(top_p_deep_doc,
             "top_p_deep(x, shift, top_p, full, stored, ids, qd, xd, idx, kept, kabs, bins, top) -> (code, total, nd,\n"
             "k, mass, cut, a_head, n_top): sampler_math.top_p_positions' search over float32 x (more than 32,768\n"
             "entries) in one call, its steps one for one: the strided sample's 257 largest (the deep set's threshold;\n"
             "the 64th: a_head), exp_sum_above(x, shift, threshold, ids, qd, full, stored) (total; the deep set's nd\n"
             "positions and masses), their logits into xd, target = top_p * total; then code 1: target <= u, u the\n"
             "mass of the deep set's first largest logit (1 = exp(0), unless the stored exps in full are at a larger\n"
             "shift: every mass then has the factor u), its position in kabs[0], mass u; 5: the head's cut (the head's\n"
             "masses, numpy's pairwise sum, may hold the target; its 64 largest distinct; the running sum ends\n"
             "before the 64th): k positions into the deep set in kept[:k], in x in kabs[:k], their mass; 3:\n"
             "top_p_cut inside the deep set (its masses' pairwise sum holds the target), kept and kabs as 5's; 4:\n"
             "top_p_cut over x and full, kabs[:k]; 2: the deep set made, the rest is the caller's (ties among the head's 65 largest,\n"
             "or top_p_cut refused). cut (3, 4): the most likely position of x not kept where the cut bin holds\n"
             "one, -1 where it was kept whole (and 5's), -2 where every position was kept. n_top (3, 4): top[:n_top]\n"
             "= top_k's answer for the kept logits (x[kabs[:k]]) and len(top), or 0. 0: nothing done (no deep set,\n"
             "a NaN sampled, the sample's threshold short). ids, kept, kabs, top: int64; qd, full: float64; xd:\n"
             "float32; idx: int32; all x's length but top (at most 256). `sample` (optional, float32): x[::32],\n"
             "as the constraint's scan wrote it (constraint_scan's `sample`), read instead of x's strided values.");

static PyObject *py_top_p_deep(PyObject *self, PyObject *args) {
    PyObject *o[9], *so = Py_None;
    double shift, top_p;
    int stored = 0;
    Py_ssize_t bins;
    if (!PyArg_ParseTuple(args, "OddOpOOOOOOnO|O", &o[0], &shift, &top_p, &o[1], &stored, &o[2], &o[3], &o[4], &o[5],
                          &o[6], &o[7], &bins, &o[8], &so))
        return NULL;
#ifdef KERNEL_AVX2
    int can_store = kernel_fma;
#else
    int can_store = 0;
#endif
    if ((stored && !can_store) || bins <= 1 || bins > (1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "top_p_deep: stored exps need a CPU with AVX2 and FMA; bins out of range");
        return NULL;
    }
    Py_buffer v[9], sb;
    if (get_bufs(o, v, "fdqdfiqqq", 0x1fe, 9) < 0) return NULL;
    int has_s = so != Py_None;
    if (has_s && get_buf(so, &sb, 0, 'f') < 0) {
        release_bufs(v, 9);
        return NULL;
    }
    Py_ssize_t n = v[0].shape[0];
    int code = 0;
    tpd_out r = {0.0, 0.0, 0, 0, -2, 0.0f};
    tpd_extra ex = {v[8].shape[0] <= 256 ? v[8].shape[0] : 0, (int64_t *)v[8].buf, 0};
    int ok = 1;
    for (int i = 1; i < 8; i++) ok = ok && check_len(&v[i], n) == 0;
    if (ok && has_s && sb.shape[0] != (n + 31) / 32) {
        PyErr_SetString(PyExc_ValueError, "top_p_deep: the sample must be x[::32]'s length");
        ok = 0;
    }
    if (ok) {
        const float *smp = has_s ? (const float *)sb.buf : NULL;
        Py_BEGIN_ALLOW_THREADS code = top_p_deep((const float *)v[0].buf, n, shift, top_p, (double *)v[1].buf, stored,
                                                 (int64_t *)v[2].buf, (double *)v[3].buf, (float *)v[4].buf,
                                                 (int32_t *)v[5].buf, (int64_t *)v[6].buf, (int64_t *)v[7].buf, bins, &r,
                                                 &ex, smp);
        Py_END_ALLOW_THREADS
        if (code == -2) PyErr_NoMemory();
    }
    if (has_s) PyBuffer_Release(&sb);
    release_bufs(v, 9);
    if (PyErr_Occurred()) return NULL;
    return Py_BuildValue("(idnndndn)", code, r.total, r.nd, r.k, r.mass, r.cut, (double)r.a_head, ex.n_top);
}

#define TOP_K_MAX 256

/* ==== gram5: the k largest of a row in one pass (sampler_math.top_indices, top-k by a mask) ====
 * A min-heap of the m = k + 1 largest (value, position) pairs seen, over one pass of x: eight
 * values at a time are compared with the heap's least, and only those above it (few, once the
 * heap holds large values) enter it. Then the m pairs largest first. numpy's way (a sampled
 * threshold, argpartition, a stable argsort) orders equal values as its partition leaves them, so
 * the answer is taken only where no two of the m values are equal: the k largest are then one
 * set in one order, whoever finds them (the (k + 1)-th may tie a value outside: it is not
 * returned). Else (or a NaN anywhere in x, or fewer than m positions) numpy's way decides. */
static void pair_down(float *hv, int64_t *hi, Py_ssize_t m, Py_ssize_t i) {
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, s = i;
        if (l < m && hv[l] < hv[s]) s = l;
        if (r < m && hv[r] < hv[s]) s = r;
        if (s == i) return;
        float tv = hv[i];
        int64_t ti = hi[i];
        hv[i] = hv[s], hi[i] = hi[s];
        hv[s] = tv, hi[s] = ti;
        i = s;
    }
}

static inline void pair_offer(float *hv, int64_t *hi, Py_ssize_t m, float v, Py_ssize_t i) {
    if (v > hv[0]) {
        hv[0] = v, hi[0] = i;
        pair_down(hv, hi, m, 0);
    }
}

/* The rest of the pass from position i (the heap full): 0, or -1 at a NaN. */
static int top_k_rest_plain(const float *x, const uint8_t *mask, Py_ssize_t i, Py_ssize_t n, Py_ssize_t m,
                            float *hv, int64_t *hi) {
    for (; i < n; i++) {
        float v = x[i];
        if (v != v) return -1;
        if (!mask || mask[i]) pair_offer(hv, hi, m, v, i);
    }
    return 0;
}

#ifdef KERNEL_AVX2
/* (its loop aligned to 64 bytes, chain15: where it fell gave this pass 29 to 46 us on 262,144 hot logits
   from one build to another of the same code) */
__attribute__((target("avx2"), optimize("align-loops=64"))) static int
top_k_rest_avx2(const float *x, const uint8_t *mask, Py_ssize_t i, Py_ssize_t n, Py_ssize_t m, float *hv, int64_t *hi) {
    __m256 nan = _mm256_setzero_ps();
    const __m128i zero = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
        __m256 x8 = _mm256_loadu_ps(x + i);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(x8, x8, _CMP_UNORD_Q));
        unsigned gt = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(x8, _mm256_set1_ps(hv[0]), _CMP_GT_OQ));
        if (gt && mask) /* (the mask's eight bytes: nonzero ones allowed) */
            gt &= ~(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_loadl_epi64((const __m128i *)(mask + i)), zero));
        while (gt) {
            int j = __builtin_ctz(gt);
            gt &= gt - 1;
            pair_offer(hv, hi, m, x[i + j], i + j);
        }
    }
    if (_mm256_movemask_ps(nan)) return -1;
    return top_k_rest_plain(x, mask, i, n, m, hv, hi);
}
#endif

/* The heap of the m largest of x[from:to] (among mask's): 1; 0 at a NaN or fewer than m positions. */
static inline __attribute__((always_inline)) int top_k_heap(const float *x, const uint8_t *mask, Py_ssize_t from,
                                                           Py_ssize_t to, Py_ssize_t m, float *hv,
                      int64_t *hi) {
    Py_ssize_t c = 0, i = from;
    for (; i < to && c < m; i++) { /* the first m positions fill the heap */
        if (x[i] != x[i]) return 0;
        if (!mask || mask[i]) hv[c] = x[i], hi[c++] = i;
    }
    if (c < m) return 0;
    for (Py_ssize_t j = m / 2; j-- > 0;) pair_down(hv, hi, m, j);
    int bad;
#ifdef KERNEL_AVX2
    if (kernel_fma)
        bad = top_k_rest_avx2(x, mask, i, to, m, hv, hi);
    else
#endif
        bad = top_k_rest_plain(x, mask, i, to, m, hv, hi);
    return !bad;
}

/* top_k_pass's halves (chain15, run_halves): each half's heap of the m largest; the second's offered to
   the first's after. The m largest of the two heaps are the row's m largest values (as values: which of
   equal ones is kept may differ, and equal ones among them give no answer either way), so the answer
   and where there is none are the one pass's. */
typedef struct {
    const float *x;
    Py_ssize_t n, mid, m;
    float hv[2][TOP_K_MAX + 1];
    int64_t hi[2][TOP_K_MAX + 1];
    int ok[2];
} topk_halves;

static void topk_half(void *arg, int h) {
    topk_halves *t = (topk_halves *)arg;
    if (h == 2) { /* (the caller's: the first half's heap goes on, the one pass's very steps) */
        int bad = 1;
        if (t->ok[0]) {
#ifdef KERNEL_AVX2
            if (kernel_fma)
                bad = top_k_rest_avx2(t->x, NULL, t->mid, t->n, t->m, t->hv[0], t->hi[0]);
            else
#endif
                bad = top_k_rest_plain(t->x, NULL, t->mid, t->n, t->m, t->hv[0], t->hi[0]);
        }
        t->ok[0] = !bad, t->ok[1] = 2;
        return;
    }
    t->ok[h] = top_k_heap(t->x, NULL, h ? t->mid : 0, h ? t->n : t->mid, t->m, t->hv[h], t->hi[h]);
}

/* ---- the m largest of a long row by its blocks' maxima (session 22) ----
 * The m-th largest of the row's blocks' maxima (blocks of TK_BLOCK positions, the last shorter) is a
 * floor t of its m largest values: m blocks hold a value >= t each. So the m largest are among the
 * positions of value >= t, all in blocks whose maximum is >= t: one pass of maxima (eight lanes, no
 * branch), then the heap of top_k_heap over those few blocks' positions >= t, in position order. The
 * heap ends holding the m largest values: where they are distinct (the only case the pass answers),
 * the same positions in the same order as the one pass over every position. Warm rows, one call: the 41
 * largest of the default model's 49,152 logits 58 -> 13 us, the 11 largest 25 -> 8 us; of Gemma's 262,144,
 * 41 -> 33 us (the one pass was split with the helper there) (docs/performance.md, "The raw top by its
 * blocks"). From 16,384 positions, without a mask (a mask's top-k: the one pass). */
#define TK_BLOCK 64
#define TK_MAX_BLOCKS 8192

#ifdef KERNEL_AVX2
/* block_maxima's whole blocks, eight lanes at a time: the count of blocks done (their maxima in bm); -1
   at a NaN. */
__attribute__((target("avx2"))) static Py_ssize_t block_maxima_avx2(const float *x, Py_ssize_t n, float *bm) {
    Py_ssize_t b = 0, i = 0;
    __m256 nan = _mm256_setzero_ps();
    for (; i + TK_BLOCK <= n; i += TK_BLOCK, b++) {
        __m256 v[8];
        for (int j = 0; j < 8; j++) {
            v[j] = _mm256_loadu_ps(x + i + 8 * j);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[j], v[j], _CMP_UNORD_Q));
        }
        __m256 a = _mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3]));
        __m256 c = _mm256_max_ps(_mm256_max_ps(v[4], v[5]), _mm256_max_ps(v[6], v[7]));
        a = _mm256_max_ps(a, c);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        bm[b] = _mm_cvtss_f32(h);
    }
    return _mm256_movemask_ps(nan) ? -1 : b;
}
#endif

/* The blocks' maxima of x[:n] into bm (nb = ceil(n / TK_BLOCK) of them): 1; 0 at a NaN. */
static int block_maxima(const float *x, Py_ssize_t n, float *bm) {
    Py_ssize_t b = 0, i = 0;
#ifdef KERNEL_AVX2
    if (kernel_fma) {
        b = block_maxima_avx2(x, n, bm);
        if (b < 0) return 0;
        i = b * TK_BLOCK;
    }
#endif
    for (; i < n; b++) { /* (the tail, or every block without AVX2) */
        Py_ssize_t end = i + TK_BLOCK < n ? i + TK_BLOCK : n;
        float mx = -INFINITY;
        for (; i < end; i++) {
            if (x[i] != x[i]) return 0;
            mx = x[i] > mx ? x[i] : mx;
        }
        bm[b] = mx;
    }
    return 1;
}

/* block_maxima over two halves, the second on the helper thread where it is awake (run_halves; chain24):
   each half a whole number of blocks from its start, the same maxima in the same places. */
typedef struct {
    const float *x;
    float *bm;
    Py_ssize_t n, mid;
    int ok[2];
} maxima_halves;

static void maxima_half(void *arg, int h) {
    maxima_halves *t = (maxima_halves *)arg;
    Py_ssize_t from = h ? t->mid : 0, to = h ? t->n : t->mid;
    t->ok[h ? 1 : 0] = block_maxima(t->x + from, to - from, t->bm + from / TK_BLOCK);
}

/* The heap (hv, hi: top_k_heap's) of the m largest of x[:n] by its blocks: 1; 0 at a NaN; -1 where the
   blocks do not decide (too few of them, or a floor of -inf): the one pass then. */
static int top_k_blocks(const float *x, Py_ssize_t n, Py_ssize_t m, float *hv, int64_t *hi) {
    Py_ssize_t nb = (n + TK_BLOCK - 1) / TK_BLOCK;
    float bm[TK_MAX_BLOCKS], fl[TOP_K_MAX + 1];
    if (m < 1 || nb > TK_MAX_BLOCKS || nb < 4 * m) return -1;
    if (n >= 65536) { /* (a row long enough for two threads: Gemma's 262,144) */
        maxima_halves t = {x, bm, n, (nb / 2) * TK_BLOCK, {0, 0}};
        run_halves(maxima_half, &t, n);
        if (!t.ok[0] || !t.ok[1]) return 0;
    } else if (!block_maxima(x, n, bm))
        return 0;
    for (Py_ssize_t b = 0; b < m; b++) fl[b] = bm[b]; /* the floor: the m-th largest maximum (a min-heap) */
    for (Py_ssize_t j = m / 2; j-- > 0;) heap_down(fl, m, j);
    for (Py_ssize_t b = m; b < nb; b++)
        if (bm[b] > fl[0]) fl[0] = bm[b], heap_down(fl, m, 0);
    float t = fl[0];
    if (!(t > -INFINITY)) return -1;
    for (Py_ssize_t j = 0; j < m; j++) hv[j] = -INFINITY, hi[j] = -1;
    for (Py_ssize_t b = 0; b < nb; b++) {
        if (bm[b] < t) continue;
        Py_ssize_t end = (b + 1) * TK_BLOCK < n ? (b + 1) * TK_BLOCK : n;
        for (Py_ssize_t i = b * TK_BLOCK; i < end; i++)
            if (x[i] >= t) pair_offer(hv, hi, m, x[i], i);
    }
    return 1;
}

/* The k largest positions of x (among mask's, if not NULL), largest first, into ids: 1; 0 where
   numpy's way must decide (two of the k + 1 largest equal, a NaN, fewer than k + 1 positions). */
static int top_k_pass(const float *x, const uint8_t *mask, Py_ssize_t n, Py_ssize_t k, int64_t *ids) {
    Py_ssize_t m = k + 1;
    float *hv, sv[TOP_K_MAX + 1];
    int64_t *hi, si[TOP_K_MAX + 1];
    topk_halves t;
    int by_blocks = !mask && n >= 16384 ? top_k_blocks(x, n, m, t.hv[0], t.hi[0]) : -1;
    if (by_blocks == 0) return 0;
    if (by_blocks == 1) {
        hv = t.hv[0], hi = t.hi[0];
    } else if (!mask && n >= 65536) { /* (a row long enough for two threads: both halves hold m) */
        t.x = x, t.n = n, t.mid = (n / 2) & ~(Py_ssize_t)63, t.m = m;
        run_halves(topk_half, &t, n);
        if (!t.ok[0] || !t.ok[1]) return 0;
        hv = t.hv[0], hi = t.hi[0];
        if (t.ok[1] == 1) /* (the helper's half: its heap offered to the first's) */
            for (Py_ssize_t j = 0; j < m; j++) pair_offer(hv, hi, m, t.hv[1][j], t.hi[1][j]);
    } else {
        hv = t.hv[0], hi = t.hi[0];
        if (!top_k_heap(x, mask, 0, n, m, hv, hi)) return 0;
    }
    for (Py_ssize_t j = m; j-- > 0;) { /* the least first, into the last place */
        sv[j] = hv[0], si[j] = hi[0];
        hv[0] = hv[j], hi[0] = hi[j];
        pair_down(hv, hi, j, 0);
    }
    for (Py_ssize_t j = 0; j + 1 < m; j++)
        if (!(sv[j] > sv[j + 1])) return 0;
    memcpy(ids, si, (size_t)k * sizeof(int64_t));
    return 1;
}

PyDoc_STRVAR(top_k_doc,
             "top_k(x, mask, out) -> ok: the positions of the len(out) largest of float32 x (among those where\n"
             "mask, bytes one a position, is nonzero; None: all), largest first, into int64 out; False (out\n"
             "unspecified) where two of the len(out) + 1 largest are equal, x holds a NaN, fewer than len(out) + 1\n"
             "positions are allowed, or len(out) is 0 or above TOP_K_MAX (256).");

static PyObject *py_top_k(PyObject *self, PyObject *args) {
    PyObject *xo, *mo, *oo;
    Py_buffer x, mb, o;
    int ok = 0, has_mask;
    if (!PyArg_ParseTuple(args, "OOO", &xo, &mo, &oo)) return NULL;
    if (get_buf(xo, &x, 0, 'f') < 0) return NULL;
    has_mask = mo != Py_None;
    if (has_mask && PyObject_GetBuffer(mo, &mb, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    if (get_buf(oo, &o, 1, 'q') < 0) {
        PyBuffer_Release(&x);
        if (has_mask) PyBuffer_Release(&mb);
        return NULL;
    }
    Py_ssize_t n = x.shape[0], k = o.shape[0];
    if (has_mask && mb.len != n) {
        PyErr_SetString(PyExc_ValueError, "top_k: the mask must hold one byte a position");
    } else if (k > 0 && k <= TOP_K_MAX) {
        const uint8_t *mp = has_mask ? (const uint8_t *)mb.buf : NULL;
        Py_BEGIN_ALLOW_THREADS ok = top_k_pass((const float *)x.buf, mp, n, k, (int64_t *)o.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&o);
    if (has_mask) PyBuffer_Release(&mb);
    if (PyErr_Occurred()) return NULL;
    return PyBool_FromLong(ok);
}

PyDoc_STRVAR(bin_split_doc,
             "bin_split(idx, b, above, inside) -> (n_above, n_inside): the positions of int32 idx above b\n"
             "and at b, each in order, into above and inside (int64, idx's length).");

static PyObject *py_bin_split(PyObject *self, PyObject *args) {
    PyObject *io, *ao, *no;
    Py_ssize_t b;
    Py_buffer ib, a, in;
    if (!PyArg_ParseTuple(args, "OnOO", &io, &b, &ao, &no)) return NULL;
    if (get_buf(io, &ib, 0, 'i') < 0) return NULL;
    if (get_buf(ao, &a, 1, 'q') < 0) goto fail_i;
    if (get_buf(no, &in, 1, 'q') < 0) goto fail_a;
    Py_ssize_t n = ib.shape[0], na = 0, ni = 0;
    if (check_len(&a, n) == 0 && check_len(&in, n) == 0) {
        const int32_t *idx = (const int32_t *)ib.buf;
        int64_t *above = (int64_t *)a.buf, *inside = (int64_t *)in.buf;
        Py_BEGIN_ALLOW_THREADS for (Py_ssize_t i = 0; i < n; i++) {
            if (idx[i] > b)
                above[na++] = i;
            else if (idx[i] == b)
                inside[ni++] = i;
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&in);
fail_a:
    PyBuffer_Release(&a);
fail_i:
    PyBuffer_Release(&ib);
    if (PyErr_Occurred()) return NULL;
    return Py_BuildValue("(nn)", na, ni);
}

static int raw_supported(void) {
#ifdef KERNEL_AVX2
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

PyDoc_STRVAR(raw_sums_doc,
             "raw_sums(logits, m[, copy]) -> (total, dot): for float32 logits and s = logits - float32(m), e = exp(s),\n"
             "float(e.sum()) and float(np.einsum('i,i->', e, s)) as numpy 2.4 computes them in float32\n"
             "(nothing stored; `copy`, a float32 array of the logits' length: the logits copied into it on the\n"
             "way). RuntimeError where the CPU has no AVX2 and FMA.");

/* raw_sums' and raw_sums64's one pass: parses (logits, m), runs raw_run over the logits (the e's
 * also summed in float64 where want64); 0, or -1 with the error set ("NAME needs AVX2 and FMA"). */
static int raw_pass(PyObject *args, const char *missing, int want64, float *total, float *dot, double *sum64) {
    PyObject *xo, *co = Py_None;
    double m;
    Py_buffer x, c = {0};
    if (!PyArg_ParseTuple(args, "Od|O", &xo, &m, &co)) return -1;
    if (!raw_supported()) {
        PyErr_SetString(PyExc_RuntimeError, missing);
        return -1;
    }
    if (get_buf(xo, &x, 0, 'f') < 0) return -1;
    if (co != Py_None && (get_buf(co, &c, 1, 'f') < 0 || check_len(&c, x.shape[0]) < 0)) {
        if (c.obj) PyBuffer_Release(&c);
        PyBuffer_Release(&x);
        return -1;
    }
    *total = 0.0f, *dot = 0.0f, *sum64 = 0.0;
#ifdef KERNEL_AVX2
    Py_ssize_t n = x.shape[0];
    raw_dot d;
    memset(&d, 0, sizeof d);
    d.acc = _mm_setzero_ps();
    d.want64 = want64;
    d.copy = c.obj ? (float *)c.buf : NULL, d.base = (const float *)x.buf;
    Py_BEGIN_ALLOW_THREADS *total = raw_run((const float *)x.buf, (float)m, n, &d);
    *dot = d.out;
    *sum64 = d.sum64;
    Py_END_ALLOW_THREADS
#else
    (void)want64;
#endif
    if (c.obj) PyBuffer_Release(&c);
    PyBuffer_Release(&x);
    return 0;
}

static PyObject *py_raw_sums(PyObject *self, PyObject *args) {
    float total, dot;
    double sum64;
    if (raw_pass(args, "raw_sums needs AVX2 and FMA", 0, &total, &dot, &sum64) < 0) return NULL;
    return Py_BuildValue("(dd)", (double)total, (double)dot);
}

PyDoc_STRVAR(raw_exp_doc,
             "raw_exp(x, m, out): out[i] = exp(x[i] - float32(m)) for float32 x and out, numpy 2.4's float32\n"
             "exp (the numbers raw_sums adds).");

static PyObject *py_raw_exp(PyObject *self, PyObject *args) {
    PyObject *xo, *oo;
    double m;
    Py_buffer x, o;
    if (!PyArg_ParseTuple(args, "OdO", &xo, &m, &oo)) return NULL;
    if (!raw_supported()) {
        PyErr_SetString(PyExc_RuntimeError, "raw_exp needs AVX2 and FMA");
        return NULL;
    }
    if (get_buf(xo, &x, 0, 'f') < 0) return NULL;
    if (get_buf(oo, &o, 1, 'f') < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    Py_ssize_t n = x.shape[0];
#ifdef KERNEL_AVX2
    if (check_len(&o, n) == 0) {
        const float *xp = (const float *)x.buf;
        float *op = (float *)o.buf, s[RAW_LEAF];
        for (Py_ssize_t first = 0; first < n; first += RAW_LEAF) {
            Py_ssize_t k = n - first < RAW_LEAF ? n - first : RAW_LEAF;
            raw_exp_block(xp + first, (float)m, s, op + first, k);
        }
    }
#endif
    PyBuffer_Release(&x);
    PyBuffer_Release(&o);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(raw_probs_doc,
             "raw_probs(logits, ids, m, total, out): out[j] = float64(exp(logits[ids[j]] - float32(m))) / total for\n"
             "float32 logits, int64 ids and float64 out: raw_exp's float32 bits at those ids, widened and divided\n"
             "(the raw top's probabilities in one call: numpy's gather, raw_exp, astype and divide).");

static PyObject *py_raw_probs(PyObject *self, PyObject *args) {
    PyObject *objs[3];
    double m, total;
    Py_buffer v[3];
    if (!PyArg_ParseTuple(args, "OOddO", &objs[0], &objs[1], &m, &total, &objs[2])) return NULL;
    if (!raw_supported()) {
        PyErr_SetString(PyExc_RuntimeError, "raw_probs needs AVX2 and FMA");
        return NULL;
    }
    if (get_bufs(objs, v, "fqd", 4u, 3) < 0) return NULL;
    Py_buffer *x = &v[0], *ib = &v[1], *o = &v[2];
#ifdef KERNEL_AVX2
    Py_ssize_t k = ib->shape[0], n = x->shape[0];
    if (check_len(o, k) == 0) {
        const int64_t *ids = (const int64_t *)ib->buf;
        const float *xp = (const float *)x->buf;
        double *op = (double *)o->buf;
        float v[RAW_LEAF], e[RAW_LEAF], s[RAW_LEAF];
        for (Py_ssize_t first = 0; first < k && !PyErr_Occurred(); first += RAW_LEAF) {
            Py_ssize_t c = k - first < RAW_LEAF ? k - first : RAW_LEAF;
            for (Py_ssize_t j = 0; j < c; j++) {
                int64_t i = ids[first + j];
                if (i < 0 || i >= n) {
                    PyErr_SetString(PyExc_IndexError, "raw_probs: an id out of range");
                    break;
                }
                v[j] = xp[i];
            }
            if (PyErr_Occurred()) break;
            raw_exp_block(v, (float)m, s, e, c);
            for (Py_ssize_t j = 0; j < c; j++) op[first + j] = (double)e[j] / total;
        }
    }
#endif
    release_bufs(v, 3);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(raw_prob_doc,
             "raw_prob(logits, i, m, total) -> float: raw_probs' figure for the one id i (the drawn token's raw\n"
             "probability: no id array, no output array).");

static PyObject *py_raw_prob(PyObject *self, PyObject *args) {
    PyObject *lo;
    Py_ssize_t i;
    double m, total, out = 0.0;
    Py_buffer x;
    if (!PyArg_ParseTuple(args, "Ondd", &lo, &i, &m, &total)) return NULL;
    if (!raw_supported()) {
        PyErr_SetString(PyExc_RuntimeError, "raw_prob needs AVX2 and FMA");
        return NULL;
    }
    if (get_buf(lo, &x, 0, 'f') < 0) return NULL;
#ifdef KERNEL_AVX2
    if (i < 0 || i >= x.shape[0]) {
        PyErr_SetString(PyExc_IndexError, "raw_prob: an id out of range");
    } else {
        float v[1] = {((const float *)x.buf)[i]}, e[1], s[1];
        raw_exp_block(v, (float)m, s, e, 1);
        out = (double)e[0] / total;
    }
#endif
    PyBuffer_Release(&x);
    if (PyErr_Occurred()) return NULL;
    return PyFloat_FromDouble(out);
}

/* ---- chaincost (issue 23 item 3, issue 24's cost): the raw pass's float64 sum, the penalties' change
 * raw_sums64: raw_sums' pass (the same float32 bits) that also sums the float32 e's in
 * float64: with the raw pass's own bound on those e's (sampler_raw.RawSoftmax.bound) it
 * brackets the float64 total top-p needs, so that top-p over the whole vocabulary skips its
 * float64 exp of every logit wherever the bracket decides the cut (sampler_math.top_p_bounded). */
PyDoc_STRVAR(raw_sums64_doc,
             "raw_sums64(logits, m[, copy]) -> (total, dot, sum64): raw_sums' two float32 sums, and the same e's\n"
             "summed in float64 (widened exactly; added in the pass's own order); `copy` as raw_sums'.");

static PyObject *py_raw_sums64(PyObject *self, PyObject *args) {
    float total, dot;
    double sum64;
    if (raw_pass(args, "raw_sums64 needs AVX2 and FMA", 1, &total, &dot, &sum64) < 0) return NULL;
    return Py_BuildValue("(ddd)", (double)total, (double)dot, sum64);
}

/* change_logits: Candidates.change_logits (sampler_penalized.py) in one call where numpy took
 * some twenty on a few values: the tokens `ids` get `values` (float32, as numpy's assignment
 * casts them) in work (first a copy of logits, if `copy`), and the mass unit moves with them.
 * The exps are libm's exp, numpy's own float64 exp where it has no vector loop for it (here:
 * the same bits); the sums are added in order. Returns (norm, moved, changed, before_sum,
 * after_sum, the largest new value, its index in ids (the first of equal ones; -1: none),
 * whether `watch` (the known maximum's token) is among ids). */
PyDoc_STRVAR(change_logits_doc,
             "change_logits(logits, work, ids, values, raw_max, norm, copy, watch) -> (norm, moved, changed,\n"
             "before_sum, after_sum, top_value, top_index, watched): see sampler_penalized.change_logits.\n"
             "change_logits(logits, work, ids, None, raw_max, norm, copy, watch, penalty): the repeat penalty's\n"
             "values, each logit v (float32) becoming v / penalty if v > 0, else v * penalty, penalty in float32.");

static PyObject *py_change_logits(PyObject *self, PyObject *args) {
    PyObject *lo, *wo, *io, *vo, *res = NULL;
    double raw_max, norm0;
    int copy;
    long long watch;
    double penalty = 0.0;
    Py_buffer lb, wb, ib, vb;
    if (!PyArg_ParseTuple(args, "OOOOddpL|d", &lo, &wo, &io, &vo, &raw_max, &norm0, &copy, &watch, &penalty))
        return NULL;
    if (vo == Py_None && !(penalty > 0.0)) {
        PyErr_SetString(PyExc_ValueError, "change_logits: values None without a penalty");
        return NULL;
    }
    if (get_buf(lo, &lb, 0, 'f') < 0) return NULL;
    if (get_buf(wo, &wb, 1, 'f') < 0) goto fail_l;
    if (get_buf(io, &ib, 0, 'q') < 0) goto fail_w;
    if (vo == Py_None) { /* (the repeat penalty's values, made from the logits below: vb unused) */
        memset(&vb, 0, sizeof vb);
    } else if (get_buf(vo, &vb, 0, 0) < 0)
        goto fail_i;
    Py_ssize_t n = lb.shape[0], m = ib.shape[0];
    const int64_t *ids = (const int64_t *)ib.buf;
    float *work = (float *)wb.buf;
    const float pf = (float)penalty; /* (numpy: a Python float beside float32 is float32, NEP 50) */
    if (check_len(&wb, n) < 0) goto fail_v;
    if (vo != Py_None && vb.shape[0] != m) {
        PyErr_SetString(PyExc_ValueError, "ids and values differ in length");
        goto fail_v;
    }
    if (ids_within(ids, m, n) < 0) goto fail_v;
    double *ba = (double *)PyMem_Malloc((size_t)(2 * m + 1) * sizeof(double));
    if (!ba) {
        PyErr_NoMemory();
        goto fail_v;
    }
    double *aa = ba + m, before_sum = 0.0, after_sum = 0.0, top_v = 0.0;
    Py_ssize_t changed = 0, top_j = -1;
    int watched = 0, f64 = vb.itemsize == 8;
    if (copy) memcpy(work, lb.buf, (size_t)n * sizeof(float));
    for (Py_ssize_t j = 0; j < m; j++) {
        int64_t i = ids[j];
        float old = work[i], st;
        if (vo == Py_None) st = old > 0 ? old / pf : old * pf; /* (RepeatPenalty's np.where, in float32) */
        else st = f64 ? (float)((const double *)vb.buf)[j] : ((const float *)vb.buf)[j];
        work[i] = st;
        ba[j] = exp((double)old - raw_max);
        aa[j] = exp((double)st - raw_max);
        changed += st != old;
        watched |= i == watch;
        if (top_j < 0 || st > top_v) top_v = st, top_j = j;
    }
    for (Py_ssize_t j = 0; j < m; j++) before_sum += ba[j];
    for (Py_ssize_t j = 0; j < m; j++) after_sum += aa[j];
    double norm = norm0 + (after_sum - before_sum), rest = norm0 - before_sum > 0.0 ? norm0 - before_sum : 0.0;
    double moved = 0.0;
    for (Py_ssize_t j = 0; j < m; j++) moved += fabs(aa[j] / norm - ba[j] / norm0);
    moved += fabs(rest / norm0 - rest / norm);
    PyMem_Free(ba);
    res = Py_BuildValue("(ddndddni)", norm, moved, changed, before_sum, after_sum, top_v, top_j, watched);
fail_v:
    PyBuffer_Release(&vb);
fail_i:
    PyBuffer_Release(&ib);
fail_w:
    PyBuffer_Release(&wb);
fail_l:
    PyBuffer_Release(&lb);
    return res;
}

/* ---- DRY's repeats (engine/dry.py, `penalties` steps 2 and 3) ------------------------------
 * For each end position e < n - 1 of the context a, how many tokens the sequence ending at e has
 * in common with the one ending at the context's end (compared backwards), at most rep_limit:
 * the Z-array of the reversed context (Z[i], the longest common prefix of r and r[i:], r[i] =
 * a[n - 1 - i]), as llama.cpp's dry_repeat_count, in O(n) where numpy's blocks of offsets are
 * O(n) calls for a long repeat; then, for each token that follows an end position whose count
 * is at least allowed_length, the longest such count: ids ascending (np.unique's), each with its
 * longest. Integers throughout: dry._match_lengths' and np.maximum.at's very numbers. */
typedef struct {
    int64_t id, count;
} dry_pair;

static int dry_cmp(const void *a, const void *b) {
    const dry_pair *p = (const dry_pair *)a, *q = (const dry_pair *)b;
    return p->id < q->id ? -1 : (p->id > q->id);
}

/* Returns how many ids were written (-2: out of memory). */
static Py_ssize_t dry_longest(const int64_t *a, Py_ssize_t n, Py_ssize_t rep_limit, Py_ssize_t allowed,
                              int64_t *ids, int64_t *longest) {
    if (n < 2) return 0;
    Py_ssize_t *z = (Py_ssize_t *)malloc((size_t)n * sizeof(Py_ssize_t));
    dry_pair *pairs = (dry_pair *)malloc((size_t)(n - 1) * sizeof(dry_pair));
    if (!z || !pairs) {
        free(z);
        free(pairs);
        return -2;
    }
#define R(i) a[n - 1 - (i)]
    z[0] = n;
    for (Py_ssize_t i = 1, l = 0, r = 0; i < n; i++) {
        Py_ssize_t k = 0;
        if (i < r) k = r - i < z[i - l] ? r - i : z[i - l];
        while (i + k < n && R(k) == R(i + k)) k++;
        z[i] = k;
        if (i + k > r) l = i, r = i + k;
    }
#undef R
    Py_ssize_t m = 0;
    for (Py_ssize_t e = 0; e < n - 1; e++) {
        Py_ssize_t c = rep_limit <= 0 ? 0 : (z[n - 1 - e] < rep_limit ? z[n - 1 - e] : rep_limit);
        if (c >= allowed) pairs[m++] = (dry_pair){a[e + 1], (int64_t)c};
    }
    free(z);
    qsort(pairs, (size_t)m, sizeof(dry_pair), dry_cmp);
    Py_ssize_t k = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        if (k && ids[k - 1] == pairs[j].id) {
            if (pairs[j].count > longest[k - 1]) longest[k - 1] = pairs[j].count;
        } else {
            ids[k] = pairs[j].id, longest[k++] = pairs[j].count;
        }
    }
    free(pairs);
    return k;
}

PyDoc_STRVAR(dry_longest_doc,
             "dry_longest(a, rep_limit, allowed_length, ids, longest) -> k: DRY's steps 2 and 3 (engine/dry.py)\n"
             "on the context a (int64): the k tokens (ascending, into ids) that follow an end position whose\n"
             "repeat of the context's end (at most rep_limit long) is at least allowed_length, each with the\n"
             "longest such repeat (into longest; both int64, at least len(a) - 1 long).");

static PyObject *py_dry_longest(PyObject *self, PyObject *args) {
    PyObject *objs[3];
    Py_ssize_t rep_limit, allowed, k = 0;
    Py_buffer v[3];
    if (!PyArg_ParseTuple(args, "OnnOO", &objs[0], &rep_limit, &allowed, &objs[1], &objs[2])) return NULL;
    if (get_bufs(objs, v, "qqq", 6u, 3) < 0) return NULL;
    Py_buffer *a = &v[0], *ib = &v[1], *lb = &v[2];
    Py_ssize_t n = a->shape[0];
    if (check_len(ib, n - 1) == 0 && check_len(lb, n - 1) == 0) {
        k = dry_longest((const int64_t *)a->buf, n, rep_limit, allowed, (int64_t *)ib->buf, (int64_t *)lb->buf);
        if (k == -2) PyErr_NoMemory();
    }
    release_bufs(v, 3);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(k);
}

PyDoc_STRVAR(last_flagged_doc,
             "last_flagged(a, table) -> (i, unknown): DRY's last breaker (engine/dry.py, BreakerTable): from the\n"
             "end of a (int64 token ids), the first position whose token's entry in table (int8 by id: 1 a breaker,\n"
             "0 not, -1 not looked up yet; ids outside it are not breakers) is 1: (i, -1); or the first token met\n"
             "whose entry is -1: (-1, that token), to be looked up; (-1, -1): no breaker.");

static PyObject *py_last_flagged(PyObject *self, PyObject *args) {
    PyObject *ao, *to;
    Py_buffer a, t;
    if (!PyArg_ParseTuple(args, "OO", &ao, &to)) return NULL;
    if (get_buf(ao, &a, 0, 'q') < 0) return NULL;
    if (PyObject_GetBuffer(to, &t, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&a);
        return NULL;
    }
    const int64_t *ids = (const int64_t *)a.buf;
    const int8_t *tab = (const int8_t *)t.buf;
    Py_ssize_t found = -1, size = t.len;
    long long unknown = -1;
    for (Py_ssize_t i = a.shape[0] - 1; i >= 0; i--) {
        int64_t id = ids[i];
        if (id < 0 || id >= size) continue;
        if (tab[id] == 1) {
            found = i;
            break;
        }
        if (tab[id] < 0) {
            unknown = id;
            break;
        }
    }
    PyBuffer_Release(&t);
    PyBuffer_Release(&a);
    return Py_BuildValue("(nL)", found, unknown);
}

/* ---- the repeat penalty's tokens (sampler_penalized.recent_ids) ---------------------------------
 * The distinct ids of the context's last tokens that lie within the vocabulary, in the order each first
 * comes: a set of a few dozen ints, a range check and np.fromiter cost ~30 us a step after a forward pass. */
PyDoc_STRVAR(recent_ids_doc,
             "recent_ids(tail, n_vocab, out) -> k: the distinct ids of int64 tail within [0, n_vocab), in the order\n"
             "each first comes, into out[:k] (int64, at least len(tail) long).");

static PyObject *py_recent_ids(PyObject *self, PyObject *args) {
    PyObject *objs[2];
    Py_ssize_t n_vocab, k = 0;
    Py_buffer v[2];
    if (!PyArg_ParseTuple(args, "OnO", &objs[0], &n_vocab, &objs[1])) return NULL;
    if (get_bufs(objs, v, "qq", 2u, 2) < 0) return NULL;
    const int64_t *t = (const int64_t *)v[0].buf;
    int64_t *out = (int64_t *)v[1].buf;
    Py_ssize_t m = v[0].shape[0], size = 16;
    while (size < 2 * m) size *= 2;
    int64_t local[4096], *slot = local;
    if (check_len(&v[1], m) < 0) goto done;
    if (size > 4096 && !(slot = (int64_t *)malloc((size_t)size * sizeof(int64_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < size; i++) slot[i] = -1;
    for (Py_ssize_t j = 0; j < m; j++) {
        int64_t id = t[j];
        if (id < 0 || id >= n_vocab) continue;
        Py_ssize_t h = (Py_ssize_t)(((uint64_t)id * 0x9E3779B97F4A7C15ull) >> 20) & (size - 1);
        while (slot[h] >= 0 && slot[h] != id) h = (h + 1) & (size - 1);
        if (slot[h] < 0) slot[h] = id, out[k++] = id;
    }
    if (slot != local) free(slot);
done:
    release_bufs(v, 2);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(k);
}

/* ---- the sorted form's order (sampler_candidates.Candidates.sort) ----------------------------
 * np.argsort(-work[ids], kind="stable") and the ids and float64 logits in that order, in one call
 * (five numpy calls on ~70 candidates cost ~40 us a step after a forward pass, their memory cold):
 * larger first, NaN last, equal ones (0.0 and -0.0 among them) in the order they come. */
typedef struct {
    float v;
    int32_t j;
} sd_item;

/* a strictly before b: a larger, or b NaN and a not */
static inline int sd_before(const sd_item *a, const sd_item *b) {
    if (a->v != a->v) return 0;
    if (b->v != b->v) return 1;
    return a->v > b->v;
}

/* A stable merge sort of it[0..m) (tmp: m items): insertion sort of runs of 16, then merges. */
static void sd_sort(sd_item *it, sd_item *tmp, Py_ssize_t m) {
    enum { RUN = 16 };
    for (Py_ssize_t s = 0; s < m; s += RUN) {
        Py_ssize_t e = s + RUN < m ? s + RUN : m;
        for (Py_ssize_t i = s + 1; i < e; i++) {
            sd_item x = it[i];
            Py_ssize_t k = i;
            while (k > s && sd_before(&x, &it[k - 1])) {
                it[k] = it[k - 1];
                k--;
            }
            it[k] = x;
        }
    }
    sd_item *a = it, *b = tmp;
    for (Py_ssize_t w = RUN; w < m; w *= 2) {
        for (Py_ssize_t s = 0; s < m; s += 2 * w) {
            Py_ssize_t mid = s + w < m ? s + w : m, e = s + 2 * w < m ? s + 2 * w : m;
            Py_ssize_t i = s, j = mid, o = s;
            while (i < mid && j < e) b[o++] = sd_before(&a[j], &a[i]) ? a[j++] : a[i++];
            while (i < mid) b[o++] = a[i++];
            while (j < e) b[o++] = a[j++];
        }
        sd_item *t = a;
        a = b, b = t;
    }
    if (a != it) memcpy(it, a, (size_t)m * sizeof(sd_item));
}

PyDoc_STRVAR(sort_down_doc,
             "sort_down(work, ids, out_ids, out_logits): the ids (int64, within float32 work's length) in the order of\n"
             "np.argsort(-work[ids], kind='stable') into out_ids (int64), their float64 logits into out_logits:\n"
             "larger first, NaN last, equal ones as they come. Both outputs at least len(ids) long.");

static PyObject *py_sort_down(PyObject *self, PyObject *args) {
    PyObject *objs[4];
    Py_buffer v[4];
    if (!PyArg_ParseTuple(args, "OOOO", &objs[0], &objs[1], &objs[2], &objs[3])) return NULL;
    if (get_bufs(objs, v, "fqqd", 0xcu, 4) < 0) return NULL;
    const float *work = (const float *)v[0].buf;
    const int64_t *ids = (const int64_t *)v[1].buf;
    int64_t *out_ids = (int64_t *)v[2].buf;
    double *out_l = (double *)v[3].buf;
    Py_ssize_t n = v[0].shape[0], m = v[1].shape[0];
    sd_item local[2 * 1024], *it = local;
    if (check_len(&v[2], m) < 0 || check_len(&v[3], m) < 0) goto done;
    if (m > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "sort_down: too many ids");
        goto done;
    }
    if (ids_within(ids, m, n) < 0) goto done;
    if (m > 1024 && !(it = (sd_item *)malloc((size_t)(2 * m) * sizeof(sd_item)))) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < m; j++) it[j] = (sd_item){work[ids[j]], (int32_t)j};
    sd_sort(it, it + m, m);
    for (Py_ssize_t j = 0; j < m; j++) {
        out_ids[j] = ids[it[j].j];
        out_l[j] = (double)it[j].v;
    }
    if (it != local) free(it);
done:
    release_bufs(v, 4);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"sort_down", py_sort_down, METH_VARARGS, sort_down_doc},
    {"recent_ids", py_recent_ids, METH_VARARGS, recent_ids_doc},
    {"last_flagged", py_last_flagged, METH_VARARGS, last_flagged_doc},
    {"dry_longest", py_dry_longest, METH_VARARGS, dry_longest_doc},
    {"exp", py_exp, METH_VARARGS, exp_doc},
    {"exp_sum", py_exp_sum, METH_VARARGS, exp_sum_doc},
    {"distribution", py_distribution, METH_VARARGS, distribution_doc},
    {"min_p", py_min_p, METH_VARARGS, min_p_doc},
    {"count_greater", py_count_greater, METH_VARARGS, count_greater_doc},
    {"at_least", py_at_least, METH_VARARGS, at_least_doc},
    {"exp_sum_above", py_exp_sum_above, METH_VARARGS, exp_sum_above_doc},
    {"cut_below", py_cut_below, METH_VARARGS, cut_below_doc},
    {"first_equal", py_first_equal, METH_VARARGS, first_equal_doc},
    {"cut_below_mask", py_cut_below_mask, METH_VARARGS, cut_below_mask_doc},
    {"bin_masses", py_bin_masses, METH_VARARGS, bin_masses_doc},
    {"bin_split", py_bin_split, METH_VARARGS, bin_split_doc},
    {"top_p_cut", py_top_p_cut, METH_VARARGS, top_p_cut_doc},
    {"sample_top", py_sample_top, METH_VARARGS, sample_top_doc},
    {"top_p_deep", py_top_p_deep, METH_VARARGS, top_p_deep_doc},
    {"pairwise_sum", py_pairwise_sum, METH_VARARGS, pairwise_sum_doc},
    {"tail_norm", py_tail_norm, METH_VARARGS, tail_norm_doc},
    {"tail_draw", py_tail_draw, METH_VARARGS, tail_draw_doc},
    {"top_k", py_top_k, METH_VARARGS, top_k_doc},
    {"raw_sums", py_raw_sums, METH_VARARGS, raw_sums_doc},
    {"raw_exp", py_raw_exp, METH_VARARGS, raw_exp_doc},
    {"raw_probs", py_raw_probs, METH_VARARGS, raw_probs_doc},
    {"raw_prob", py_raw_prob, METH_VARARGS, raw_prob_doc},
    {"raw_sums64", py_raw_sums64, METH_VARARGS, raw_sums64_doc},
    {"change_logits", py_change_logits, METH_VARARGS, change_logits_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sampler_kernel",
                                    "The sampler's float64 passes over the vocabulary, fused (see the C file).",
                                    -1, methods};

static int add_constraint_functions(PyObject *module); /* (gramcost's part, at the end of the file) */

PyMODINIT_FUNC PyInit__sampler_kernel(void) {
#ifdef KERNEL_AVX2
    kernel_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    compress_lut_init();
    compress8_lut_init();
#endif
    PyObject *m = PyModule_Create(&module);
    if (m && add_constraint_functions(m) < 0) Py_CLEAR(m);
#ifdef KERNEL_SOURCE_SHA256 /* (setup.py's: the sha256 of this file, built from) */
    if (m && PyModule_AddStringConstant(m, "source_sha256", KERNEL_SOURCE_SHA256) < 0) Py_CLEAR(m);
#endif
    return m;
}

/* ==== gramcost: the constraint stage's pass (engine/sampler_constraint.py, issue 24) ==========
 * Every figure the stage reports from one read of the logits and of llguidance's mask (32-bit
 * words, token i allowed where bit i & 31 of word i >> 5 is set): T, the sum of
 * exp(float64(x[i]) - shift) over every token (pass4's additions in pass4's order where the CPU
 * has AVX2 and FMA: exp_sum's very bits), the same exps summed over the smaller side (the
 * forbidden tokens when most are allowed, else the allowed ones; the other side's sum is T minus
 * it), the first position of the largest forbidden logit (-1: none forbidden); optionally, when
 * most are allowed, the allowed positions in order. It replaces an unpacking of the mask into a
 * byte a token, the positions of both sides and a float64 pass over the vocabulary
 * (docs/performance.md, "The constraint stage in one pass"). */

typedef struct {
    double total, side, work_side; /* work_side: the side's sum over the second array (the penalized logits) */
    Py_ssize_t top;
    float src_max; /* the largest allowed value of the second array (or x), where src was asked for */
} scan_out;


static inline int allowed_at(const uint32_t *w, Py_ssize_t i) { return (int)((w[i >> 5] >> (i & 31)) & 1u); }

/* The first forbidden position of x holding fmax (-1: none). */
static Py_ssize_t first_forbidden(const float *x, const uint32_t *w, float fmax, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (x[i] == fmax && !allowed_at(w, i)) return i;
    return -1;
}

static void scan_plain(const float *x, const float *wk, const uint32_t *w, double shift, Py_ssize_t n, int many,
                       int64_t *ids, float *src, scan_out *o) {
    double t = 0.0, side = 0.0, work_side = 0.0;
    Py_ssize_t c = 0, forbidden = 0;
    float fmax = -INFINITY, smax = -INFINITY;
    for (Py_ssize_t i = 0; i < n; i++) {
        double e = kexp((double)x[i] - shift);
        t += e;
        int a = allowed_at(w, i);
        if (a == !many) { /* (many: the forbidden side) */
            side += e;
            work_side += wk ? kexp((double)wk[i] - shift) : e;
        }
        if (a) {
            if (src) {
                float v = wk ? wk[i] : x[i];
                src[c] = v;
                smax = v > smax ? v : smax;
            }
            if (ids) ids[c++] = i;
        } else {
            forbidden++;
            fmax = x[i] > fmax ? x[i] : fmax; /* (a NaN: never) */
        }
    }
    o->total = t, o->side = side, o->work_side = work_side, o->top = forbidden ? first_forbidden(x, w, fmax, n) : -1;
    o->src_max = smax;
}

#ifdef KERNEL_AVX2
#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi")
/* LANES4[m]: the 64-bit lanes of the 4-bit mask m (lowest bit first) all ones, the others zero. */
#define L4(m) {-(int64_t)((m) & 1), -(int64_t)((m) >> 1 & 1), -(int64_t)((m) >> 2 & 1), -(int64_t)((m) >> 3 & 1)}
static const int64_t LANES4[16][4] = {L4(0), L4(1), L4(2),  L4(3),  L4(4),  L4(5),  L4(6),  L4(7),
                                      L4(8), L4(9), L4(10), L4(11), L4(12), L4(13), L4(14), L4(15)};
#undef L4

/* Four positions from i, those of the 4-bit mask m moved to ids (four lanes written). */
static inline __attribute__((always_inline)) void compress_ids4(unsigned m, Py_ssize_t i, int64_t *ids) {
    __m256i perm = _mm256_loadu_si256((const __m256i *)compress_lut[m]);
    __m256i pos = _mm256_add_epi64(_mm256_set1_epi64x((long long)i), _mm256_set_epi64x(3, 2, 1, 0));
    _mm256_storeu_si256((__m256i *)ids, _mm256_permutevar8x32_epi32(pos, perm));
}

/* One part of the pass, positions [from, to) (to - from a multiple of 8), eight tokens at a
   time; the allowed ids (and values) written from ids + c, src + c. The exps as pass4's (two
   chains of sums). A mask allows runs of tokens or forbids them, so a group of eight is nearly
   always all of the larger side: a branch on it (taken rarely) does the smaller side's work,
   its sum by a mask from LANES4 and the largest forbidden logit; a group all allowed (MANY)
   adds its eight positions to ids by two stores. */
static inline __attribute__((always_inline)) void scan_body(const float *x, const float *wk, const uint32_t *w,
                                                            double shift, Py_ssize_t from, Py_ssize_t to,
                                                            const int MANY, int64_t *ids, float *src, double *q,
                                                            float *smp, Py_ssize_t c, scan_part_out *o) {
    const uint8_t *mb = (const uint8_t *)w; /* (x86: little-endian, byte j holds tokens 8j..8j+7) */
    const __m256i bit8 = _mm256_set_epi32(128, 64, 32, 16, 8, 4, 2, 1);
    const unsigned common = MANY ? 0xFFu : 0u; /* the larger side's groups */
    __m256d vs = _mm256_set1_pd(shift), s0 = _mm256_setzero_pd(), s1 = s0, a0 = s0, a1 = s0, k0 = s0;
    __m256 vmax = _mm256_set1_ps(-INFINITY), smax = vmax;
    __m256i pos = _mm256_add_epi64(_mm256_set1_epi64x((long long)from), _mm256_set_epi64x(3, 2, 1, 0));
    __m256i four = _mm256_set1_epi64x(4);
    Py_ssize_t forbidden = 0;
    for (Py_ssize_t i = from; i < to; i += 8) {
        unsigned m = mb[i >> 3];
        __m256 x8 = _mm256_loadu_ps(x + i);
        __m256d e0, e1;
        exp8(x8, vs, &e0, &e1);
        s0 = _mm256_add_pd(s0, e0);
        s1 = _mm256_add_pd(s1, e1);
        if (__builtin_expect(m != common, 0)) {
            unsigned side = MANY ? ~m & 0xFFu : m;
            __m256d lo = _mm256_loadu_pd((const double *)LANES4[side & 15u]);
            __m256d hi = _mm256_loadu_pd((const double *)LANES4[side >> 4]);
            a0 = _mm256_add_pd(a0, _mm256_and_pd(lo, e0));
            a1 = _mm256_add_pd(a1, _mm256_and_pd(hi, e1));
            __m256d g0 = e0, g1 = e1; /* (the exps of the values src holds) */
            if (wk) { /* the penalized logits' exps, for the side's eight alone */
                __m256 w8 = _mm256_loadu_ps(wk + i);
                exp8(w8, vs, &g0, &g1);
                k0 = _mm256_add_pd(k0, _mm256_add_pd(_mm256_and_pd(lo, g0), _mm256_and_pd(hi, g1)));
            }
            forbidden += __builtin_popcount(~m & 0xFFu);
            __m256 allowed8 =
                _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)m), bit8), bit8));
            vmax = _mm256_max_ps(_mm256_blendv_ps(x8, _mm256_set1_ps(-INFINITY), allowed8), vmax); /* (NaN: not) */
            if (ids) { /* (MANY or not: the allowed ids; their values and exps where MANY) */
                if (MANY && src) { /* (the allowed values of the penalized logits, in order; their max) */
                    const float *v = wk ? wk : x;
                    double g8[8];
                    if (q) {
                        _mm256_storeu_pd(g8, g0);
                        _mm256_storeu_pd(g8 + 4, g1);
                    }
                    Py_ssize_t k = c;
                    for (int j = 0; j < 8; j++)
                        if (m >> j & 1u) {
                            if (q) q[k] = g8[j];
                            if (smp && !(k & 31)) smp[k >> 5] = v[i + j]; /* (src[::32]: top-p's sample) */
                            src[k++] = v[i + j];
                            smax = _mm256_max_ps(_mm256_set1_ps(v[i + j]), smax);
                        }
                }
                int64_t staged[8]; /* (compress_ids4 writes four lanes: nothing past the part's ids, which
                                      the helper thread may have written already) */
                compress_ids4(m & 15u, i, staged);
                compress_ids4(m >> 4, i + 4, staged + __builtin_popcount(m & 15u));
                memcpy(ids + c, staged, (size_t)__builtin_popcount(m) * sizeof(int64_t));
                c += __builtin_popcount(m);
            }
        } else if (MANY) { /* eight allowed */
            if (ids) {
                _mm256_storeu_si256((__m256i *)(ids + c), pos);
                _mm256_storeu_si256((__m256i *)(ids + c + 4), _mm256_add_epi64(pos, four));
                if (src) {
                    __m256 v8 = wk ? _mm256_loadu_ps(wk + i) : x8;
                    _mm256_storeu_ps(src + c, v8);
                    if (smp) { /* (src[::32], top-p's strided sample: the one of these eight, if any) */
                        Py_ssize_t r = (-c) & 31;
                        if (r < 8) smp[(c + r) >> 5] = (wk ? wk : x)[i + r];
                    }
                    smax = _mm256_max_ps(v8, smax); /* (a NaN: not) */
                    if (q) { /* (their exps: x's, where the penalties left all eight as they were) */
                        __m256d g0 = e0, g1 = e1;
                        if (wk && _mm256_movemask_ps(_mm256_cmp_ps(v8, x8, _CMP_EQ_OQ)) != 0xFF) {
                            exp8(v8, vs, &g0, &g1);
                        }
                        _mm256_storeu_pd(q + c, g0);
                        _mm256_storeu_pd(q + c + 4, g1);
                    }
                }
                c += 8;
            }
        } else { /* eight forbidden */
            vmax = _mm256_max_ps(x8, vmax);
            forbidden += 8;
        }
        pos = _mm256_add_epi64(pos, _mm256_add_epi64(four, four));
    }
    double ls[4], la[4], lk[4];
    _mm256_storeu_pd(ls, _mm256_add_pd(s0, s1));
    _mm256_storeu_pd(la, _mm256_add_pd(a0, a1));
    _mm256_storeu_pd(lk, k0);
    o->t = (ls[0] + ls[1]) + (ls[2] + ls[3]);
    o->a = (la[0] + la[1]) + (la[2] + la[3]);
    o->ak = (lk[0] + lk[1]) + (lk[2] + lk[3]);
    float lm[8], fmax = -INFINITY, sm = -INFINITY;
    _mm256_storeu_ps(lm, vmax);
    for (int l = 0; l < 8; l++) fmax = lm[l] > fmax ? lm[l] : fmax;
    _mm256_storeu_ps(lm, smax);
    for (int l = 0; l < 8; l++) sm = lm[l] > sm ? lm[l] : sm;
    o->fmax = fmax, o->smax = sm, o->forbidden = forbidden, o->c = c;
}

__attribute__((noinline)) static void scan_part(const float *x, const float *wk, const uint32_t *w, double shift,
                                                Py_ssize_t from, Py_ssize_t to, int many, int64_t *ids, float *src,
                                                double *q, float *smp, Py_ssize_t c, scan_part_out *o) {
    if (many && ids && src && q)
        scan_body(x, wk, w, shift, from, to, 1, ids, src, q, smp, c, o);
    else if (many && ids && src)
        scan_body(x, wk, w, shift, from, to, 1, ids, src, NULL, NULL, c, o);
    else if (many && ids)
        scan_body(x, wk, w, shift, from, to, 1, ids, NULL, NULL, NULL, c, o);
    else if (many)
        scan_body(x, wk, w, shift, from, to, 1, NULL, NULL, NULL, NULL, c, o);
    else if (ids)
        scan_body(x, wk, w, shift, from, to, 0, ids, NULL, NULL, NULL, c, o);
    else
        scan_body(x, wk, w, shift, from, to, 0, NULL, NULL, NULL, NULL, c, o);
}

/* The whole pass: its parts of SPLIT_PART (one where the row is no longer: the sums as before),
   their sums added in order from 0.0 (exp_sum_parts' order: the total has exp_sum's bits), the
   parts shared with the helper thread where it is offered (split_scan), then the padded tail and
   the first position of the largest forbidden logit. */
static void scan_avx2(const float *x, const float *wk, const uint32_t *w, double shift, Py_ssize_t n, int many,
                      int64_t *ids, float *src, double *q, float *smp, scan_out *o) {
    Py_ssize_t body = n & ~(Py_ssize_t)7, c = 0, forbidden = 0;
    double t = 0.0, a = 0.0, ak = 0.0;
    float fmax = -INFINITY, sm = -INFINITY;
    if (!(ids && src)) q = NULL;
    if (!q) smp = NULL; /* (the sample written with the exps alone) */
    int shared = body > SPLIT_PART && split_scan(x, wk, w, shift, body, many, ids, src, q, smp);
    for (Py_ssize_t p = 0, from = 0; from < body; p++, from += SPLIT_PART) {
        Py_ssize_t to = from + SPLIT_PART < body ? from + SPLIT_PART : body;
        scan_part_out po;
        if (!shared || split_take(p))
            scan_part(x, wk, w, shift, from, to, many, ids, src, q, smp, c, &po);
        else
            po = split_scanned(p);
        t += po.t, a += po.a, ak += po.ak, forbidden += po.forbidden, c = po.c;
        fmax = po.fmax > fmax ? po.fmax : fmax;
        sm = po.smax > sm ? po.smax : sm;
    }
    if (shared) split_end();
    const __m256d vs = _mm256_set1_pd(shift);
    for (Py_ssize_t i = body; i < n; i += 4) { /* the tail, padded to four lanes as pass4's */
        double tx[4] = {0.0, 0.0, 0.0, 0.0}, te[4];
        Py_ssize_t k = n - i < 4 ? n - i : 4;
        for (Py_ssize_t j = 0; j < k; j++) tx[j] = (double)x[i + j];
        _mm256_storeu_pd(te, exp4(_mm256_sub_pd(_mm256_loadu_pd(tx), vs)));
        double tg[4] = {te[0], te[1], te[2], te[3]}; /* (the exps of the values src holds, for q) */
        if (q && wk) {
            for (Py_ssize_t j = 0; j < k; j++) tx[j] = (double)wk[i + j];
            _mm256_storeu_pd(tg, exp4(_mm256_sub_pd(_mm256_loadu_pd(tx), vs)));
        }
        for (Py_ssize_t j = 0; j < k; j++) {
            t += te[j];
            int al = allowed_at(w, i + j);
            if (al == !many) {
                a += te[j];
                ak += wk ? kexp((double)wk[i + j] - shift) : 0.0;
            }
            if (al) {
                if (ids && src) {
                    float v = wk ? wk[i + j] : x[i + j];
                    if (q) q[c] = tg[j];
                    if (smp && !(c & 31)) smp[c >> 5] = v;
                    src[c] = v;
                    sm = v > sm ? v : sm;
                }
                if (ids) ids[c++] = i + j;
            } else {
                forbidden++;
                fmax = x[i + j] > fmax ? x[i + j] : fmax;
            }
        }
    }
    Py_ssize_t top = -1;
    if (forbidden) { /* the first forbidden position holding the largest forbidden logit */
        const uint8_t *mb = (const uint8_t *)w;
        __m256 vf = _mm256_set1_ps(fmax);
        for (Py_ssize_t p = 0; p < body && top < 0; p += 8) {
            unsigned eq = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + p), vf, _CMP_EQ_OQ));
            eq &= ~(unsigned)mb[p >> 3] & 0xFFu;
            if (eq) top = p + __builtin_ctz(eq);
        }
        for (Py_ssize_t p = body; p < n && top < 0; p++)
            if (x[p] == fmax && !allowed_at(w, p)) top = p;
    }
    o->total = t, o->side = a, o->work_side = wk ? ak : a, o->top = top, o->src_max = sm;
}
#pragma GCC pop_options
#endif

PyDoc_STRVAR(constraint_scan_doc,
             "constraint_scan(x, work, words, shift, ids, src) -> (count, total, side, work_side, top, src_max): for\n"
             "float32 x and a mask of int32 words (bit i & 31 of word i >> 5: position i allowed): how many positions\n"
             "are allowed; the sum of exp(float64(x[i]) - shift) over every position; the same over the smaller\n"
             "side (the positions not allowed when more than half are allowed, else the allowed ones), and over\n"
             "that side of `work` (float32, x's length; None: x's sum again); the first position of the largest\n"
             "x[i] not allowed (-1: none). The allowed positions go into ids (int64, x's length; None: nothing\n"
             "written) in order; when more than half are allowed (and fewer than all), unless src is None, their\n"
             "values of work (or x) into src (float32, x's length), src_max their largest (else -inf).\n"
             "Every position allowed or none: nothing summed. `q` (float64, x's length; optional): where the CPU has\n"
             "AVX2 and FMA and the ids and src are written, the exps of src, exp(float64(src[c]) - shift), into q[c]\n"
             "(the bits exp_sum_above computes for src at that shift: it may read them, `stored`); the tuple then\n"
             "has a seventh item, whether q was written. `sample` (float32, at least (len(x) + 31) // 32; optional):\n"
             "where q is written, src[::32] too, top-p's strided sample (top_p_deep's `sample`).");

/* The bits set in the words w[from:to]. (A clone for x86-64-v3: the generic build's __builtin_popcount is
   libgcc's __popcountdi2, a call a word: 8,192 of them twice a step on Gemma's mask, chain17.) */
KERNEL_CLONES
static Py_ssize_t words_count(const uint32_t *w, Py_ssize_t from, Py_ssize_t to) {
    Py_ssize_t c = 0;
    for (Py_ssize_t j = from; j < to; j++) c += __builtin_popcount(w[j]);
    return c;
}

/* How many of the n positions the mask allows (the bits past n not counted). */
static Py_ssize_t mask_count(const uint32_t *w, Py_ssize_t n) {
    Py_ssize_t c = words_count(w, 0, n / 32);
    if (n % 32) c += __builtin_popcount(w[n / 32] & ((1u << (n % 32)) - 1u));
    return c;
}

static PyObject *py_constraint_scan(PyObject *self, PyObject *args) {
    PyObject *xo, *ko, *wo, *io, *so, *qo = NULL, *mo = NULL;
    double shift;
    Py_buffer x, kb, wb, ib, sb, qb, mb;
    Py_ssize_t count = 0;
    int q_written = 0;
    scan_out o = {0.0, 0.0, 0.0, -1, -INFINITY};
    if (!PyArg_ParseTuple(args, "OOOdOO|OO", &xo, &ko, &wo, &shift, &io, &so, &qo, &mo)) return NULL;
    if (get_buf(xo, &x, 0, 'f') < 0) return NULL;
    int has_work = ko != Py_None;
    if (has_work && get_buf(ko, &kb, 0, 'f') < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    if (get_buf(wo, &wb, 0, 'i') < 0) goto fail_w;
    int has_ids = io != Py_None; /* (None: no ids or values written, e.g. a top-k by the mask follows) */
    if (has_ids && get_buf(io, &ib, 1, 'q') < 0) goto fail_i;
    int has_src = has_ids && so != Py_None;
    if (has_src && get_buf(so, &sb, 1, 'f') < 0) goto fail_s;
    int has_q = has_src && qo && qo != Py_None;
    if (has_q && get_buf(qo, &qb, 1, 'd') < 0) goto fail_q;
    int has_m = has_q && mo && mo != Py_None;
    if (has_m && get_buf(mo, &mb, 1, 'f') < 0) goto fail_m;
    Py_ssize_t n = x.shape[0];
    if (wb.shape[0] < (n + 31) / 32) {
        PyErr_SetString(PyExc_ValueError, "constraint_scan: the mask holds fewer bits than x has positions");
    } else if ((has_work && kb.shape[0] != n) || (has_ids && ib.shape[0] < n) || (has_src && sb.shape[0] < n) ||
               (has_q && qb.shape[0] < n)) {
        PyErr_SetString(PyExc_ValueError, "constraint_scan: work, ids, src and q must hold x's length");
    } else if (has_m && mb.shape[0] < (n + 31) / 32) {
        PyErr_SetString(PyExc_ValueError, "constraint_scan: the sample must hold (len(x) + 31) // 32");
    } else {
        const float *xp = (const float *)x.buf, *kp = has_work ? (const float *)kb.buf : NULL;
        const uint32_t *wp = (const uint32_t *)wb.buf;
        int64_t *ip = has_ids ? (int64_t *)ib.buf : NULL;
        float *sp = has_src ? (float *)sb.buf : NULL;
        double *qp = has_q ? (double *)qb.buf : NULL;
        float *mp = has_m ? (float *)mb.buf : NULL;
        count = mask_count(wp, n);
        int many = count * 2 > n;
        Py_BEGIN_ALLOW_THREADS if (count > 0 && count < n) {
#ifdef KERNEL_AVX2
            if (kernel_fma && __builtin_cpu_supports("bmi")) {
                scan_avx2(xp, kp, wp, shift, n, many, ip, many ? sp : NULL, many ? qp : NULL, many ? mp : NULL, &o);
                q_written = many && qp != NULL;
            } else
#endif
                scan_plain(xp, kp, wp, shift, n, many, ip, many ? sp : NULL, &o);
        }
        Py_END_ALLOW_THREADS
    }
    if (has_m) PyBuffer_Release(&mb);
fail_m:
    if (has_q) PyBuffer_Release(&qb);
fail_q:
    if (has_src) PyBuffer_Release(&sb);
fail_s:
    if (has_ids) PyBuffer_Release(&ib);
fail_i:
    PyBuffer_Release(&wb);
fail_w:
    PyBuffer_Release(&x);
    if (has_work) PyBuffer_Release(&kb);
    if (PyErr_Occurred()) return NULL;
    if (qo) return Py_BuildValue("(ndddndO)", count, o.total, o.side, o.work_side, o.top, (double)o.src_max,
                                 q_written ? Py_True : Py_False);
    return Py_BuildValue("(ndddnd)", count, o.total, o.side, o.work_side, o.top, (double)o.src_max);
}


/* ==== gramcost2: the long float64 exp passes in parts, on two threads (issue 24) ==============
 * exp_sum's and exp_sum_above's sums over a row of more than SPLIT_PART positions are taken part
 * by part: each part of SPLIT_PART positions (the last one shorter) summed as pass4 sums (its eight
 * lanes, then (l0 + l1) + (l2 + l3)), the parts' sums added in order from 0.0, then pass4's padded
 * tail (the row's last n % 8 positions); constraint_scan's total the same way (docs/trace-format.md,
 * "Sums over the vocabulary"). A row of at most SPLIT_PART positions is summed exactly as before.
 * The order does not depend on who computes a part: between two forward passes the cores
 * llama.cpp used are idle, and a persistent helper thread takes parts from the row's end while
 * the caller takes them from its start; the caller then adds the parts' sums in order (and, for
 * exp_sum_above, moves the helper's picks of a part into place). Every result has the same bits
 * on one thread or two. The caller waits only for a part the helper has taken and not finished
 * (13 us of work at 8,192 positions); a helper still busy with an earlier job, or another thread
 * using it, and the caller takes every part itself. `split_threads` (set_threads) is the engine's
 * llama thread count: 1, or a row shorter than split_min, and no helper is asked (docs/
 * performance.md, "The chain under a schema, sixth session"). */
#ifdef KERNEL_AVX2
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <errno.h>

#define SPLIT_MAX_PARTS 256
#define SPLIT_GAP (SPLIT_PART + 8)
#define SPLIT_SPIN_NS 30000
/* The timed wake (docs/performance.md, "chain9"): at a chain's end the sleeping helper is set to wake
   by its own timer a little (AHEAD_MIN_NS + a sixteenth of it) before the next chain should start, as
   far from this end as the last chain's start was from the one before's end (the forward pass between
   them), and then polls, offering its core, for AHEAD_HOLD_NS: the chain's start then finds it awake
   and sends no interrupt (a futex wake of a halted vCPU costs its sender ~30 us here). A gap of more
   than AHEAD_MAX_GAP_NS (a pause, a user's step) sets no timer. set_ahead(0) turns it off. */
#define AHEAD_MIN_NS 100000LL
#define AHEAD_HOLD_NS 2000000LL
#define AHEAD_MAX_GAP_NS 100000000LL
static int split_ahead = 1;
static Py_ssize_t split_min = 32768;
static int split_threads = 1;
/* jobs posted, parts the helper did, stalls (then no helper for a while), chain starts that found the helper
   asleep (a signal sent), timed wakes (split_wake(0)'s) */
static long split_stats[5];
/* A caller that waited SPLIT_STALL_NS for a part the helper had taken (its thread lost its core
   mid-part) offers no job for a while after it (split_backoff): SPLIT_BACKOFF_MIN_NS, about a pass of
   Gemma, after a stall that came alone (a one-off: an interrupt, a short neighbour), twice the last
   back-off after one that came soon after the last (within four back-offs of it: the machine stays
   loaded), up to SPLIT_BACKOFF_MAX_NS. A loaded machine then waits once a second at most, as before;
   a quiet one no longer loses the helper for a second (some 60 of Gemma's passes) to one stall. */
#define SPLIT_STALL_NS 100000
#define SPLIT_BACKOFF_MIN_NS 20000000LL
#define SPLIT_BACKOFF_MAX_NS 1000000000LL
static long long split_off_until; /* (the callers' only: under pool.lock, or read before it) */
static long long split_last_stall, split_backoff_ns = SPLIT_BACKOFF_MIN_NS; /* (the same) */

/* The back-off after a stall `since` ns after the last one (since < 0: the first), the last back-off
   having been `last` ns. */
static long long split_backoff(long long since, long long last) {
    if (since < 0 || since >= 4 * last) return SPLIT_BACKOFF_MIN_NS;
    return 2 * last < SPLIT_BACKOFF_MAX_NS ? 2 * last : SPLIT_BACKOFF_MAX_NS;
}

enum { PART_FREE = 0, PART_MAIN = 1, PART_HELPER = 2, PART_DONE = 3 };
enum { JOB_EXP_SUM = 0, JOB_ABOVE = 1, JOB_SCAN = 2, JOB_RAW = 3, JOB_DIST = 4, JOB_HALF = 5 };
/* JOB_DIST: the distribution's blocks of at least this many positions (SPLIT_PART / DIST_MIN_BLOCK a part) */
#define DIST_MIN_BLOCK 256

typedef struct {
    int kind;
    const float *x;
    double shift;
    float v;
    double *q; /* JOB_EXP_SUM, JOB_ABOVE, JOB_SCAN: the caller's exps of every position (NULL: not stored) */
    float *smp; /* JOB_SCAN: src[::32], written with q (NULL: not) */
    int stored; /* JOB_ABOVE: q holds the exps already (read, not computed) */
    Py_ssize_t body;
    const float *wk; /* JOB_SCAN: constraint_scan's arrays (its ids and src written in place) */
    const uint32_t *w;
    int many;
    int64_t *ids;
    float *src;
    Py_ssize_t half; /* JOB_RAW: where the second half starts (x's length: body) */
    int want64;
    float *copy; /* JOB_RAW: where the logits are copied (NULL: not copied) */
    const void *xv; /* JOB_DIST: dist_blocks' arguments (body: x's length) */
    int f32;
    double t;
    double *wt, *bp;
    Py_ssize_t block;
    half_fn fn; /* JOB_HALF: run_halves' second half, fn(arg, 1) */
    void *arg;
} split_job;

typedef struct {
    pthread_mutex_t lock; /* held by the caller for its job (trylock: a second caller runs alone) */
    pthread_mutex_t wake_lock;
    pthread_cond_t wake;
    pthread_t thread;
    int started, idle; /* idle: the helper is between jobs (under wake_lock) */
    int asleep, nudge;  /* asleep: in cond_wait (atomic, seq_cst); nudge: split_wake's (under wake_lock) */
    long long hold_until; /* split_wake: the helper polls, not sleeps, until then (atomic, seq_cst) */
    long long ahead_at;   /* split_wake(0): the helper's timed wake, ahead of the next chain's start (atomic) */
    long long chain_end, gap; /* (the callers': the last chain's end, the time from it to the next one's start) */
    unsigned long seq; /* a new job: seq moves on (under wake_lock; read atomically while polling) */
    split_job job;
    Py_ssize_t parts;
    int64_t *ids; /* JOB_ABOVE: the helper's picks of part p at p * SPLIT_PART */
    double *qs;
    Py_ssize_t cap;
    int state[SPLIT_MAX_PARTS]; /* PART_*, atomic */
    double sum[SPLIT_MAX_PARTS];
    Py_ssize_t picked[SPLIT_MAX_PARTS];
    Py_ssize_t c0[SPLIT_MAX_PARTS]; /* JOB_SCAN: the allowed ids before each part */
    scan_part_out scanned[SPLIT_MAX_PARTS];
    float raw_right; /* JOB_RAW: the second half's pairwise sum, its buffers' sums, its float64 addends (in qs) */
    float raw_out[SPLIT_MAX_PARTS + 2];
    int raw_nout;
    Py_ssize_t raw_n64;
    double dist_wz[SPLIT_MAX_PARTS * (SPLIT_PART / DIST_MIN_BLOCK)]; /* JOB_DIST: each block's sum of w * z */
} split_pool;

static split_pool pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

#pragma GCC push_options
#pragma GCC target("avx2,fma")
/* pass4's sum over positions [a, b) (b - a a multiple of 8), the exps stored into q + a if Q. */
static inline __attribute__((always_inline)) double part_exp_sum_body(const float *x, double shift, double *q,
                                                                      Py_ssize_t a, Py_ssize_t b, const int Q) {
    __m256d vs = _mm256_set1_pd(shift), s0 = _mm256_setzero_pd(), s1 = s0;
    for (Py_ssize_t i = a; i < b; i += 8) {
        __m256 x8 = _mm256_loadu_ps(x + i);
        __m256d e0, e1;
        exp8(x8, vs, &e0, &e1);
        if (Q) {
            _mm256_storeu_pd(q + i, e0);
            _mm256_storeu_pd(q + i + 4, e1);
        }
        s0 = _mm256_add_pd(s0, e0);
        s1 = _mm256_add_pd(s1, e1);
    }
    double ls[4];
    _mm256_storeu_pd(ls, _mm256_add_pd(s0, s1));
    return (ls[0] + ls[1]) + (ls[2] + ls[3]);
}

__attribute__((noinline)) static double part_exp_sum(const float *x, double shift, double *q, Py_ssize_t a,
                                                     Py_ssize_t b) {
    return pass4_f32(x + a, shift, 1.0, q ? q + a : NULL, b - a, NULL);
}

/* exp_sum_above4's loop over positions [a, b): its sum, its picks into ids, qs (*k of them), every
   exp into qf + i where qf is not NULL (STORED: read from it). */
static inline __attribute__((always_inline)) double part_above_body(const float *x, double shift, float v,
                                                                    Py_ssize_t a, Py_ssize_t b, int64_t *ids,
                                                                    double *qs, Py_ssize_t *k, double *qf,
                                                                    const int STORED) {
    __m256d vs = _mm256_set1_pd(shift), s0 = _mm256_setzero_pd(), s1 = s0;
    __m256 vv = _mm256_set1_ps(v);
    Py_ssize_t c = 0;
    for (Py_ssize_t i = a; i < b; i += 8) {
        __m256 x8 = _mm256_loadu_ps(x + i);
        __m256d e0, e1;
        above_exps(x8, vs, qf, i, STORED, &e0, &e1);
        s0 = _mm256_add_pd(s0, e0);
        s1 = _mm256_add_pd(s1, e1);
        if (qf && !STORED) {
            _mm256_storeu_pd(qf + i, e0);
            _mm256_storeu_pd(qf + i + 4, e1);
        }
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(x8, vv, _CMP_GE_OQ));
        if (m && i + 8 < b) {
            c += compress4(m & 15, i, e0, ids + c, qs + c);
            c += compress4(m >> 4, i + 4, e1, ids + c, qs + c);
        } else if (m) { /* a part's last group: nothing written past its picks (compress4 writes four lanes) */
            double e8[8];
            _mm256_storeu_pd(e8, e0);
            _mm256_storeu_pd(e8 + 4, e1);
            for (int j = 0; j < 8; j++)
                if (m >> j & 1u) ids[c] = i + j, qs[c++] = e8[j];
        }
    }
    *k = c;
    double ls[4];
    _mm256_storeu_pd(ls, _mm256_add_pd(s0, s1));
    return (ls[0] + ls[1]) + (ls[2] + ls[3]);
}

__attribute__((noinline)) static double part_above(const float *x, double shift, float v, Py_ssize_t a, Py_ssize_t b,
                                                   int64_t *ids, double *qs, Py_ssize_t *k, double *qf, int stored) {
    if (stored) return part_above_body(x, shift, v, a, b, ids, qs, k, qf, 1);
    return part_above_body(x, shift, v, a, b, ids, qs, k, qf, 0);
}
#pragma GCC pop_options

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void helper_part(Py_ssize_t p) {
    const split_job *j = &pool.job;
    Py_ssize_t a = p * SPLIT_PART, b = a + SPLIT_PART < j->body ? a + SPLIT_PART : j->body;
    if (j->kind == JOB_EXP_SUM)
        pool.sum[p] = part_exp_sum(j->x, j->shift, j->q, a, b);
    else if (j->kind == JOB_ABOVE)
        pool.sum[p] = part_above(j->x, j->shift, j->v, a, b, pool.ids + p * SPLIT_GAP, pool.qs + p * SPLIT_GAP,
                                 &pool.picked[p], j->q, j->stored);
    else if (j->kind == JOB_DIST) {
        Py_ssize_t j0 = a / j->block, j1 = (b + j->block - 1) / j->block;
        dist_blocks(j->xv, j->f32, j->shift, j->t, j->wt, j->bp, j->block, j->body, j0, j1, NULL, pool.dist_wz + j0);
    } else if (j->kind == JOB_SCAN)
        scan_part(j->x, j->wk, j->w, j->shift, a, b, j->many, j->ids, j->src, j->q, j->smp, pool.c0[p],
                  &pool.scanned[p]);
    else if (j->kind == JOB_HALF) {
        if (p == 1) j->fn(j->arg, 1);
    } else if (p == 1) { /* JOB_RAW: the second half, its einsum state from a buffer's start */
        raw_dot d;
        memset(&d, 0, sizeof d);
        d.acc = _mm_setzero_ps();
        d.want64 = j->want64, d.rec_out = pool.raw_out, d.rec64 = pool.qs;
        d.copy = j->copy, d.base = j->x;
        pool.raw_right = raw_pairwise(j->x + j->half, (float)j->shift, j->body - j->half, &d);
        if (d.in_chunk || d.npend) raw_dot_flush(&d);
        pool.raw_nout = d.nrec_out, pool.raw_n64 = d.nrec64;
    }
}

/* The helper's sleep until a job (0, wake_lock still held) or split_wake's nudge (1, unlocked):
   asleep is stored before hold_until is read, as split_wake stores hold_until before reading
   asleep (both seq_cst), so a wake is never missed between the poll and the sleep. */
static int helper_sleep(unsigned long seen) {
    int timed = 0;
    while (pool.seq == seen && !pool.nudge) {
        __atomic_store_n(&pool.asleep, 1, __ATOMIC_SEQ_CST);
        long long t = now_ns(), at = __atomic_load_n(&pool.ahead_at, __ATOMIC_SEQ_CST);
        if (t < __atomic_load_n(&pool.hold_until, __ATOMIC_SEQ_CST)) {
            pool.nudge = 1;
        } else if (at > t) { /* (split_wake(0)'s timed wake: its own timer, no caller's interrupt) */
            struct timespec ts = {(time_t)(at / 1000000000LL), (long)(at % 1000000000LL)};
            if (pthread_cond_clockwait(&pool.wake, &pool.wake_lock, CLOCK_MONOTONIC, &ts) == ETIMEDOUT &&
                __atomic_compare_exchange_n(&pool.ahead_at, &at, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
                __atomic_store_n(&pool.hold_until, now_ns() + AHEAD_HOLD_NS, __ATOMIC_SEQ_CST);
                pool.nudge = 1, timed = 1;
                __atomic_add_fetch(&split_stats[4], 1, __ATOMIC_RELAXED);
            }
        } else {
            pthread_cond_wait(&pool.wake, &pool.wake_lock);
        }
        __atomic_store_n(&pool.asleep, 0, __ATOMIC_SEQ_CST);
    }
    pool.nudge = 0;
    if (pool.seq != seen) return 0;
    pthread_mutex_unlock(&pool.wake_lock);
    return timed ? 2 : 1;
}

/* The helper: polls for a job for SPLIT_SPIN_NS after each (a chain's passes come in a row),
   then sleeps; takes the job under wake_lock (the caller writes it, and frees its parts, under
   the same lock and only while idle is set) and does parts from the row's end until it meets
   one the caller has taken. */
static void *split_helper(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "loopchat-split"); /* (so a test and a profile can find it) */
    unsigned long seen = 0;
    int ahead = 0;
    for (;;) {
        /* (after a timed wake, the core offered at once: a thread of the forward pass may be on it) */
        long long t0 = now_ns() - (ahead ? SPLIT_SPIN_NS + 1 : 0);
        for (unsigned spins = 0; __atomic_load_n(&pool.seq, __ATOMIC_ACQUIRE) == seen; spins++) {
            __builtin_ia32_pause();
            if ((spins & 63) == 63) {
                long long t = now_ns();
                if (t - t0 > SPLIT_SPIN_NS) { /* (past its short poll, held by split_wake: the core offered to */
                    if (t > __atomic_load_n(&pool.hold_until, __ATOMIC_SEQ_CST)) break; /* any other thread) */
                    sched_yield();
                }
            }
        }
        pthread_mutex_lock(&pool.wake_lock);
        ahead = helper_sleep(seen);
        if (ahead) { /* (split_wake's nudge, or the timed wake: poll again) */
            ahead = ahead == 2;
            continue;
        }
        seen = pool.seq;
        pool.idle = 0;
        pthread_mutex_unlock(&pool.wake_lock);
        for (Py_ssize_t p = pool.parts - 1; p >= 0; p--) { /* from the end: the caller comes from the start */
            int free_ = PART_FREE;
            if (!__atomic_compare_exchange_n(&pool.state[p], &free_, PART_HELPER, 0, __ATOMIC_ACQ_REL,
                                             __ATOMIC_ACQUIRE))
                break;
            helper_part(p);
            __atomic_store_n(&pool.state[p], PART_DONE, __ATOMIC_RELEASE);
            __atomic_add_fetch(&split_stats[1], 1, __ATOMIC_RELAXED);
        }
        pthread_mutex_lock(&pool.wake_lock);
        pool.idle = 1;
        pthread_mutex_unlock(&pool.wake_lock);
    }
    return NULL;
}

static int split_room(Py_ssize_t body) {
    body = (body / SPLIT_PART + 1) * SPLIT_GAP; /* (a part's picks at p * SPLIT_GAP: compress4's lanes past them) */
    if (pool.cap >= body) return 1;
    int64_t *ni = (int64_t *)malloc((size_t)body * sizeof(int64_t));
    double *nq = (double *)malloc((size_t)body * sizeof(double));
    if (!ni || !nq) {
        free(ni);
        free(nq);
        return 0;
    }
    free(pool.ids);
    free(pool.qs);
    pool.ids = ni, pool.qs = nq, pool.cap = body;
    return 1;
}

/* A forked child has no helper thread (and maybe a lock its parent's helper held): it starts afresh. */
static void split_forked(void) {
    pthread_mutex_init(&pool.lock, NULL);
    pthread_mutex_init(&pool.wake_lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pool.started = 0, pool.idle = 1, pool.seq = 0, pool.asleep = 0, pool.nudge = 0, pool.hold_until = 0;
    pool.ahead_at = 0, pool.chain_end = 0, pool.gap = 0;
}

/* The helper thread started if it was not (under pool.lock): 0, it cannot be. */
static int split_start(void) {
    if (!pool.started) {
        static int atfork;
        if (!atfork && pthread_atfork(NULL, NULL, split_forked) == 0) atfork = 1;
        pool.idle = 1;
        if (!atfork || pthread_create(&pool.thread, NULL, split_helper, NULL) != 0) return 0;
        pthread_detach(pool.thread);
        pool.started = 1;
    }
    return 1;
}

/* A chain starts (split_wake(ns)) or ends (split_wake(0)): the helper polls for jobs, instead of
   sleeping after SPLIT_SPIN_NS, until ns from now, woken now if it sleeps, so the chain's first
   long pass does not wait for its wake-up. Nothing when the helper is off. */
static void split_wake(long long ns) {
    long long t = now_ns();
    if (ns <= 0) {
        __atomic_store_n(&pool.hold_until, 0, __ATOMIC_SEQ_CST);
        long long g = pool.gap, lead = g / 16 + AHEAD_MIN_NS;
        int on = split_ahead && split_threads > 1 && g > 2 * lead && g < AHEAD_MAX_GAP_NS;
        __atomic_store_n(&pool.ahead_at, on ? t + g - lead : 0, __ATOMIC_SEQ_CST);
        pool.chain_end = t;
        return;
    }
    pool.gap = pool.chain_end ? t - pool.chain_end : 0;
    pool.chain_end = 0;
    if (split_threads < 2 || (split_off_until && t < split_off_until)) return;
    if (!pool.started) {
        if (pthread_mutex_trylock(&pool.lock) != 0) return;
        int ok = split_start();
        pthread_mutex_unlock(&pool.lock);
        if (!ok) return;
    }
    __atomic_store_n(&pool.hold_until, now_ns() + ns, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&pool.asleep, __ATOMIC_SEQ_CST)) {
        __atomic_add_fetch(&split_stats[3], 1, __ATOMIC_RELAXED);
        pthread_mutex_lock(&pool.wake_lock);
        pool.nudge = 1;
        pthread_cond_signal(&pool.wake);
        pthread_mutex_unlock(&pool.wake_lock);
    }
}

/* Offer a job over x[:body] to the helper: 1, posted (the caller then takes parts by split_take
   in order, and calls split_end); 0, the caller runs alone (every part its own). */
static int split_begin(const split_job *job, const Py_ssize_t *c0) {
    Py_ssize_t body = job->body, parts = (body + SPLIT_PART - 1) / SPLIT_PART;
    int kind = job->kind;
    if (split_threads < 2 || body < split_min || parts < 2 || parts > SPLIT_MAX_PARTS) return 0;
    if (split_off_until) { /* (a wait for a helper without a core: no helper for a while) */
        if (now_ns() < split_off_until) return 0;
        split_off_until = 0;
    }
    if (pthread_mutex_trylock(&pool.lock) != 0) return 0;
    if (!split_start()) goto alone;
    pthread_mutex_lock(&pool.wake_lock);
    if (!pool.idle || ((kind == JOB_ABOVE || kind == JOB_RAW) && !split_room(body))) { /* (busy: an earlier job) */
        pthread_mutex_unlock(&pool.wake_lock);
        goto alone;
    }
    for (Py_ssize_t p = 0; p < parts; p++) __atomic_store_n(&pool.state[p], PART_FREE, __ATOMIC_RELAXED);
    if (kind == JOB_RAW || kind == JOB_HALF) parts = 2, pool.state[0] = PART_MAIN; /* (the first half the caller's) */
    pool.job = *job, pool.parts = parts;
    if (c0) memcpy(pool.c0, c0, (size_t)parts * sizeof(Py_ssize_t));
    __atomic_store_n(&pool.seq, pool.seq + 1, __ATOMIC_RELEASE);
    split_stats[0]++;
    pthread_cond_signal(&pool.wake);
    pthread_mutex_unlock(&pool.wake_lock);
    return 1;
alone:
    pthread_mutex_unlock(&pool.lock);
    return 0;
}

/* Part p: 1, the caller's to do; 0, the helper's, done (waited for while it is under way). */
static int split_take(Py_ssize_t p) {
    int free_ = PART_FREE;
    if (__atomic_compare_exchange_n(&pool.state[p], &free_, PART_MAIN, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return 1;
    long long t0 = 0;
    for (unsigned spins = 0; __atomic_load_n(&pool.state[p], __ATOMIC_ACQUIRE) != PART_DONE; spins++) {
        __builtin_ia32_pause();
        if ((spins & 255) == 255) { /* a part takes ~13 us: far longer, the helper lost its core */
            long long t = now_ns();
            if (!t0) t0 = t;
            else if (t - t0 > SPLIT_STALL_NS) {
                if (!split_off_until) {
                    split_backoff_ns = split_backoff(split_last_stall ? t - split_last_stall : -1, split_backoff_ns);
                    split_last_stall = t;
                    split_off_until = t + split_backoff_ns;
                    __atomic_add_fetch(&split_stats[2], 1, __ATOMIC_RELAXED);
                }
                sched_yield(); /* (the helper may be waiting for this very core) */
            }
        }
    }
    return 0;
}

static void split_end(void) { pthread_mutex_unlock(&pool.lock); }

/* constraint_scan's parts offered to the helper (1: shared), each part's ids written from the
   count of allowed positions before it (the mask's bits, counted by 32-bit words). */
static int split_scan(const float *x, const float *wk, const uint32_t *w, double shift, Py_ssize_t body, int many,
                      int64_t *ids, float *src, double *q, float *smp) {
    Py_ssize_t parts = (body + SPLIT_PART - 1) / SPLIT_PART, c0[SPLIT_MAX_PARTS], c = 0;
    if (split_threads < 2 || body < split_min || parts < 2 || parts > SPLIT_MAX_PARTS) return 0;
    for (Py_ssize_t p = 0; p < parts; p++) {
        c0[p] = c;
        if (ids) {
            Py_ssize_t to = (p + 1) * (SPLIT_PART / 32), end = (body + 31) / 32; /* (j * 32 < body) */
            c += words_count(w, p * (SPLIT_PART / 32), to < end ? to : end);
        }
    }
    split_job job = {.kind = JOB_SCAN, .x = x, .shift = shift, .body = body, .wk = wk, .w = w, .many = many,
                     .ids = ids, .src = src, .q = q, .smp = smp};
    return split_begin(&job, c0);
}

static scan_part_out split_scanned(Py_ssize_t p) { return pool.scanned[p]; }

/* The distribution's blocks offered to the helper by parts (1: shared): blocks that divide a part. */
static int split_dist(const void *x, int f32, double shift, double t, double *w, double *bp, Py_ssize_t block,
                      Py_ssize_t n) {
    if (block < DIST_MIN_BLOCK || block > SPLIT_PART || SPLIT_PART % block) return 0;
    split_job job = {.kind = JOB_DIST, .xv = x, .f32 = f32, .shift = shift, .t = t, .wt = w, .bp = bp,
                     .block = block, .body = n};
    return split_begin(&job, NULL);
}

static double split_dist_wz(Py_ssize_t j) { return pool.dist_wz[j]; }

/* raw_run's second half offered to the helper (1: the caller then does the first half, and
   split_take(1), split_raw_merge or its own second half, split_end). */
static int split_raw(const float *x, float m, Py_ssize_t n, Py_ssize_t half, int want64, float *copy) {
    if (n - half > (Py_ssize_t)RAW_CHUNK * SPLIT_MAX_PARTS) return 0;
    split_job job = {.kind = JOB_RAW, .x = x, .shift = m, .body = n, .half = half, .want64 = want64, .copy = copy};
    return split_begin(&job, NULL);
}

/* run_halves where the helper thread may take the second half (a row of at least split_min). */
static void run_halves(half_fn fn, void *arg, Py_ssize_t n) {
    split_job job = {.kind = JOB_HALF, .body = n, .fn = fn, .arg = arg};
    if (!split_begin(&job, NULL)) {
        fn(arg, 0);
        fn(arg, 2);
        return;
    }
    fn(arg, 0);
    if (split_take(1)) fn(arg, 2);
    split_end();
}

/* The helper's second half added to the caller's einsum and float64 sum, in order; its sum. */
static float split_raw_merge(raw_dot *d) {
    for (int i = 0; i < pool.raw_nout; i++) d->out = d->out + pool.raw_out[i];
    for (Py_ssize_t i = 0; i < pool.raw_n64; i++) d->sum64 += pool.qs[i];
    return pool.raw_right;
}

/* pass4's padded tail over x[body:n] (its exps into q if q), added to s one by one. */
static double exp_tail(const float *x, double shift, double *q, Py_ssize_t body, Py_ssize_t n, double s) {
    if (body == n) return s;
    double w[8];
    Py_ssize_t m = n - body;
    double t = pass4_f32(x + body, shift, 1.0, w, m, NULL); /* (its own sum: not used) */
    (void)t;
    for (Py_ssize_t j = 0; j < m; j++) {
        if (q) q[body + j] = w[j];
        s += w[j];
    }
    return s;
}

/* exp_sum's pass where the CPU has AVX2 and FMA: the parts' sums in order (the helper's parts
   where it takes some), then the tail. */
static double exp_sum_parts(const float *x, double shift, double *q, Py_ssize_t n) {
    Py_ssize_t body = n & ~(Py_ssize_t)7;
    if (body <= SPLIT_PART) return pass4_f32(x, shift, 1.0, q, n, NULL);
    split_job job = {.kind = JOB_EXP_SUM, .x = x, .shift = shift, .q = q, .body = body};
    int shared = split_begin(&job, NULL);
    double s = 0.0;
    for (Py_ssize_t p = 0, a = 0; a < body; p++, a += SPLIT_PART) {
        Py_ssize_t b = a + SPLIT_PART < body ? a + SPLIT_PART : body;
        s += !shared || split_take(p) ? part_exp_sum(x, shift, q, a, b) : pool.sum[p];
    }
    if (shared) split_end();
    return exp_tail(x, shift, q, body, n, s);
}

/* exp_sum_above4 by parts, the same way: the helper's picks of a part moved into place in order. */
static double exp_sum_above_parts(const float *x, double shift, float v, int64_t *ids, double *qs, Py_ssize_t n,
                                  Py_ssize_t *kout, double *qf, int stored) {
    Py_ssize_t body = n & ~(Py_ssize_t)7, k = 0;
    if (body <= SPLIT_PART) return exp_sum_above4(x, shift, v, ids, qs, n, kout, qf, stored);
    split_job job = {.kind = JOB_ABOVE, .x = x, .shift = shift, .v = v, .body = body, .q = qf, .stored = stored};
    int shared = split_begin(&job, NULL);
    double s = 0.0;
    for (Py_ssize_t p = 0, a = 0; a < body; p++, a += SPLIT_PART) {
        Py_ssize_t b = a + SPLIT_PART < body ? a + SPLIT_PART : body, c;
        if (!shared || split_take(p)) {
            s += part_above(x, shift, v, a, b, ids + k, qs + k, &c, qf, stored);
        } else {
            s += pool.sum[p];
            c = pool.picked[p];
            memcpy(ids + k, pool.ids + p * SPLIT_GAP, (size_t)c * sizeof(int64_t));
            memcpy(qs + k, pool.qs + p * SPLIT_GAP, (size_t)c * sizeof(double));
        }
        k += c;
    }
    if (shared) split_end();
    if (body < n) s = above_tail(x, shift, v, body, n, ids, qs, &k, qf, s, stored);
    *kout = k;
    return s;
}
#else
static void run_halves(half_fn fn, void *arg, Py_ssize_t n) {
    (void)n;
    fn(arg, 0);
    fn(arg, 2);
}
#endif

PyDoc_STRVAR(set_threads_doc,
             "set_threads(n, min_len=-1) -> int: how many threads exp_sum's and exp_sum_above's long rows may use\n"
             "(the engine's llama thread count; 1: no helper thread, 2 and more: one helper) and the shortest row\n"
             "offered to the helper (-1: unchanged); returns the count before. Results have the same bits either way.");

static PyObject *py_set_threads(PyObject *self, PyObject *args) {
    int n;
    Py_ssize_t min_len = -1;
    if (!PyArg_ParseTuple(args, "i|n", &n, &min_len)) return NULL;
#ifdef KERNEL_AVX2
    int before = split_threads;
    split_threads = kernel_fma && n > 1 ? 2 : 1;
    if (min_len >= 0) split_min = min_len;
    return PyLong_FromLong(before);
#else
    (void)n, (void)min_len;
    return PyLong_FromLong(1);
#endif
}

PyDoc_STRVAR(wake_doc, "wake(us) -> None: a chain starts: the helper thread (where set_threads allows one) is woken\n"
             "now and polls for the chain's passes for up to us microseconds; wake(0): the chain has ended.");

static PyObject *py_wake(PyObject *self, PyObject *args) {
    long long us;
    if (!PyArg_ParseTuple(args, "L", &us)) return NULL;
#ifdef KERNEL_AVX2
    split_wake(us > 0 ? us * 1000LL : 0);
#else
    (void)us;
#endif
    Py_RETURN_NONE;
}

PyDoc_STRVAR(set_ahead_doc, "set_ahead(on) -> int: whether a chain's end sets the helper's timed wake before the next\n"
             "chain (on by default; the previous setting returned).");

static PyObject *py_set_ahead(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
#ifdef KERNEL_AVX2
    int before = split_ahead;
    split_ahead = on;
    if (!on) __atomic_store_n(&pool.ahead_at, 0, __ATOMIC_SEQ_CST);
    return PyLong_FromLong(before);
#else
    return PyLong_FromLong(0);
#endif
}

PyDoc_STRVAR(split_stats_doc, "split_stats() -> (jobs, parts, stalls, signals, timed): the jobs offered to the helper thread,\n"
             "the parts it did, the waits of more than 0.1 ms for one (each followed by a while without the helper:\n"
             "split_backoff), the chain starts that found it asleep (and woke it), its timed wakes before a chain\n"
             "(set_ahead).");

static PyObject *py_split_stats(PyObject *self, PyObject *args) {
#ifdef KERNEL_AVX2
    return Py_BuildValue("(lllll)", __atomic_load_n(&split_stats[0], __ATOMIC_RELAXED),
                         __atomic_load_n(&split_stats[1], __ATOMIC_RELAXED),
                         __atomic_load_n(&split_stats[2], __ATOMIC_RELAXED),
                         __atomic_load_n(&split_stats[3], __ATOMIC_RELAXED),
                         __atomic_load_n(&split_stats[4], __ATOMIC_RELAXED));
#else
    return Py_BuildValue("(lllll)", 0L, 0L, 0L, 0L, 0L);
#endif
}

PyDoc_STRVAR(split_backoff_doc,
             "split_backoff(since, last) -> ns: how long the helper is left out after a stall (a wait of more than\n"
             "0.1 ms for a part it had taken) that came `since` ns after the last one (negative: the first), the\n"
             "last back-off having been `last` ns: 20 ms after a stall that came alone (since >= 4 * last), else\n"
             "twice the last, up to 1 s (0 where the kernel has no helper).");

static PyObject *py_split_backoff(PyObject *self, PyObject *args) {
    long long since, last;
    if (!PyArg_ParseTuple(args, "LL", &since, &last)) return NULL;
#ifdef KERNEL_AVX2
    return PyLong_FromLongLong(split_backoff(since, last));
#else
    return PyLong_FromLongLong(0);
#endif
}

/* ---- top-p's kept candidates in one pass (issue 24, eighth session) ----------------------------
   The kept positions of top-p's set (into its source: the candidates' logits) become the new
   candidates: their ids (cand[kept], or kept itself), their logits (src[kept], the later stages'
   source) and the least of those with how many equal it (the stage's cut token, cut_after):
   one loop instead of numpy's three gathers (ids, the logits for the cut, the logits again for
   the distribution) and two passes (its min and its ties). */
PyDoc_STRVAR(take_doc,
             "take(kept, cand, src, ids, out) -> (low, n_low): for int64 positions kept into float32 src,\n"
             "ids[i] = cand[kept[i]] (int64; cand None: kept[i]) and out[i] = src[kept[i]] (float32), i < len(kept);\n"
             "low the least of out (inf for none; NaNs are passed over) and n_low how many of out equal it.");

/* take's halves (run_halves): kept[:mid] and kept[mid:k], each its own least and count. */
typedef struct {
    const int64_t *kept, *cand;
    const float *src;
    int64_t *ids;
    float *out;
    Py_ssize_t n, k, mid, n_low[2];
    float low[2];
    int bad[2];
} take_halves;

static void take_half(void *arg, int h) {
    take_halves *t = (take_halves *)arg;
    h = h ? 1 : 0;
    Py_ssize_t a = h ? t->mid : 0, b = h ? t->k : t->mid, n_low = 0, n = t->n;
    const int64_t *kept = t->kept, *cand = t->cand;
    const float *src = t->src;
    int64_t *ids = t->ids;
    float *out = t->out, low = INFINITY;
    int bad = 0;
    for (Py_ssize_t i = a; i < b; i++) { /* (the fields in locals: ids' stores may alias *t) */
        int64_t p = kept[i];
        if ((uint64_t)p >= (uint64_t)n) {
            bad = 1;
            break;
        }
        if (i + 16 < b) { /* (the gathers' lines asked for ahead: 0.87x the cycles, chain17) */
            int64_t pf = kept[i + 16];
            if ((uint64_t)pf < (uint64_t)n) {
                __builtin_prefetch(src + pf);
                if (cand) __builtin_prefetch(cand + pf);
            }
        }
        float v = src[p];
        ids[i] = cand ? cand[p] : p;
        out[i] = v;
        if (v < low) low = v, n_low = 0;
        n_low += v == low;
    }
    t->low[h] = low, t->n_low[h] = n_low, t->bad[h] = bad;
}

static PyObject *py_take(PyObject *self, PyObject *args) {
    PyObject *ko, *co, *so, *io, *oo;
    Py_buffer kb, cb, sb, ib, ob;
    Py_ssize_t k = 0, n = 0, n_low = 0;
    float low = INFINITY;
    int bad = 0;
    if (!PyArg_ParseTuple(args, "OOOOO", &ko, &co, &so, &io, &oo)) return NULL;
    int has_cand = co != Py_None, got = 0;
    if (get_buf(ko, &kb, 0, 'q') < 0) return NULL;
    got = 1;
    if (has_cand && get_buf(co, &cb, 0, 'q') < 0) goto done;
    got = 2;
    if (get_buf(so, &sb, 0, 'f') < 0) goto done;
    got = 3;
    if (get_buf(io, &ib, 1, 'q') < 0) goto done;
    got = 4;
    if (get_buf(oo, &ob, 1, 'f') < 0) goto done;
    got = 5;
    k = kb.shape[0], n = sb.shape[0];
    if ((has_cand && cb.shape[0] != n) || check_len(&ib, k) < 0 || check_len(&ob, k) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "cand must be as long as src");
        goto done;
    }
    take_halves t = {.kept = (const int64_t *)kb.buf, .cand = has_cand ? (const int64_t *)cb.buf : NULL,
                     .src = (const float *)sb.buf, .ids = (int64_t *)ib.buf, .out = (float *)ob.buf, .n = n, .k = k,
                     .mid = (k / 2) & ~(Py_ssize_t)63};
    Py_BEGIN_ALLOW_THREADS run_halves(take_half, &t, k);
    Py_END_ALLOW_THREADS
    /* (the halves' least in order: the first's unless the second's is below it, as one loop keeps it) */
    low = t.low[1] < t.low[0] ? t.low[1] : t.low[0];
    n_low = (t.low[0] == low ? t.n_low[0] : 0) + (t.low[1] == low ? t.n_low[1] : 0);
    bad = t.bad[0] || t.bad[1];
    if (bad) PyErr_SetString(PyExc_IndexError, "a kept position outside src");
done:
    if (got >= 5) PyBuffer_Release(&ob);
    if (got >= 4) PyBuffer_Release(&ib);
    if (got >= 3) PyBuffer_Release(&sb);
    if (got >= 2 && has_cand) PyBuffer_Release(&cb);
    if (got >= 1) PyBuffer_Release(&kb);
    if (PyErr_Occurred()) return NULL;
    return Py_BuildValue("(dn)", (double)low, n_low);
}

/* ---- the draw's walk (chain15): sampler_math.draw_unsorted in one call -----------------------
   The running sums of the blocks' sums (np.cumsum's sequential additions) up to the first above u,
   that block's weights (recomputed from the candidates' float32 logits by block_f32, as weights_of
   computes them, or read where they are stored), their running sum from 0 with the block's base
   added to each (numpy's `base + np.cumsum(block)`), and the first position above u: searchsorted's
   answer on these non-decreasing sums (side "right": how many are at most u). -1 where numpy must
   decide: u, a block's sum or a weight NaN or negative (the sums then need not rise). */
static Py_ssize_t draw_walk(const void *xv, int f32, Py_ssize_t n, double shift, double t, const double *bp,
                            Py_ssize_t nb, Py_ssize_t block, double u, double *buf) {
    if (u != u || nb <= 0) return -1;
    for (Py_ssize_t j = 0; j < nb; j++)
        if (!(bp[j] >= 0.0)) return -1;
    double cum = 0.0, base = 0.0;
    Py_ssize_t j = 0;
    for (; j < nb; j++) {
        double next = j ? cum + bp[j] : bp[j];
        if (next > u) break;
        cum = next;
    }
    if (j >= nb) { /* (u past the end: the last block, its base the sum before it) */
        j = nb - 1;
        cum = 0.0;
        for (Py_ssize_t i = 0; i < j; i++) cum = i ? cum + bp[i] : bp[i];
    }
    base = j ? cum : 0.0;
    Py_ssize_t first = j * block, m = n - first < block ? n - first : block;
    if (m <= 0) return -1;
    const double *w;
    if (f32) {
        double wz = 0.0;
        block_f32((const float *)xv + first, shift, t, buf, m, &wz);
        w = buf;
    } else {
        w = (const double *)xv + first;
    }
    double c = 0.0;
    Py_ssize_t i = 0;
    for (; i < m; i++) {
        if (!(w[i] >= 0.0)) return -1;
        c = i ? c + w[i] : w[i];
        if (base + c > u) break;
    }
    for (Py_ssize_t r = i + 1; r < m; r++) /* (the rest checked: a NaN after the pick is numpy's to rule on) */
        if (!(w[r] >= 0.0)) return -1;
    return first + (i < m - 1 ? i : m - 1);
}

PyDoc_STRVAR(draw_walk_doc,
             "draw_walk(x, shift, t, blocks, block, u) -> i: sampler_math.draw_unsorted's index over the\n"
             "distribution whose blocks of `block` positions sum to float64 `blocks`: x float64 (its weights)\n"
             "or float32 (the candidates' logits: a block's weights exp((x - shift) / t) as distribution computes\n"
             "them); -1 where numpy's way must decide (u, a block's sum or a weight NaN or negative).");

static PyObject *py_draw_walk(PyObject *self, PyObject *args) {
    PyObject *xo, *bo;
    double shift, t, u;
    Py_ssize_t block, r = -1;
    Py_buffer x, b;
    if (!PyArg_ParseTuple(args, "OddOnd", &xo, &shift, &t, &bo, &block, &u)) return NULL;
    if (block <= 0) {
        PyErr_SetString(PyExc_ValueError, "block must be positive");
        return NULL;
    }
    if (get_buf(xo, &x, 0, 0) < 0) return NULL;
    if (get_buf(bo, &b, 0, 'd') < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    Py_ssize_t n = x.shape[0], nb = b.shape[0];
    int f32 = x.itemsize == 4;
    if ((x.itemsize == 4 || x.itemsize == 8) && nb == (n + block - 1) / block) {
        double *buf = f32 ? (double *)malloc((size_t)block * sizeof(double)) : NULL;
        if (f32 && !buf) {
            PyErr_NoMemory();
        } else {
            Py_BEGIN_ALLOW_THREADS r = draw_walk(x.buf, f32, n, shift, t, (const double *)b.buf, nb, block, u, buf);
            Py_END_ALLOW_THREADS
        }
        free(buf);
    } else {
        PyErr_SetString(PyExc_ValueError, "draw_walk: blocks must cover x");
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&b);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(r);
}

/* ---- the reported top among a constraint's allowed tokens from the raw top (chain15, sampler_rawtop) ----
   The candidates (the raw top's M ids, then the penalized ones) that the mask's words allow, with their
   (penalized) logits, largest first (equal ones by id; a token once); where their k1 largest strictly fall,
   the last at or above tau (the M-th raw logit) and above the next candidate, their positions among the
   allowed ids (the set bits before each, by a prefix count of the words) into out: 1; else 0. */
typedef struct {
    float v;
    int64_t id;
} among_entry;

/* Whether a comes before b: the larger value first, equal ones by id. */
static inline int among_before(among_entry a, among_entry b) { return a.v > b.v || (a.v == b.v && a.id < b.id); }

KERNEL_CLONES
static int top_among(const float *work, Py_ssize_t n, const uint32_t *w, Py_ssize_t nw, const int64_t *cand,
                     Py_ssize_t nc, float tau, Py_ssize_t k1, int64_t *out) {
    among_entry *e = (among_entry *)malloc((size_t)(nc ? nc : 1) * sizeof(among_entry));
    int ok = 0;
    Py_ssize_t c = 0, u = 0;
    if (!e) return 0;
    for (Py_ssize_t j = 0; j < nc; j++) { /* the allowed ones, in order by insertion (a hundred or so) */
        int64_t id = cand[j];
        if (id < 0 || id >= n || id >> 5 >= nw || !((w[id >> 5] >> (id & 31)) & 1u)) continue;
        among_entry x = {work[id], id};
        if (x.v != x.v) goto done; /* (a NaN: numpy's top_indices places it its own way) */
        Py_ssize_t i = c++;
        for (; i > 0 && among_before(x, e[i - 1]); i--) e[i] = e[i - 1];
        e[i] = x;
    }
    for (Py_ssize_t j = 0; j < c; j++) /* (a token once: equal ids are neighbours) */
        if (!u || e[j].id != e[u - 1].id) e[u++] = e[j];
    if (u < k1 || !(e[k1 - 1].v >= tau) || (u > k1 && !(e[k1 - 1].v > e[k1].v))) goto done;
    for (Py_ssize_t j = 0; j + 1 < k1; j++)
        if (!(e[j].v > e[j + 1].v)) goto done;
    /* their positions: the set bits before each, one walk of the words up to the last of them by id */
    for (Py_ssize_t j = 0; j < k1; j++) out[j] = j;
    for (Py_ssize_t j = 1; j < k1; j++) { /* (out: the chosen ranks in ascending id) */
        int64_t r = out[j], i = j;
        for (; i > 0 && e[out[i - 1]].id > e[r].id; i--) out[i] = out[i - 1];
        out[i] = r;
    }
    {
        int64_t *rank = (int64_t *)malloc((size_t)k1 * sizeof(int64_t));
        if (!rank) goto done;
        memcpy(rank, out, (size_t)k1 * sizeof(int64_t));
        int64_t acc = 0, word = 0;
        for (Py_ssize_t j = 0; j < k1; j++) {
            int64_t id = e[rank[j]].id;
            for (; word < id >> 5; word++) acc += __builtin_popcount(w[word]);
            out[rank[j]] = acc + __builtin_popcount(w[id >> 5] & ((1u << (id & 31)) - 1u));
        }
        free(rank);
    }
    ok = 1;
done:
    free(e);
    return ok;
}

PyDoc_STRVAR(top_among_doc,
             "top_among(work, words, cand, tau, out) -> ok: the positions among the allowed ids (the set bits of\n"
             "uint32 words, ascending) of the len(out) largest of float32 work over the int64 candidate ids cand that\n"
             "the words allow, largest first, where they strictly fall, the last at or above tau and above every other\n"
             "allowed candidate; False otherwise (a NaN among them included).");

static PyObject *py_top_among(PyObject *self, PyObject *args) {
    PyObject *xo, *wo, *co, *oo;
    double tau;
    Py_buffer x, w, c, o;
    int ok = 0;
    if (!PyArg_ParseTuple(args, "OOOdO", &xo, &wo, &co, &tau, &oo)) return NULL;
    if (get_buf(xo, &x, 0, 'f') < 0) return NULL;
    if (PyObject_GetBuffer(wo, &w, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    if (get_buf(co, &c, 0, 'q') < 0) {
        PyBuffer_Release(&w);
        PyBuffer_Release(&x);
        return NULL;
    }
    if (get_buf(oo, &o, 1, 'q') < 0) {
        PyBuffer_Release(&c);
        PyBuffer_Release(&w);
        PyBuffer_Release(&x);
        return NULL;
    }
    if (w.len % 4) {
        PyErr_SetString(PyExc_ValueError, "top_among: words must be 32-bit");
    } else if (o.shape[0] > 0) {
        ok = top_among((const float *)x.buf, x.shape[0], (const uint32_t *)w.buf, w.len / 4, (const int64_t *)c.buf,
                       c.shape[0], (float)tau, o.shape[0], (int64_t *)o.buf);
    }
    PyBuffer_Release(&o);
    PyBuffer_Release(&c);
    PyBuffer_Release(&w);
    PyBuffer_Release(&x);
    if (PyErr_Occurred()) return NULL;
    return PyBool_FromLong(ok);
}

/* ---- the two ranks' counts in one pass (chain15, sampler_ranks) -------------------------------------
   Over float32 x and a constraint's mask (32-bit words, token i allowed where bit i & 31 of word i >> 5 is
   set): how many of x exceed vr, and how many allowed ones exceed vw; x read once, the mask's bits beside. */
static void count_pair_plain(const float *x, const uint32_t *w, float vr, float vw, Py_ssize_t from, Py_ssize_t n,
                             Py_ssize_t *cr, Py_ssize_t *ca) {
    for (Py_ssize_t i = from; i < n; i++) {
        *cr += x[i] > vr;
        *ca += x[i] > vw && ((w[i >> 5] >> (i & 31)) & 1u);
    }
}

#ifdef KERNEL_AVX2
__attribute__((target("avx2,popcnt"), optimize("align-loops=64"))) static Py_ssize_t
count_pair_avx2(const float *x, const uint32_t *w, float vr, float vw, Py_ssize_t n, Py_ssize_t *cr, Py_ssize_t *ca) {
    const __m256 r = _mm256_set1_ps(vr), a = _mm256_set1_ps(vw);
    Py_ssize_t nr = 0, na = 0, j = 0;
    for (; (j + 1) * 32 <= n; j++) { /* a word's 32 tokens */
        const float *p = x + j * 32;
        uint32_t gr = 0, ga = 0;
        for (int q = 0; q < 4; q++) {
            __m256 v = _mm256_loadu_ps(p + 8 * q);
            gr |= (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(v, r, _CMP_GT_OQ)) << (8 * q);
            ga |= (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(v, a, _CMP_GT_OQ)) << (8 * q);
        }
        nr += __builtin_popcount(gr);
        na += __builtin_popcount(ga & w[j]);
    }
    *cr += nr, *ca += na;
    return j * 32;
}
#endif

/* count_pair's pass over two halves (a whole number of words each), the second on the helper thread where it
   is awake (run_halves; chain24): integer counts, the same whoever counts them. */
typedef struct {
    const float *x;
    const uint32_t *w;
    float vr, vw;
    Py_ssize_t n, mid, cr[2], ca[2];
} pair_halves;

static void pair_half(void *arg, int h) {
    pair_halves *t = (pair_halves *)arg;
    int s = h ? 1 : 0;
    Py_ssize_t from = s ? t->mid : 0, to = s ? t->n : t->mid, done = 0;
    t->cr[s] = 0, t->ca[s] = 0;
#ifdef KERNEL_AVX2
    if (kernel_fma) done = count_pair_avx2(t->x + from, t->w + from / 32, t->vr, t->vw, to - from, &t->cr[s], &t->ca[s]);
#endif
    count_pair_plain(t->x + from, t->w + from / 32, t->vr, t->vw, done, to - from, &t->cr[s], &t->ca[s]);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* count_pair's allowed count with the penalized tokens counted by their new logits (sampler_ranks, chain16):
   the ids of `changed` (int64 arrays; a token maybe in two, or twice in one), once each, those the mask allows:
   + (wk[id] > vw) - (x[id] > vw), as numpy's unique, bit test and two counts. 0, or -1 with an error set. */
static int count_changed(const float *x, const float *wk, const uint32_t *w, Py_ssize_t n, float vw,
                         PyObject *changed, Py_ssize_t *ca) {
    PyObject *seq = PySequence_Fast(changed, "count_pair: the changed ids must be a sequence of arrays");
    if (!seq) return -1;
    Py_ssize_t parts = PySequence_Fast_GET_SIZE(seq), m = 0, cap = 64, got = 0;
    int64_t local[64], *ids = local;
    int rc = 0;
    for (Py_ssize_t k = 0; k < parts && rc == 0; k++) {
        Py_buffer b;
        if (get_buf(PySequence_Fast_GET_ITEM(seq, k), &b, 0, 'q') < 0) {
            rc = -1;
            break;
        }
        Py_ssize_t len = b.shape[0];
        if (m + len > cap) {
            Py_ssize_t nc = (m + len) * 2;
            int64_t *ni = (int64_t *)malloc((size_t)nc * sizeof(int64_t));
            if (!ni) {
                PyErr_NoMemory();
                rc = -1;
            } else {
                memcpy(ni, ids, (size_t)m * sizeof(int64_t));
                if (ids != local) free(ids);
                ids = ni, cap = nc;
            }
        }
        if (rc == 0) memcpy(ids + m, b.buf, (size_t)len * sizeof(int64_t)), m += len;
        PyBuffer_Release(&b);
    }
    Py_DECREF(seq);
    if (rc == 0 && m > 1) qsort(ids, (size_t)m, sizeof(int64_t), cmp_i64); /* (np.unique's set: each id once) */
    for (Py_ssize_t j = 0; rc == 0 && j < m; j++) {
        int64_t i = ids[j];
        if (j > 0 && i == ids[j - 1]) continue;
        if (i < 0 || i >= n) {
            PyErr_SetString(PyExc_IndexError, "count_pair: a changed id out of range");
            rc = -1;
        } else if ((w[i >> 5] >> (i & 31)) & 1u) {
            got += (Py_ssize_t)(wk[i] > vw) - (Py_ssize_t)(x[i] > vw);
        }
    }
    if (ids != local) free(ids);
    if (rc == 0) *ca += got;
    return rc;
}

PyDoc_STRVAR(count_pair_doc,
             "count_pair(x, words, i, vw, work=None, changed=()) -> (n_raw, n_allowed): how many of float32 x exceed\n"
             "x[i], and how many of those the mask (uint32 words, bit i & 31 of word i >> 5) allows exceed float32 vw;\n"
             "one pass. `work` (float32, x's length) and `changed` (int64 id arrays): the allowed ids among the changed\n"
             "(once each) counted by work's logits instead of x's.");

static PyObject *py_count_pair(PyObject *self, PyObject *args) {
    PyObject *xo, *wo, *wko = Py_None, *changed = NULL;
    Py_ssize_t i, cr = 0, ca = 0;
    double vw;
    Py_buffer x, w, wk;
    if (!PyArg_ParseTuple(args, "OOnd|OO", &xo, &wo, &i, &vw, &wko, &changed)) return NULL;
    if (get_buf(xo, &x, 0, 'f') < 0) return NULL;
    if (PyObject_GetBuffer(wo, &w, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    int has_wk = wko != Py_None;
    if (has_wk && get_buf(wko, &wk, 0, 'f') < 0) {
        PyBuffer_Release(&w);
        PyBuffer_Release(&x);
        return NULL;
    }
    Py_ssize_t n = x.shape[0];
    if (i < 0 || i >= n) {
        PyErr_SetString(PyExc_IndexError, "index out of range");
    } else if (w.len % 4 || w.len / 4 < (n + 31) / 32) {
        PyErr_SetString(PyExc_ValueError, "count_pair: the mask must hold a bit a position");
    } else if (changed && changed != Py_None && (!has_wk || wk.shape[0] != n)) {
        PyErr_SetString(PyExc_ValueError, "count_pair: changed ids need work, x's length");
    } else {
        const float *xp = (const float *)x.buf;
        const uint32_t *wp = (const uint32_t *)w.buf;
        float vr = xp[i], va = (float)vw;
        pair_halves t = {xp, wp, vr, va, n, n >= 65536 ? (n / 2) & ~(Py_ssize_t)63 : n, {0, 0}, {0, 0}};
        if (t.mid < n) /* (a row long enough for two threads: Gemma's 262,144) */
            run_halves(pair_half, &t, n);
        else
            pair_half(&t, 0);
        cr = t.cr[0] + t.cr[1], ca = t.ca[0] + t.ca[1];
        if (changed && changed != Py_None) count_changed(xp, (const float *)wk.buf, wp, n, va, changed, &ca);
    }
    if (has_wk) PyBuffer_Release(&wk);
    PyBuffer_Release(&w);
    PyBuffer_Release(&x);
    if (PyErr_Occurred()) return NULL;
    return Py_BuildValue("(nn)", cr, ca);
}

static PyMethodDef constraint_methods[] = {
    {"take", py_take, METH_VARARGS, take_doc},
    {"draw_walk", py_draw_walk, METH_VARARGS, draw_walk_doc},
    {"top_among", py_top_among, METH_VARARGS, top_among_doc},
    {"count_pair", py_count_pair, METH_VARARGS, count_pair_doc},
    {"constraint_scan", py_constraint_scan, METH_VARARGS, constraint_scan_doc},
    {"set_threads", py_set_threads, METH_VARARGS, set_threads_doc},
    {"split_stats", py_split_stats, METH_NOARGS, split_stats_doc},
    {"split_backoff", py_split_backoff, METH_VARARGS, split_backoff_doc},
    {"wake", py_wake, METH_VARARGS, wake_doc},
    {"set_ahead", py_set_ahead, METH_VARARGS, set_ahead_doc},
    {NULL, NULL, 0, NULL},
};

static int add_pass_functions(PyObject *module); /* (the pass's, at the end of the file) */

static int add_constraint_functions(PyObject *module) {
    if (PyModule_AddFunctions(module, constraint_methods) < 0) return -1;
    return add_pass_functions(module);
}

/* ==== the pass: llama_decode with the event loop's wake-up made once the GIL is let go ========
 * (engine/_llama_ffi.py's `decode`, issue 25 item 0.) `loopchat serve` wakes its event loop for
 * the tokens a pass's batch carries (serve/handoff.py): an 8-byte write to an eventfd the loop
 * watches. Made from Python right before llama_decode's ctypes call, the woken loop's thread
 * reached the GIL before the call's conversions had let go of it, and slept again on the GIL's
 * condition or mutex (perf's sched_switch, the eleventh session). Here the GIL is let go first,
 * then the descriptor is written, then the pass runs and is waited for (llama_synchronize): the
 * woken loop finds the GIL free, and the pass's wait is in the same call. llama.cpp's three
 * functions are called by the addresses `llama_calls` gave (its shared library as
 * llama-cpp-python loaded it); the batch is llama.h's `struct llama_batch`, passed by value as
 * llama_decode takes it (its layout copied below: llama-cpp-python 0.3.36's, pinned). */
#include <unistd.h>

typedef struct {
    int32_t n_tokens;
    void *token, *embd, *pos, *n_seq_id, *seq_id, *logits;
} lc_batch;
typedef int32_t (*lc_decode_fn)(void *, lc_batch);
typedef void (*lc_sync_fn)(void *);
static lc_decode_fn lc_decode;
static lc_sync_fn lc_sync;

PyDoc_STRVAR(llama_calls_doc, "llama_calls(decode, synchronize) -> None: the addresses of llama_decode and\n"
             "llama_synchronize in the loaded llama.cpp (decode calls them).");

static PyObject *py_llama_calls(PyObject *self, PyObject *args) {
    unsigned long long d, s;
    if (!PyArg_ParseTuple(args, "KK", &d, &s)) return NULL;
    if (!d || !s) {
        PyErr_SetString(PyExc_ValueError, "a null address");
        return NULL;
    }
    lc_decode = (lc_decode_fn)(uintptr_t)d;
    lc_sync = (lc_sync_fn)(uintptr_t)s;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(decode_doc, "decode(ctx, batch, fd) -> int: the GIL let go; 8 bytes (a count of 1) written to fd\n"
             "when fd >= 0; llama_decode(ctx, *batch) (batch: the address of a struct llama_batch);\n"
             "llama_synchronize(ctx); llama_decode's return code.");

static PyObject *py_decode(PyObject *self, PyObject *args) {
    unsigned long long ctx, batch;
    int fd;
    if (!PyArg_ParseTuple(args, "KKi", &ctx, &batch, &fd)) return NULL;
    if (!lc_decode || !lc_sync || !ctx || !batch) {
        PyErr_SetString(PyExc_ValueError, "llama_calls first, and a context and a batch");
        return NULL;
    }
    lc_batch b = *(const lc_batch *)(uintptr_t)batch;
    void *c = (void *)(uintptr_t)ctx;
    int32_t rc;
    Py_BEGIN_ALLOW_THREADS if (fd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(fd, &one, sizeof one); /* (a full pipe: EAGAIN, the loop is woken anyway) */
        (void)w;
    }
    rc = lc_decode(c, b);
    lc_sync(c);
    Py_END_ALLOW_THREADS return PyLong_FromLong(rc);
}

/* Two small calls the loop makes every token, by the functions' addresses: as ctypes calls (argument
 * objects, libffi, the GIL let go and taken back) they cost 8-11 us each after a forward pass (the median;
 * 14-28 us the mean), the loop's memory cold. */
typedef float *(*lc_logits_fn)(void *, int32_t);
typedef _Bool (*lc_eog_fn)(const void *, int32_t);

/* The arguments of a call by address (logits_at, is_eog_at, piece_of): two addresses, neither null, and an
   int. 0, or -1 with the error set. */
static int address_args(PyObject *args, const char *name, unsigned long long *a, unsigned long long *b, int *i) {
    if (!PyArg_ParseTuple(args, "KKi", a, b, i)) return -1;
    if (!*a || !*b) {
        PyErr_Format(PyExc_ValueError, "%s: a null address", name);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(logits_at_doc, "logits_at(get_logits_ith, ctx, i) -> int | None: llama_get_logits_ith(ctx, i) (the function\n"
             "at that address)'s pointer as an int, None where it is null.");

static PyObject *py_logits_at(PyObject *self, PyObject *args) {
    unsigned long long fn, ctx;
    int i;
    if (address_args(args, "logits_at", &fn, &ctx, &i) < 0) return NULL;
    float *p = ((lc_logits_fn)(uintptr_t)fn)((void *)(uintptr_t)ctx, (int32_t)i);
    if (!p) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)p);
}

PyDoc_STRVAR(is_eog_at_doc, "is_eog_at(vocab_is_eog, vocab, t) -> bool: llama_vocab_is_eog(vocab, t) (the function at\n"
             "that address).");

static PyObject *py_is_eog_at(PyObject *self, PyObject *args) {
    unsigned long long fn, vocab;
    int t;
    if (address_args(args, "is_eog_at", &fn, &vocab, &t) < 0) return NULL;
    return PyBool_FromLong(((lc_eog_fn)(uintptr_t)fn)((const void *)(uintptr_t)vocab, (int32_t)t));
}

/* ==== the vocabulary's pieces for llguidance (issue 24: sampler_constraint.py's tokenizer) ==============
 * llguidance.llamacpp.lltokenizer_from_vocab reads each token's bytes (llama_token_to_piece, special
 * tokens rendered) and attributes in a Python loop of two ctypes calls a token: 0.18 s of its 0.34 on the
 * default model's 49,152 tokens, 1.2 s of its 2.0 on Gemma 3's 262,144, paid by a process's first
 * constrained reply. The same loop in C: the same bytes, a control token (or a user-defined one written
 * <...>) prefixed with 0xff as that function does. llama.cpp's functions by the addresses given. */
typedef int32_t (*lc_piece_fn)(const void *, int32_t, char *, int32_t, int32_t, _Bool);
typedef int (*lc_attr_fn)(const void *, int32_t);

PyDoc_STRVAR(vocab_pieces_doc,
             "vocab_pieces(vocab, to_piece, get_attr, n, control, user_defined) -> list of bytes: for tokens\n"
             "0..n-1 of the llama_vocab at `vocab`, llama_token_to_piece(vocab, t, buf, 16384, 0, true)'s bytes\n"
             "(the functions at the addresses to_piece and get_attr: llama_token_to_piece, llama_vocab_get_attr),\n"
             "prefixed with b'\\xff' where the attributes hold `control`, or `user_defined` and the bytes are\n"
             "<...>: llguidance.llamacpp.lltokenizer_from_vocab's tokens. ValueError where a piece does not fit.");

static PyObject *py_vocab_pieces(PyObject *self, PyObject *args) {
    unsigned long long vocab, fp, fa;
    Py_ssize_t n;
    int control, user_defined;
    if (!PyArg_ParseTuple(args, "KKKnii", &vocab, &fp, &fa, &n, &control, &user_defined)) return NULL;
    if (!vocab || !fp || !fa || n < 0) {
        PyErr_SetString(PyExc_ValueError, "vocab_pieces: a null address or a negative count");
        return NULL;
    }
    lc_piece_fn to_piece = (lc_piece_fn)(uintptr_t)fp;
    lc_attr_fn get_attr = (lc_attr_fn)(uintptr_t)fa;
    const void *v = (const void *)(uintptr_t)vocab;
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    enum { LEN = 16384 };
    char *buf = malloc(LEN + 1);
    if (!buf) {
        Py_DECREF(out);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t t = 0; t < n; t++) {
        int32_t k = to_piece(v, (int32_t)t, buf + 1, LEN, 0, 1);
        if (k < 0 || k > LEN) {
            PyErr_Format(PyExc_ValueError, "vocab_pieces: token %zd does not fit %d bytes (%d)", t, (int)LEN, (int)k);
            break;
        }
        int a = get_attr(v, (int32_t)t);
        int special = (a & control) || ((a & user_defined) && k >= 2 && buf[1] == '<' && buf[k] == '>');
        buf[0] = (char)0xff;
        PyObject *b = special ? PyBytes_FromStringAndSize(buf, k + 1) : PyBytes_FromStringAndSize(buf + 1, k);
        if (!b) break;
        PyList_SET_ITEM(out, t, b);
    }
    free(buf);
    if (PyErr_Occurred()) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

PyDoc_STRVAR(piece_of_doc,
             "piece_of(vocab, to_piece, t) -> bytes: llama_token_to_piece(vocab, t, buf, len, 0, true)'s bytes (the\n"
             "function at the address to_piece), special tokens spelled out: one call where ctypes' buffer and\n"
             "binding cost ~15 us a token after a forward pass. b'' where llama.cpp reports an error.");

static PyObject *py_piece_of(PyObject *self, PyObject *args) {
    unsigned long long vocab, fp;
    int t;
    if (address_args(args, "piece_of", &vocab, &fp, &t) < 0) return NULL;
    lc_piece_fn to_piece = (lc_piece_fn)(uintptr_t)fp;
    char local[256];
    int32_t k = to_piece((const void *)(uintptr_t)vocab, (int32_t)t, local, (int32_t)sizeof local, 0, 1);
    if (k >= 0 && k <= (int32_t)sizeof local) return PyBytes_FromStringAndSize(local, k);
    if (k > INT32_MIN && -k > (int32_t)sizeof local) { /* (the piece needs -k bytes) */
        char *buf = malloc((size_t)-k);
        if (!buf) return PyErr_NoMemory();
        int32_t k2 = to_piece((const void *)(uintptr_t)vocab, (int32_t)t, buf, -k, 0, 1);
        PyObject *b = k2 >= 0 && k2 <= -k ? PyBytes_FromStringAndSize(buf, k2) : NULL;
        free(buf);
        return b ? b : PyBytes_FromStringAndSize("", 0);
    }
    return PyBytes_FromStringAndSize("", 0); /* (an error llama.cpp reports: no bytes, as the ctypes call gives) */
}

static PyMethodDef pass_methods[] = {
    {"llama_calls", py_llama_calls, METH_VARARGS, llama_calls_doc},
    {"decode", py_decode, METH_VARARGS, decode_doc},
    {"logits_at", py_logits_at, METH_VARARGS, logits_at_doc},
    {"is_eog_at", py_is_eog_at, METH_VARARGS, is_eog_at_doc},
    {"vocab_pieces", py_vocab_pieces, METH_VARARGS, vocab_pieces_doc},
    {"piece_of", py_piece_of, METH_VARARGS, piece_of_doc},
    {NULL, NULL, 0, NULL},
};

static int add_pass_functions(PyObject *module) { return PyModule_AddFunctions(module, pass_methods); }
