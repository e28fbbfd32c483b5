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

KERNEL_CLONES
static void exp_many(const double *x, double *out, Py_ssize_t n) {
#pragma omp simd
    for (Py_ssize_t i = 0; i < n; i++) out[i] = kexp(x[i]);
}

/* q[i] = exp(double(src[i]) - shift) (stored if q is not NULL); returns their sum. */
KERNEL_CLONES
static double exp_sum_f32(const float *src, double shift, double *q, Py_ssize_t n) {
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
    BLOCK_BODY((double)x[i], w[i] = e)
}

KERNEL_CLONES
static double block_f32_sums(const float *x, double shift, double t, Py_ssize_t n, double *wz) {
    BLOCK_BODY((double)x[i], (void)0)
}

KERNEL_CLONES
static double block_f64(const double *x, double shift, double t, double *w, Py_ssize_t n, double *wz) {
    BLOCK_BODY(x[i], w[i] = e)
}

KERNEL_CLONES
static double block_f64_sums(const double *x, double shift, double t, Py_ssize_t n, double *wz) {
    BLOCK_BODY(x[i], (void)0)
}

/* The sum of exp(z[i]). */
KERNEL_CLONES
static double sum_exp_f64(const double *z, Py_ssize_t n) {
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
#endif

/* top-p's bins: idx[i] = (int)min((x[i] - lo) * scale, top), every step in float32 as
   numpy does it (truncated as numpy's cast), and hist[b] the sum of q over bin b, added in
   order as np.bincount does (the same sums, bit for bit). */
KERNEL_CLONES
static void bin_index(const float *x, float lo, float scale, float top, int32_t *idx, Py_ssize_t n) {
#pragma omp simd
    for (Py_ssize_t i = 0; i < n; i++) {
        float v = (x[i] - lo) * scale;
        idx[i] = (int32_t)(v < top ? v : top);
    }
}

static void bin_sums(const int32_t *idx, const double *q, double *hist, Py_ssize_t bins, Py_ssize_t n) {
    memset(hist, 0, (size_t)bins * sizeof(double));
    for (Py_ssize_t i = 0; i < n; i++) hist[idx[i]] += q[i];
}

/* How many of x are greater than v. */
KERNEL_CLONES
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
        Py_BEGIN_ALLOW_THREADS for (Py_ssize_t j = 0; j < nb; j++) {
            Py_ssize_t first = j * block, m = n - first < block ? n - first : block;
            const float *x32 = (const float *)x.buf + first;
            const double *x64 = (const double *)x.buf + first;
            double s;
            if (wp)
                s = f32 ? block_f32(x32, shift, t, wp + first, m, &wz) : block_f64(x64, shift, t, wp + first, m, &wz);
            else
                s = f32 ? block_f32_sums(x32, shift, t, m, &wz) : block_f64_sums(x64, shift, t, m, &wz);
            bp[j] = s;
            norm += s;
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    if (store) PyBuffer_Release(&w);
    PyBuffer_Release(&b);
    if (PyErr_Occurred()) return NULL;
    return Py_BuildValue("(dd)", norm, wz);
}

PyDoc_STRVAR(min_p_doc,
             "min_p(src, floor, shift, ids, z) -> (k, mass): the k positions i of float32 src with\n"
             "float64(src[i]) >= floor, in order, into ids[:k] (int64), z[:k] = float64(src[i]) - shift,\n"
             "and mass the sum of exp(z[:k]).");

static PyObject *py_min_p(PyObject *self, PyObject *args) {
    PyObject *so, *io, *zo;
    double floor_, shift;
    Py_buffer s, ib, zb;
    if (!PyArg_ParseTuple(args, "OddOO", &so, &floor_, &shift, &io, &zo)) return NULL;
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
    Py_ssize_t n = s.shape[0], k = 0;
    double *z = (double *)zb.buf;
    if (check_len(&ib, n) == 0 && check_len(&zb, n) == 0) {
        const float *src = (const float *)s.buf;
        int64_t *ids = (int64_t *)ib.buf;
        Py_BEGIN_ALLOW_THREADS for (Py_ssize_t i = 0; i < n; i++) {
            double v = (double)src[i];
            if (v >= floor_) {
                ids[k] = i;
                z[k] = v - shift;
                k++;
            }
        }
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
    return Py_BuildValue("(nd)", k, mass);
}

PyDoc_STRVAR(count_greater_doc, "count_greater(x, i) -> int: how many entries of x (float32 or float64) exceed x[i].");

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
    if (x.itemsize == 4) {
        const float *p = (const float *)x.buf;
        c = count_greater_f32(p, p[i], n);
    } else {
        const double *p = (const double *)x.buf;
        c = count_greater_f64(p, p[i], n);
    }
    PyBuffer_Release(&x);
    return PyLong_FromSsize_t(c);
}

static Py_ssize_t at_least(const float *x, float v, int64_t *ids, Py_ssize_t n) {
#ifdef KERNEL_AVX2
    if (__builtin_cpu_supports("avx2")) return at_least_avx2(x, v, ids, n);
#endif
    return at_least_f32(x, v, ids, n);
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

static PyMethodDef methods[] = {
    {"exp", py_exp, METH_VARARGS, exp_doc},
    {"exp_sum", py_exp_sum, METH_VARARGS, exp_sum_doc},
    {"distribution", py_distribution, METH_VARARGS, distribution_doc},
    {"min_p", py_min_p, METH_VARARGS, min_p_doc},
    {"count_greater", py_count_greater, METH_VARARGS, count_greater_doc},
    {"at_least", py_at_least, METH_VARARGS, at_least_doc},
    {"bin_masses", py_bin_masses, METH_VARARGS, bin_masses_doc},
    {"bin_split", py_bin_split, METH_VARARGS, bin_split_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sampler_kernel",
                                    "The sampler's float64 passes over the vocabulary, fused (see the C file).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__sampler_kernel(void) { return PyModule_Create(&module); }
