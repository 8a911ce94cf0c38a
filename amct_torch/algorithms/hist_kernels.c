/* Fused CPU histogram kernels of the observers' update, loaded by
 * amct_torch/algorithms/native.py (which falls back to the same formulas in torch ops).
 *
 * Why C: a histogram needs a scatter per element. With torch ops every step (scale, shift,
 * truncate, offset, count) is a separate pass over memory and the scatter (index_add_) runs
 * on one thread. Here an element is read once: a block of 1024 values gets its bins (and
 * offsets, flags, extremes) in SIMD registers, then the block's scatter runs from L1; the
 * caller splits the data over threads, one private histogram each.
 *
 * SIMD: GCC/clang vector extensions. The slice kernels are written once (the second half of
 * this file) and compiled twice by including the file into itself: with 4 lanes (SSE2, NEON:
 * every CPU of the architecture) and, on x86-64, with 8 lanes for AVX2; amct_set_isa picks
 * one at run time, so one build runs on any CPU. The scatter loads eight bins before their
 * eight updates, so independent read-modify-writes overlap.
 *
 * Bit-exactness with the torch path: the same float32 operations in the same order, compiled
 * with -ffp-contract=off (a fused multiply-add would round once instead of twice). Results
 * are integers, so they do not depend on how the data was split or on the vector width.
 *
 * Repeated bins: post-ReLU activations are often half exact zeros, so one bin would take
 * every other increment and each increment would wait for the previous one. Exact zeros are
 * sent to eight rotating trash slots after the real ones and added to the zero's bin once at
 * the end. Buffers therefore have slots + AMCT_TRASH entries; the trash is left as garbage.
 */
#ifndef AMCT_LANES                 /* ---------------- the file proper ---------------- */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define BLOCK 1024                 /* a multiple of every vector width */
#define AMCT_TRASH 8
#define AMCT_DST 256               /* HFMG destination bins (SPEC §5.3) */
#define AMCT_AHEAD 8               /* blocks prefetched ahead (+5–10 % on data not in cache) */
#define AMCT_SAMPLE 4096           /* sample of a large selection (kth_value) */
#define AMCT_INLINE static inline __attribute__((always_inline))
#define AMCT_CAT_(a, b) a##b
#define AMCT_CAT(a, b) AMCT_CAT_(a, b)

/* x86-64: the AVX2 build of the slices and the SSE/AVX min/max instructions. AMCT_PORTABLE
 * compiles what other architectures get (4 lanes, compare-and-select), for the tests. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(AMCT_PORTABLE)
#define AMCT_X86 1
#else
#define AMCT_X86 0
#endif
#define AMCT_HAVE_AVX2 AMCT_X86
#if AMCT_X86
#include <immintrin.h>
#endif

/* The packed entry of one value on the streaming-IFMR grid: u = v·s − base (float32, two
 * roundings), bin *j = trunc(u) (u ≥ 0 inside the frame), offset q = trunc((u − j)·65536 + ½)
 * (float32); the entry q + 2^offset_bits packs the offset in 2^-16 bin units (low bits) and
 * the count (high bits) into one integer add — one add of a constant per value in the
 * scatter (a shift by a run-time count is 2–3 µops on x86). Written out again in the
 * vectorised slices (which also handle values outside the frame); used as is for the zeros. */
static int64_t stream_entry(float v, float s, float base, int64_t offset_bits, int32_t* j) {
    float u = v * s;
    u = u - base;
    *j = (int32_t)u;
    float f = u - (float)*j;
    f = f * 65536.0f;
    f = f + 0.5f;
    return (int64_t)(int32_t)f + ((int64_t)1 << offset_bits);
}

/* HFMG bin of one value: min(trunc((v − mn)/w), last), float32 maths. */
static int32_t hfmg_bin(float v, float mn, float w, int32_t last) {
    float t = v - mn;
    t = t / w;
    int32_t j = (int32_t)t;
    return j < last ? j : last;
}

/* Add a block's packed entries, eight bins loaded before their eight updates, sixteen a
 * loop turn (the loop's own instructions are a tenth of the scatter's at eight). */
AMCT_INLINE void scatter_packed(int64_t* acc, const int32_t* jb, const int32_t* qb, int m, int64_t one) {
    int i = 0;
    for (; i + 16 <= m; i += 16) {
        int32_t j[16];
        int64_t e[16];
        for (int k = 0; k < 8; ++k) {
            j[k] = jb[i + k];
            e[k] = (int64_t)qb[i + k] + one;
        }
        for (int k = 0; k < 8; ++k) acc[j[k]] += e[k];
        for (int k = 8; k < 16; ++k) {
            j[k] = jb[i + k];
            e[k] = (int64_t)qb[i + k] + one;
        }
        for (int k = 8; k < 16; ++k) acc[j[k]] += e[k];
    }
    for (; i < m; ++i) acc[jb[i]] += (int64_t)qb[i] + one;
}

/* Count a block's bins, likewise (int32 counts of one slice: a smaller histogram to keep
 * in cache, 15 % faster here than int64). */
AMCT_INLINE void scatter_count(int32_t* cnt, const int32_t* jb, int m) {
    int i = 0;
    for (; i + 8 <= m; i += 8) {
        int32_t j[8];
        for (int k = 0; k < 8; ++k) j[k] = jb[i + k];
        for (int k = 0; k < 8; ++k) cnt[j[k]] += 1;
    }
    for (; i < m; ++i) cnt[jb[i]] += 1;
}

/* The slice kernels, once per vector width (see the second half of the file). */
#define AMCT_LANES 4
#include "hist_kernels.c"
#undef AMCT_LANES
#if AMCT_HAVE_AVX2
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#define AMCT_LANES 8
#include "hist_kernels.c"
#undef AMCT_LANES
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

/* −1: not chosen yet; 0: 4 lanes; 1: AVX2 8 lanes */
static int amct_isa = -1;

/* Choose the vector width: want 0 asks for the 4-lane code, anything else for the widest the
 * CPU has. Returns the choice in use (0: 4 lanes, 1: AVX2). The tests run both widths against
 * the same references. */
int amct_set_isa(int want) {
    int avx2 = 0;
#if AMCT_HAVE_AVX2
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
#endif
    amct_isa = want == 0 ? 0 : avx2;
    return amct_isa;
}

static int wide(void) {
    if (amct_isa < 0) amct_set_isa(-1);
    return amct_isa;
}

/* One streaming-IFMR update on the current frame, fused: the packed histogram (stream_entry;
 * the caller bounds n so that no field overflows) plus the values that can enter the exact
 * top/bottom buffers (v > thr_hi into cand[0..cap], v < thr_lo into cand[cap+1..2cap+1];
 * every qualifying value is counted, stored while there is room; infinite thresholds give a
 * plain histogram).
 * Elements outside the frame (or NaN/Inf) are not binned but counted: then the caller throws
 * the result away and takes the general path. res = {n_hi, n_lo, outside}; ext = {min, max}
 * of the values (NaN left out). */
void amct_stream_update(const float* x, int64_t n, float s, float base, int64_t slots,
                        int64_t offset_bits, int64_t* acc, float thr_hi, float thr_lo,
                        float* cand, int64_t cap, int64_t* res, float* ext) {
#if AMCT_HAVE_AVX2
    if (wide()) {
        stream_slice8(x, n, s, base, slots, offset_bits, acc, thr_hi, thr_lo, cand, cap, res, ext);
        return;
    }
#endif
    stream_slice4(x, n, s, base, slots, offset_bits, acc, thr_hi, thr_lo, cand, cap, res, ext);
}

/* HFMG bins of [mn, mx] with bin width w: j = min(trunc((x − mn)/w), nbins − 1), float32
 * maths, into cnt int32 [nbins + AMCT_TRASH] (n < 2^31); res = {non-zero if a value lies outside
 * [mn, mx] or is NaN, NaN count}. When a value lies outside, the batch widens the range and
 * the caller histograms it again on the union (SPEC §5.3): the counts are then incomplete, and
 * ext = {min, max} of the values from the first block with one outside on (NaN left out) —
 * the values before lie inside [mn, mx], so the union of [mn, mx] and ext is the union with
 * the batch's range. With mn > mx (no range yet) the call is a pure min/max pass. */
void amct_hfmg_hist(const float* x, int64_t n, float mn, float mx, float w, int64_t nbins,
                    int32_t* cnt, float* ext, int64_t* res) {
#if AMCT_HAVE_AVX2
    if (wide()) {
        hfmg_slice8(x, n, mn, mx, w, nbins, cnt, ext, res);
        return;
    }
#endif
    hfmg_slice4(x, n, mn, mx, w, nbins, cnt, ext, res);
}

/* a before b in the order of a top buffer (desc: descending) or a bottom one (ascending). */
static int before(float a, float b, int desc) {
    return desc ? a > b : a < b;
}

/* Hoare partition of a[lo..hi] around the median of three (desc: descending order): on
 * return a[lo..*j] come before or tie the pivot, a[*i..hi] after or tie it, and a[*j+1..*i-1]
 * equal it. NaN-free input. */
static void partition(float* a, int64_t lo, int64_t hi, int desc, int64_t* ip, int64_t* jp) {
    float x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi];
    float pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
    int64_t i = lo, j = hi;
    while (i <= j) {
        while (before(a[i], pivot, desc)) ++i;
        while (before(pivot, a[j], desc)) --j;
        if (i <= j) {
            float t = a[i];
            a[i] = a[j];
            a[j] = t;
            ++i;
            --j;
        }
    }
    *ip = i;
    *jp = j;
}

/* Sort a[lo..hi] (desc: descending, else ascending): quicksort on the smaller side first
 * (depth ≤ log2 n), insertion sort below 16 elements. NaN-free input. */
static void sort_floats(float* a, int64_t lo, int64_t hi, int desc) {
    while (hi - lo >= 16) {
        int64_t i, j;
        partition(a, lo, hi, desc, &i, &j);
        if (j - lo < hi - i) {
            sort_floats(a, lo, j, desc);
            lo = i;
        } else {
            sort_floats(a, i, hi, desc);
            hi = j;
        }
    }
    for (int64_t i = lo + 1; i <= hi; ++i) {
        const float v = a[i];
        int64_t j = i - 1;
        while (j >= lo && before(v, a[j], desc)) {
            a[j + 1] = a[j];
            --j;
        }
        a[j + 1] = v;
    }
}

/* Sort a[0..m) (desc: descending, else ascending) by LSD radix on the float bits mapped to
 * integers of the same order (sign bit flipped; all bits for negatives): four byte passes,
 * each skipped when every key has the same byte (the exponent byte often is). A quicksort
 * of the ~1000 values a first batch brings to the top buffer costs ~25 µs with its
 * mispredicted comparisons; this ~4 µs. tmp: 2·m scratch keys. −0.0 and +0.0 (equal
 * values) may come out in either order. NaN-free input. */
static void radix_sort_floats(float* a, int64_t m, int desc, uint32_t* tmp) {
    uint32_t* key = tmp;
    uint32_t* alt = tmp + m;
    uint32_t hist[4][256];
    memset(hist, 0, sizeof hist);
    for (int64_t i = 0; i < m; ++i) {
        uint32_t b;
        memcpy(&b, a + i, sizeof b);
        b ^= (b >> 31) ? 0xFFFFFFFFu : 0x80000000u;       /* ascending float order */
        if (desc) b = ~b;
        key[i] = b;
        for (int p = 0; p < 4; ++p) hist[p][(b >> (8 * p)) & 255] += 1;
    }
    for (int p = 0; p < 4; ++p) {
        const int shift = 8 * p;
        if (hist[p][(key[0] >> shift) & 255] == (uint32_t)m) continue;   /* one byte value */
        uint32_t pos[256], run = 0;
        for (int d = 0; d < 256; ++d) {
            pos[d] = run;
            run += hist[p][d];
        }
        for (int64_t i = 0; i < m; ++i) alt[pos[(key[i] >> shift) & 255]++] = key[i];
        uint32_t* t = key;
        key = alt;
        alt = t;
    }
    for (int64_t i = 0; i < m; ++i) {
        uint32_t b = desc ? ~key[i] : key[i];
        b ^= (b >> 31) ? 0x80000000u : 0xFFFFFFFFu;       /* back to the float's bits */
        memcpy(a + i, &b, sizeof b);
    }
}

/* The k-th largest (desc) or smallest (!desc) of a[0..n), 1 ≤ k ≤ n, by quickselect; a is
 * reordered. No NaN in a. When k values tie at the extreme (the minima of post-ReLU groups
 * are mostly 0) that extreme is the answer, found in one pass (quickselect on equal values
 * costs n·log n swaps). */
static float kth_value(float* a, int64_t n, int64_t k, int desc) {
    float ext = a[0];
    for (int64_t i = 1; i < n; ++i)
        if (before(a[i], ext, desc)) ext = a[i];
    int64_t ties = 0;
    for (int64_t i = 0; i < n; ++i) ties += a[i] == ext;
    if (ties >= k) return ext;
    if (n >= 4 * AMCT_SAMPLE && k <= n / 16) {
        /* k small against n (the first batch's K-th of ~10^5–10^6 group extremes): a
         * threshold t from a sample — its value at twice the sample's share of k, plus a
         * margin — keeps the values at or before t in one pass; when k of them remain, the
         * k-th value of a is the k-th of those (exact whatever the sample), else the
         * plain quickselect below. */
        float smp[AMCT_SAMPLE];
        const int64_t stride = n / AMCT_SAMPLE;
        for (int64_t i = 0; i < AMCT_SAMPLE; ++i) smp[i] = a[i * stride];
        int64_t ks = 2 * k * AMCT_SAMPLE / n + 16;
        ks = ks > AMCT_SAMPLE ? AMCT_SAMPLE : ks;
        const float t = kth_value(smp, AMCT_SAMPLE, ks, desc);
        int64_t kept = 0;
        for (int64_t i = 0; i < n; ++i) {          /* keep a[i] when it does not come after t */
            const float v = a[i];
            const int keep = !before(t, v, desc);
            a[i] = a[kept];
            a[kept] = v;
            kept += keep;
        }
        if (kept >= k) return kth_value(a, kept, k, desc);
    }
    int64_t lo = 0, hi = n - 1;
    const int64_t target = k - 1;
    while (lo < hi) {
        int64_t i, j;
        partition(a, lo, hi, desc, &i, &j);
        if (target <= j) hi = j;
        else if (target >= i) lo = i;
        else return a[target];
    }
    return a[target];
}

/* Fold c candidates into buf, the k largest values seen sorted descending (largest) or the
 * k smallest ascending (!largest): the values of topk(cat(buf, cand), k). A few go in by binary
 * search and a shift each; more are cut to the k best (quickselect), sorted and merged. cand
 * is reordered (scratch). NaN-free input. Returns 0, or −1 when out of memory. */
int32_t amct_insert_extremes(float* buf, int64_t k, float* cand, int64_t c, int32_t largest) {
    int64_t m = 0;                             /* the candidates that enter at all, compacted */
    for (int64_t i = 0; i < c; ++i) {
        cand[m] = cand[i];
        m += before(cand[i], buf[k - 1], largest);
    }
    if (m <= 8) {
        for (int64_t i = 0; i < m; ++i) {
            const float v = cand[i];
            if (!before(v, buf[k - 1], largest)) continue;
            int64_t lo = 0, hi = k - 1;        /* first position whose value v beats */
            while (lo < hi) {
                int64_t mid = lo + (hi - lo) / 2;
                if (before(v, buf[mid], largest)) hi = mid; else lo = mid + 1;
            }
            memmove(buf + lo + 1, buf + lo, sizeof(float) * (size_t)(k - 1 - lo));
            buf[lo] = v;
        }
        return 0;
    }
    if (m > k) {
        kth_value(cand, m, k, largest);        /* the k best first (unordered) */
        m = k;
    }
    float* out = (float*)malloc(sizeof(float) * (size_t)k + sizeof(uint32_t) * 2 * (size_t)m);
    if (!out) return -1;
    if (m >= 64) radix_sort_floats(cand, m, largest, (uint32_t*)(out + k));
    else sort_floats(cand, 0, m - 1, largest);
    int64_t i = 0, j = 0;
    for (int64_t o = 0; o < k; ++o)
        out[o] = (j < m && (i >= k || before(cand[j], buf[i], largest))) ? cand[j++] : buf[i++];
    memcpy(buf, out, sizeof(float) * (size_t)k);
    free(out);
    return 0;
}

/* The first batch's bounds for the top/bottom buffers of streaming IFMR: x cut into groups
 * of `group` values (group_extremes over the whole super-blocks, on nt threads; the rest in
 * contiguous groups), their extremes into the scratch hi/lo (n/group + 8 each), then
 * res = {max, min, k-th largest group maximum, k-th smallest group minimum} of x and
 * *nan = the NaN count. k groups each hold a value ≥ the k-th largest maximum, so the
 * batch's top k lie at or above it, and fewer than k groups hold values above it
 * (IfmrStreamingObserver._fold_bounds). With fewer than k groups res[2..3] are ∓inf (no bound). */
void amct_chunk_bounds(int32_t nt, const float* x, int64_t n, int64_t group, int64_t k, float* hi, float* lo,
                       float* res, int64_t* nan) {
    const int w = wide();
    const int64_t lanes = w ? 8 : 4;
    const int64_t nsb = n / (group * lanes);              /* whole super-blocks */
    int64_t nans = 0;
    #pragma omp parallel for num_threads(nt) schedule(static) reduction(+:nans)
    for (int32_t t = 0; t < nt; ++t) {
        const int64_t b0 = nsb * t / nt, b1 = nsb * (t + 1) / nt;
#if AMCT_HAVE_AVX2
        if (w) nans += group_extremes8(x, group, b0, b1, hi, lo);
        else
#endif
        nans += group_extremes4(x, group, b0, b1, hi, lo);
    }
    int64_t ng = nsb * lanes;
    for (int64_t st = nsb * group * lanes; st < n; st += group, ++ng) {   /* the rest */
        float l = INFINITY, h = -INFINITY;
        int64_t m = n - st < group ? n - st : group;
        for (int64_t i = 0; i < m; ++i) {
            const float v = x[st + i];
            nans += v != v;
            if (v < l) l = v;
            if (v > h) h = v;
        }
        hi[ng] = h;
        lo[ng] = l;
    }
    float mx = -INFINITY, mn = INFINITY;
    for (int64_t g = 0; g < ng; ++g) {
        if (hi[g] > mx) mx = hi[g];
        if (lo[g] < mn) mn = lo[g];
    }
    res[0] = mx;
    res[1] = mn;
    res[2] = -INFINITY;
    res[3] = INFINITY;
    *nan = nans;
    if (ng >= k && k > 0 && !nans) {
        res[2] = kth_value(hi, ng, k, 1);
        res[3] = kth_value(lo, ng, k, 0);
    }
}

/* Multi-threaded entry points: slice t < np of x, x[bounds[t] .. bounds[t+1]), into its own
 * buffers (zeroed first), on nt threads; the HFMG counts are added to `into` (when given) if
 * every value lay inside the range.
 * Built with -fopenmp they run on the process's OpenMP pool — in a torch process the same
 * libgomp and the same worker threads as torch's own kernels (which keep spinning between
 * parallel regions, so a separate thread pool would fight them for the cores). Built
 * without OpenMP the pragmas are ignored and the slices run one after the other. */
void amct_stream_update_mt(int32_t np, int32_t nt, const float* x, const int64_t* bounds, float s, float base,
                           int64_t slots, int64_t offset_bits, int64_t* acc, int64_t acc_stride,
                           float thr_hi, float thr_lo, float* cand, int64_t cap, int64_t* res, float* ext) {
    wide();
    #pragma omp parallel for num_threads(nt) schedule(static, 1)
    for (int32_t t = 0; t < np; ++t) {
        memset(acc + t * acc_stride, 0, sizeof(int64_t) * acc_stride);
        amct_stream_update(x + bounds[t], bounds[t + 1] - bounds[t], s, base, slots, offset_bits,
                           acc + t * acc_stride, thr_hi, thr_lo, cand + t * 2 * (cap + 1), cap, res + 3 * t,
                           ext + 2 * t);
    }
}

void amct_hfmg_hist_mt(int32_t np, int32_t nt, const float* x, const int64_t* bounds, float mn, float mx,
                       float w, int64_t nbins, int32_t* cnt, int64_t cnt_stride, float* ext, int64_t* res,
                       int64_t* into) {
    wide();
    #pragma omp parallel for num_threads(nt) schedule(static, 1)
    for (int32_t t = 0; t < np; ++t) {
        memset(cnt + t * cnt_stride, 0, sizeof(int32_t) * cnt_stride);
        amct_hfmg_hist(x + bounds[t], bounds[t + 1] - bounds[t], mn, mx, w, nbins, cnt + t * cnt_stride,
                       ext + 2 * t, res + 2 * t);
    }
    int64_t outside = 0;
    for (int32_t t = 0; t < np; ++t) outside |= res[2 * t];
    if (into && !outside)                 /* the counts of every slice, added to the state */
        for (int32_t t = 0; t < np; ++t)
            for (int64_t j = 0; j < nbins; ++j) into[j] += cnt[t * cnt_stride + j];
}

/* Decode packed accumulators (np rows of `stride`, the first `slots` used) and add them to a
 * state: counts += Σ high fields; dsum += (Σ low fields)·2^-16, the integer sums taken first
 * so that the result does not depend on the slicing (the same arithmetic as
 * histogram.add_packed). Slot blocks on nt threads. */
void amct_add_packed(int32_t np, const int64_t* acc, int64_t stride, int64_t slots, int64_t offset_bits,
                     int64_t* counts, double* dsum, int32_t nt) {
    const int w = wide();
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t j0 = 0; j0 < slots; j0 += BLOCK) {      /* slot blocks: contiguous rows */
        const int m = (int)(slots - j0 < BLOCK ? slots - j0 : BLOCK);
#if AMCT_HAVE_AVX2
        if (w) add_packed_block8(np, acc + j0, stride, m, offset_bits, counts + j0, dsum + j0);
        else
#endif
        add_packed_block4(np, acc + j0, stride, m, offset_bits, counts + j0, dsum + j0);
    }
}

/* The streaming histogram's frame for the range [gmin, gmax] (histogram.frame_for, the same
 * double arithmetic): the smallest exponent e ≥ max(min_exp, exponent(max |x|) − 1 − rel_bits)
 * whose grid of bin width 2^e holds the range in nbins bins; base = floor(gmin·2^−e). With
 * e_floor > e (a state that has data), e_floor and its base (the frame never gets finer:
 * IfmrStreamingObserver._frame_for). */
void amct_frame_for(double gmin, double gmax, int64_t nbins, int64_t rel_bits, int64_t min_exp,
                    int64_t e_floor, int64_t* out) {
    const double maxabs = fmax(fabs(gmin), fabs(gmax));
    int ex;
    int64_t e = min_exp;
    if (maxabs != 0.0) {
        frexp(maxabs, &ex);
        if (ex - 1 - rel_bits > e) e = ex - 1 - rel_bits;
    }
    const double span = gmax - gmin;
    if (span > 0.0) {
        frexp(span / (double)nbins, &ex);
        if (ex - 1 > e) e = ex - 1;
    }
    while (floor(ldexp(gmax, (int)-e)) - floor(ldexp(gmin, (int)-e)) > (double)(nbins - 1)) ++e;
    if (e < e_floor) e = e_floor;
    out[0] = e;
    out[1] = (int64_t)floor(ldexp(gmin, (int)-e));
}

/* A steady streaming-IFMR update in one call: amct_stream_update_mt, then — when no value
 * left the frame (e, base), no slice overflowed, the range grown by the batch keeps that
 * frame (amct_frame_for of the state's nbins, rel_bits, min_exp, the frame's e as floor) and
 * each side has at most insert_max candidates — the commit: the candidates folded into
 * top/bottom (k each, amct_insert_extremes), the accumulators decoded into counts/dsum
 * (amct_add_packed on nt_decode threads), and out = {new k-th top value, new k-th bottom
 * value, new gmin, new gmax}. Returns 1 when committed, 0 when not (the state untouched, the
 * pass's results in the buffers for the caller), −1 when out of memory mid-commit. */
int32_t amct_stream_step(int32_t np, int32_t nt, const float* x, const int64_t* bounds, float s, float base,
                         int64_t slots, int64_t offset_bits, int64_t* acc, int64_t acc_stride,
                         float thr_hi, float thr_lo, float* cand, int64_t cap, int64_t* res, float* ext,
                         float gmin, float gmax, int64_t e, int64_t nbins, int64_t rel_bits, int64_t min_exp,
                         int64_t insert_max, float* top, float* bottom, int64_t k,
                         int64_t* counts, double* dsum, int32_t nt_decode, float* out) {
    amct_stream_update_mt(np, nt, x, bounds, s, base, slots, offset_bits, acc, acc_stride, thr_hi, thr_lo,
                          cand, cap, res, ext);
    int64_t n_hi = 0, n_lo = 0;
    float lo = gmin, hi = gmax;
    for (int32_t t = 0; t < np; ++t) {
        if (res[3 * t + 2] || res[3 * t] > cap || res[3 * t + 1] > cap) return 0;
        if (ext[2 * t] < lo) lo = ext[2 * t];
        if (ext[2 * t + 1] > hi) hi = ext[2 * t + 1];
        n_hi += res[3 * t];
        n_lo += res[3 * t + 1];
    }
    if (n_hi > insert_max || n_lo > insert_max) return 0;
    if (lo < gmin || hi > gmax) {              /* a wider range: does the frame stay? */
        int64_t frame[2];
        amct_frame_for(lo, hi, nbins, rel_bits, min_exp, e, frame);
        if (frame[0] != e || (double)frame[1] != (double)base) return 0;
    }
    for (int32_t t = 0; t < np; ++t) {
        float* c = cand + t * 2 * (cap + 1);
        if (amct_insert_extremes(top, k, c, res[3 * t], 1) || amct_insert_extremes(bottom, k, c + cap + 1, res[3 * t + 1], 0))
            return -1;
    }
    amct_add_packed(np, acc, acc_stride, slots, offset_bits, counts, dsum, nt_decode);
    out[0] = top[k - 1];
    out[1] = bottom[k - 1];
    out[2] = lo;
    out[3] = hi;
    return 1;
}

/* HFMG: analytic L2 loss of every candidate range (SPEC §5.3 step 3), the formula of
 * hfmg.losses evaluated per candidate in registers instead of as ~45 passes over
 * [candidates, 257] tensors. pref: int64 [3][n + 1] prefix sums of c_j, c_j·j, c_j·j²;
 * cnt: int64 [n + 1] counts with cnt[n] = 0. In source-bin units, destination bin d of
 * candidate (l, r) spans [y_d, y_{d+1}), y_k = l + k·D, D = (r − l + 1)/256, y_0 = 0,
 * y_256 = n; centre c = l + (d + ½)·D. Its error: whole source bins from the int64 moments
 * re-centred on m = ⌊c⌋, plus the partial bins at both edges, c_J((y − c)³ − (J − c)³)/3.
 * out[i] = loss × width², or 0 when width·D < flt_eps. */
void amct_hfmg_losses(const int64_t* pref, const int64_t* cnt, int64_t n, const int64_t* lefts,
                      const int64_t* rights, int64_t m, double width, double flt_eps, double* out,
                      int32_t nt, int32_t int64_only) {
    /* The integer moments in float64 are exact while every integer the formula forms stays
     * below 2^53: |t2|, |m·(s1 + t1)|, s2 ≤ 3·Σc·n², so 4·Σc·n² < 2^53 suffices. Then the
     * lane kernel (four candidates a vector) forms the very same doubles. */
    const double total = (double)pref[n], nn = (double)n;
    double* dp = NULL;
    if (!int64_only && n < ((int64_t)1 << 30) && 4.0 * total * nn * nn < 9007199254740992.0)
        dp = (double*)malloc(sizeof(double) * 4 * (size_t)(n + 1));
    if (dp) {
        for (int64_t t = 0; t < 3 * (n + 1); ++t) dp[t] = (double)pref[t];
        for (int64_t t = 0; t <= n; ++t) dp[3 * (n + 1) + t] = (double)cnt[t];
#if AMCT_HAVE_AVX2
        if (wide()) hfmg_losses_lanes8(dp, n, lefts, rights, m, width, flt_eps, out, nt);
        else
#endif
        hfmg_losses_lanes4(dp, n, lefts, rights, m, width, flt_eps, out, nt);
        free(dp);
        return;
    }
#if AMCT_HAVE_AVX2
    if (wide()) {
        hfmg_losses8(pref, cnt, n, lefts, rights, m, width, flt_eps, out, nt);
        return;
    }
#endif
    hfmg_losses4(pref, cnt, n, lefts, rights, m, width, flt_eps, out, nt);
}

/* HFMG: the greedy walk of SPEC §5.3 step 2, literally (hfmg._host_walk in C). pre: int64
 * [n + 1] prefix sums (pre[t] = mass of bins [0, t)). Writes the candidate (left, right)
 * recorded after each trim; returns their number (at most n). */
static int64_t lower_bound(const int64_t* a, int64_t x, int64_t lo, int64_t hi) {
    while (lo < hi) {                      /* first i in [lo, hi) with a[i] >= x, else hi */
        int64_t mid = lo + (hi - lo) / 2;
        if (a[mid] < x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static int64_t upper_bound(const int64_t* a, int64_t x, int64_t lo, int64_t hi) {
    while (lo < hi) {                      /* first i in [lo, hi) with a[i] > x, else hi */
        int64_t mid = lo + (hi - lo) / 2;
        if (a[mid] <= x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

int64_t amct_hfmg_walk(const int64_t* pre, int64_t n, int64_t* lefts, int64_t* rights) {
    int64_t total = pre[n];
    int64_t step = (total + 99999) / 100000;
    if (step < 1) step = 1;
    const int64_t min_bins = (n + 3) / 4;
    int64_t left = 0, right = n - 1, k = 0;
    while (right - left > min_bins) {
        int64_t tl = lower_bound(pre, pre[left] + step, left + 1, right + 1);
        if (tl > right) tl = right;
        int64_t tr = upper_bound(pre, pre[right + 1] - step, tl + 1, right + 1) - 2;
        if (tr < tl) tr = tl;
        if (right - tr >= tl - left) right = tr; else left = tl;
        lefts[k] = left;
        rights[k] = right;
        ++k;
    }
    return k;
}

/* Streaming IFMR: every candidate's loss from the fine histogram, the formula of
 * ifmr.histogram_losses evaluated per candidate instead of on [candidates, levels] tensors.
 * counts: int64 [nb]; dsum: float64 [nb] sums of the elements' offsets from their bin start
 * (absolute units); bin b starts at start + b·width. The prefix counts cum_n and first moments
 * cum_s (Σ count·start_b + dsum_b) are built here, in bin order. Candidate i has levels
 * m_lo[i] … m_lo[i] + k[i] (float64 integers) of step s[i]; its rounding boundaries
 * t_j = (m_lo + j + ½)·s, j < k. Counts and sums below t come from the prefix sums plus a
 * uniform share of t's bin; the loss is Σ_j q_j(q_j·N_j − 2·S_j), q_j = (m_lo + j)·s (up to
 * Σx², shared by all). Returns 0, or −1 when out of memory. */
int32_t amct_ifmr_hist_losses(const int64_t* counts, const double* dsum, int64_t nb, double start,
                              double width, const double* m_lo, const double* k, const double* s,
                              int64_t m, double* out) {
    double* cum = (double*)malloc(sizeof(double) * 2 * (size_t)(nb + 1));
    if (!cum) return -1;
    double* cum_n = cum;
    double* cum_s = cum + nb + 1;
    cum_n[0] = cum_s[0] = 0.0;
    for (int64_t b = 0; b < nb; ++b) {
        const double c = (double)counts[b];
        cum_n[b + 1] = cum_n[b] + c;
        cum_s[b + 1] = cum_s[b] + (c * (start + (double)b * width) + dsum[b]);
    }
#if AMCT_HAVE_AVX2
    if (wide())
        ifmr_hist_losses8(cum_n, cum_s, counts, nb, start, width, m_lo, k, s, m, out);
    else
#endif
    ifmr_hist_losses4(cum_n, cum_s, counts, nb, start, width, m_lo, k, s, m, out);
    free(cum);
    return 0;
}

#else  /* ---------------- included once per vector width: the slice kernels ---------------- */

/* Names of this width's functions and vector types: L(stream_slice) is stream_slice4 or
 * stream_slice8. A vector comparison gives −1 in each true lane, so `c -= cmp` counts. */
#define L(name) AMCT_CAT(name, AMCT_LANES)
#define W AMCT_LANES
typedef float L(vf) __attribute__((vector_size(4 * W)));
typedef int32_t L(vi) __attribute__((vector_size(4 * W)));
#define VF L(vf)
#define VI L(vi)

AMCT_INLINE VF L(splat)(float a) {
    VF v;
    for (int k = 0; k < W; ++k) v[k] = a;
    return v;
}

AMCT_INLINE VI L(isplat)(int32_t a) {
    VI v;
    for (int k = 0; k < W; ++k) v[k] = a;
    return v;
}

AMCT_INLINE int32_t L(hsum)(VI v) {
    int32_t t = 0;
    for (int k = 0; k < W; ++k) t += v[k];
    return t;
}

AMCT_INLINE VI L(select)(VI mask, VI a, VI b) {          /* mask ? a : b, lane-wise */
    return (a & mask) | (b & ~mask);
}

/* The trash slots of the lanes, slots + 0 … W−1 (with 4 lanes the callers alternate this
 * vector with itself + 4, so that runs of zeros still rotate over all eight slots). */
AMCT_INLINE VI L(trash_lanes)(int32_t slots) {
    VI lane;
    for (int k = 0; k < W; ++k) lane[k] = slots + (k & (AMCT_TRASH - 1));
    return lane;
}

/* a < b ? a : b and a > b ? a : b, lane-wise (so a NaN in a keeps b): x86's min/max
 * instructions have exactly these semantics; elsewhere a compare and a select (whose
 * longer dependency chain the callers split over several accumulators). */
AMCT_INLINE VF L(vmin)(VF a, VF b) {
#if AMCT_X86 && AMCT_LANES == 8
    return _mm256_min_ps(a, b);
#elif AMCT_X86 && AMCT_LANES == 4
    return _mm_min_ps(a, b);
#else
    return (VF)L(select)(a < b, (VI)a, (VI)b);
#endif
}

AMCT_INLINE VF L(vmax)(VF a, VF b) {
#if AMCT_X86 && AMCT_LANES == 8
    return _mm256_max_ps(a, b);
#elif AMCT_X86 && AMCT_LANES == 4
    return _mm_max_ps(a, b);
#else
    return (VF)L(select)(a > b, (VI)a, (VI)b);
#endif
}

/* Fold a vector's lanes into the running extremes (NaN lanes never pass a comparison). */
AMCT_INLINE void L(fold_extremes)(VF vlo, VF vhi, float* lo, float* hi) {
    for (int k = 0; k < W; ++k) {
        if (vlo[k] < *lo) *lo = vlo[k];
        if (vhi[k] > *hi) *hi = vhi[k];
    }
}

/* Non-zero when any lane of a comparison is true. */
AMCT_INLINE int L(any)(VI m) {
#if AMCT_X86 && AMCT_LANES == 8
    return _mm256_movemask_ps((__m256)m);
#elif AMCT_X86 && AMCT_LANES == 4
    return _mm_movemask_ps((__m128)m);
#else
    int32_t t = 0;
    for (int k = 0; k < W; ++k) t |= m[k];
    return t;
#endif
}

/* Append the values of p[0..m) above thr (below it when !above) to cand: each is counted in
 * the returned n_c, stored while n_c < cap (slot cap takes the rest). Vectors without one
 * are skipped after one comparison. */
AMCT_INLINE int64_t L(collect)(const float* p, int m, float thr, int above, float* cand, int64_t cap,
                               int64_t n_c) {
    int i = 0;
    for (; i + W <= m; i += W) {
        VF v;
        memcpy(&v, p + i, sizeof v);
        if (!L(any)(above ? v > thr : v < thr)) continue;
        for (int k = 0; k < W; ++k) {
            cand[n_c < cap ? n_c : cap] = v[k];
            n_c += above ? v[k] > thr : v[k] < thr;
        }
    }
    for (; i < m; ++i) {
        cand[n_c < cap ? n_c : cap] = p[i];
        n_c += above ? p[i] > thr : p[i] < thr;
    }
    return n_c;
}

/* amct_add_packed on m ≤ BLOCK slots. The fields are non-negative (so a logical shift
 * splits them) and the offset sums stay below 2^40, so the int64 → double conversion (no
 * AVX2 instruction) is the exact bit trick: the integer as the mantissa of 2^52, minus
 * 2^52. Written as plain loops for the compiler to vectorise. */
static void L(add_packed_block)(int32_t np, const int64_t* acc, int64_t stride, int m, int64_t offset_bits,
                                int64_t* counts, double* dsum) {
    const uint64_t mask = ((uint64_t)1 << offset_bits) - 1;
    uint64_t c[BLOCK], q[BLOCK];
    for (int j = 0; j < m; ++j) {
        c[j] = 0;
        q[j] = 0;
    }
    for (int32_t t = 0; t < np; ++t) {
        const uint64_t* row = (const uint64_t*)(acc + t * stride);
        for (int j = 0; j < m; ++j) {
            q[j] += row[j] & mask;
            c[j] += row[j] >> offset_bits;
        }
    }
    const double two52 = 4503599627370496.0;
    for (int j = 0; j < m; ++j) {
        uint64_t bits = q[j] | 0x4330000000000000ull;    /* the bits of 2^52 + q */
        double v;
        memcpy(&v, &bits, sizeof v);
        counts[j] += (int64_t)c[j];
        dsum[j] += (v - two52) * (1.0 / 65536.0);
    }
}

/* Streaming IFMR, one slice (amct_stream_update has the contract). */
static void L(stream_slice)(const float* x, int64_t n, float s, float base, int64_t slots,
                            int64_t offset_bits, int64_t* acc, float thr_hi, float thr_lo,
                            float* cand, int64_t cap, int64_t* res, float* ext) {
    int32_t jb[BLOCK] __attribute__((aligned(64)));
    int32_t qb[BLOCK] __attribute__((aligned(64)));
    float* cand_lo = cand + cap + 1;
    const float top = (float)slots;
    VI lane = L(trash_lanes)((int32_t)slots), step = L(isplat)(W < AMCT_TRASH ? W : 0);
    int64_t zeros = 0, n_hi = 0, n_lo = 0, outside = 0;
    float s_lo = INFINITY, s_hi = -INFINITY;
    for (int64_t st = 0; st < n; st += BLOCK) {
        const int m = (int)(n - st < BLOCK ? n - st : BLOCK);
        const float* p = x + st;
        if (st + AMCT_AHEAD * BLOCK < n)
            for (int k = 0; k < BLOCK; k += 16) __builtin_prefetch(p + AMCT_AHEAD * BLOCK + k);
        VI n_ok = L(isplat)(0), n_keep = n_ok;
        VF vhi = L(splat)(-INFINITY), vlo = L(splat)(INFINITY);
        int i = 0;
        for (; i + W <= m; i += W) {
            VF v;
            memcpy(&v, p + i, sizeof v);
            VF u = v * s;
            u = u - base;
            VI ok = (u >= 0.0f) & (u < top);           /* false for NaN */
            VI j = __builtin_convertvector(u, VI);      /* garbage where !ok: those go to the trash */
            VF f = u - __builtin_convertvector(j, VF);
            f = f * 65536.0f;
            f = f + 0.5f;
            VI keep = ok & (v != 0.0f);
            VI jj = L(select)(keep, j, lane);
            VI q = __builtin_convertvector(f, VI);
            memcpy(jb + i, &jj, sizeof jj);
            memcpy(qb + i, &q, sizeof q);
            n_ok -= ok;
            n_keep -= keep;
            vhi = L(vmax)(v, vhi);
            vlo = L(vmin)(v, vlo);
            lane += step;                        /* with 4 lanes, alternate over the 8 slots */
            step = -step;
        }
        float b_lo = INFINITY, b_hi = -INFINITY;
        L(fold_extremes)(vlo, vhi, &b_lo, &b_hi);
        const int32_t c_ok = L(hsum)(n_ok);
        int32_t c_zero = c_ok - L(hsum)(n_keep), c_out = i - c_ok, c_hi = b_hi > thr_hi, c_lo = b_lo < thr_lo;
        for (; i < m; ++i) {                     /* the tail of the last block: same maths */
            float v = p[i];
            float u = v * s;
            u = u - base;
            int ok = (u >= 0.0f) & (u < top);
            float uc = ok ? u : 0.0f;
            int32_t j = (int32_t)uc;
            float f = uc - (float)j;
            f = f * 65536.0f;
            f = f + 0.5f;
            int isz = (v == 0.0f);
            jb[i] = (isz | !ok) ? (int32_t)slots + (i & (AMCT_TRASH - 1)) : j;
            qb[i] = (int32_t)f;
            c_zero += isz & ok;
            c_out += !ok;
            c_hi |= (v > thr_hi);
            c_lo |= (v < thr_lo);
            if (v < b_lo) b_lo = v;
            if (v > b_hi) b_hi = v;
        }
        if (b_lo < s_lo) s_lo = b_lo;
        if (b_hi > s_hi) s_hi = b_hi;
        zeros += c_zero;
        outside += c_out;
        scatter_packed(acc, jb, qb, m, (int64_t)1 << offset_bits);
        if (c_hi) n_hi = L(collect)(p, m, thr_hi, 1, cand, cap, n_hi);
        if (c_lo) n_lo = L(collect)(p, m, thr_lo, 0, cand_lo, cap, n_lo);
    }
    if (zeros) {                                 /* the exact zeros, sent to the trash above */
        int32_t j;
        const int64_t entry = stream_entry(0.0f, s, base, offset_bits, &j);
        acc[j] += entry * zeros;
    }
    res[0] = n_hi;
    res[1] = n_lo;
    res[2] = outside;
    ext[0] = s_lo;
    ext[1] = s_hi;
}

/* The extremes and NaN count of p[0..m), folded into lo/hi/nan; two vectors a step, each
 * with its own accumulators. */
AMCT_INLINE void L(minmax_block)(const float* p, int m, float* lo, float* hi, int64_t* nan) {
    VF lo0 = L(splat)(*lo), lo1 = lo0, hi0 = L(splat)(*hi), hi1 = hi0;
    VI nn = L(isplat)(0);
    int i = 0;
    for (; i + 2 * W <= m; i += 2 * W) {
        VF a, b;
        memcpy(&a, p + i, sizeof a);
        memcpy(&b, p + i + W, sizeof b);
        nn -= a != a;
        nn -= b != b;
        lo0 = L(vmin)(a, lo0);
        lo1 = L(vmin)(b, lo1);
        hi0 = L(vmax)(a, hi0);
        hi1 = L(vmax)(b, hi1);
    }
    L(fold_extremes)(lo0, hi0, lo, hi);
    L(fold_extremes)(lo1, hi1, lo, hi);
    *nan += L(hsum)(nn);
    for (; i < m; ++i) {
        *nan += p[i] != p[i];
        if (p[i] < *lo) *lo = p[i];
        if (p[i] > *hi) *hi = p[i];
    }
}

/* Groups of `group` values for the first-batch bound of streaming IFMR, over super-blocks
 * [b0, b1) of group·W values: group b·W + j holds lane j of the super-block's `group`
 * vectors, so its extremes are lane-wise minima/maxima (no horizontal step; four
 * accumulators each hide the min/max latency) → hi[g], lo[g] (NaN left out). Returns the
 * NaN count. Any partition into groups of ≤ `group` values serves the bound. */
static int64_t L(group_extremes)(const float* x, int64_t group, int64_t b0, int64_t b1, float* hi, float* lo) {
    int64_t nan = 0;
    for (int64_t b = b0; b < b1; ++b) {
        const float* p = x + b * group * W;
        VF h[4], l[4];
        VI nn = L(isplat)(0);
        for (int a = 0; a < 4; ++a) {
            h[a] = L(splat)(-INFINITY);
            l[a] = L(splat)(INFINITY);
        }
        int64_t r = 0;
        for (; r + 4 <= group; r += 4)
            for (int a = 0; a < 4; ++a) {
                VF v;
                memcpy(&v, p + (r + a) * W, sizeof v);
                nn -= v != v;
                h[a] = L(vmax)(v, h[a]);
                l[a] = L(vmin)(v, l[a]);
            }
        for (; r < group; ++r) {
            VF v;
            memcpy(&v, p + r * W, sizeof v);
            nn -= v != v;
            h[0] = L(vmax)(v, h[0]);
            l[0] = L(vmin)(v, l[0]);
        }
        VF hh = L(vmax)(L(vmax)(h[0], h[1]), L(vmax)(h[2], h[3]));
        VF ll = L(vmin)(L(vmin)(l[0], l[1]), L(vmin)(l[2], l[3]));
        memcpy(hi + b * W, &hh, sizeof hh);
        memcpy(lo + b * W, &ll, sizeof ll);
        nan += L(hsum)(nn);
    }
    return nan;
}

/* HFMG, one slice (amct_hfmg_hist has the contract). While every value lies inside
 * [mn, mx] the extremes are not needed (the range stays); from the first block that has one
 * outside, that block and the rest are scanned for them. */
static void L(hfmg_slice)(const float* x, int64_t n, float mn, float mx, float w, int64_t nbins,
                          int32_t* cnt, float* ext, int64_t* res) {
    int32_t jb[BLOCK] __attribute__((aligned(64)));
    const int32_t last = (int32_t)nbins - 1;
    const VI lastv = L(isplat)(last);
    VI lane = L(trash_lanes)((int32_t)nbins), step = L(isplat)(W < AMCT_TRASH ? W : 0);
    int64_t zeros = 0, outside = !(mn <= mx), nans = 0;
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t st = 0; st < n; st += BLOCK) {
        const int m = (int)(n - st < BLOCK ? n - st : BLOCK);
        const float* p = x + st;
        if (outside) {                           /* the range grows: extremes only */
            L(minmax_block)(p, m, &lo, &hi, &nans);
            continue;
        }
        VI n_in = L(isplat)(0), n_keep = n_in;
        int i = 0;
        for (; i + W <= m; i += W) {
            VF v;
            memcpy(&v, p + i, sizeof v);
            VF t = v - mn;
            t = t / w;
            VI in = (v >= mn) & (v <= mx);          /* false for NaN */
            VI j = __builtin_convertvector(t, VI);  /* garbage where !in: those go to the trash */
            j = L(select)(j < lastv, j, lastv);
            VI keep = in & (v != 0.0f);
            VI jj = L(select)(keep, j, lane);
            memcpy(jb + i, &jj, sizeof jj);
            n_in -= in;
            n_keep -= keep;
            lane += step;
            step = -step;
        }
        const int32_t c_in = L(hsum)(n_in);
        int32_t c_zero = c_in - L(hsum)(n_keep), c_out = i - c_in;
        for (; i < m; ++i) {                     /* the tail of the last block: same maths */
            float v = p[i];
            int in = (v >= mn) & (v <= mx);
            int isz = (v == 0.0f);
            jb[i] = (in & !isz) ? hfmg_bin(v, mn, w, last) : (int32_t)nbins + (i & (AMCT_TRASH - 1));
            c_zero += isz & in;
            c_out += !in;
        }
        if (c_out) {                             /* this batch widens the range */
            outside = c_out;
            L(minmax_block)(p, m, &lo, &hi, &nans);
            continue;
        }
        zeros += c_zero;
        scatter_count(cnt, jb, m);
    }
    if (zeros && !outside)                       /* the exact zeros, sent to the trash above */
        cnt[hfmg_bin(0.0f, mn, w, last)] += (int32_t)zeros;
    ext[0] = lo;
    ext[1] = hi;
    res[0] = outside;
    res[1] = nans;
}

/* The searches' loss kernels (amct_hfmg_losses, amct_ifmr_hist_losses have the contracts): scalar
 * code, compiled once per width so that the wide build may vectorise the per-bin arithmetic
 * (the sums keep their order: the same results). */
static void L(hfmg_losses)(const int64_t* pref, const int64_t* cnt, int64_t n, const int64_t* lefts,
                           const int64_t* rights, int64_t m, double width, double flt_eps, double* out,
                           int32_t nt) {
    const int64_t* p0 = pref;
    const int64_t* p1 = pref + (n + 1);
    const int64_t* p2 = pref + 2 * (n + 1);
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < m; ++i) {
        const double l = (double)lefts[i];
        const double D = (double)(rights[i] - lefts[i] + 1) / AMCT_DST;
        double y[AMCT_DST + 1], jf[AMCT_DST + 1];
        int64_t jj[AMCT_DST + 1];
        for (int k = 0; k <= AMCT_DST; ++k) {
            double v = l + (double)k * D;
            if (k == 0) v = 0.0;
            if (k == AMCT_DST) v = (double)n;
            double f = floor(v);
            int64_t ji = (int64_t)f;
            ji = ji < 0 ? 0 : (ji > n ? n : ji);
            y[k] = v;
            jf[k] = f;
            jj[k] = ji;
        }
        double total = 0.0;
        for (int d = 0; d < AMCT_DST; ++d) {
            const int64_t a = jj[d], b = jj[d + 1];
            const int64_t t0 = p0[b] - p0[a];
            const int64_t s1 = p1[b] - p1[a];
            const int64_t s2 = p2[b] - p2[a];
            const double cen = l + ((double)d + 0.5) * D;
            const double mf = floor(cen);
            const double phi = cen - mf;
            const int64_t mi = (int64_t)mf;
            const int64_t t1 = s1 - mi * t0;
            const int64_t t2 = s2 - mi * (s1 + t1);
            const double full = (double)t2 + (1.0 - 2.0 * phi) * (double)t1
                                + (phi * (phi - 1.0) + 1.0 / 3.0) * (double)t0;
            const double u_lo = y[d] - cen, v_lo = jf[d] - cen;
            const double u_hi = y[d + 1] - cen, v_hi = jf[d + 1] - cen;
            const double edge = (double)cnt[b] * (u_hi * u_hi * u_hi - v_hi * v_hi * v_hi)
                                - (double)cnt[a] * (u_lo * u_lo * u_lo - v_lo * v_lo * v_lo);
            total += full + edge * (1.0 / 3.0);
        }
        out[i] = (width * D < flt_eps) ? 0.0 : total * (width * width);
    }
}

/* amct_hfmg_losses with the moments as exact doubles (dp: p0, p1, p2, cnt, n + 1 each), four
 * candidates a vector: each lane runs the scalar kernel's operations in its order (the same
 * sums), and the integer steps are exact in float64, so the losses are the scalar kernel's
 * bit for bit. The edges y, ⌊y⌋ and the bins' moments at the upper edge carry over to the
 * next destination bin's lower edge. */
typedef double L(vd) __attribute__((vector_size(32)));

/* dst = ⌊v⌋ lane-wise. A statement, not a function: the 4-lane build has no AVX, and
 * compilers warn about passing 32-byte vectors to functions there. */
#if AMCT_X86 && AMCT_LANES == 8
#define AMCT_VFLOOR(dst, v) ((dst) = (L(vd))_mm256_floor_pd((__m256d)(v)))
#else
#define AMCT_VFLOOR(dst, v) do { for (int k_ = 0; k_ < 4; ++k_) (dst)[k_] = floor((v)[k_]); } while (0)
#endif

static void L(hfmg_losses_lanes)(const double* dp, int64_t n, const int64_t* lefts, const int64_t* rights,
                                 int64_t m, double width, double flt_eps, double* out, int32_t nt) {
    const double* p0 = dp;
    const double* p1 = dp + (n + 1);
    const double* p2 = dp + 2 * (n + 1);
    const double* cn = dp + 3 * (n + 1);
    const int64_t groups = (m + 3) / 4;
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
        L(vd) l, D;
        for (int k = 0; k < 4; ++k) {
            const int64_t i = g * 4 + k < m ? g * 4 + k : m - 1;   /* the last group repeats */
            l[k] = (double)lefts[i];
            D[k] = (double)(rights[i] - lefts[i] + 1) / AMCT_DST;
        }
        L(vd) y_a = {0.0, 0.0, 0.0, 0.0}, f_a = y_a, q0 = y_a, q1 = y_a, q2 = y_a, c_a = y_a, total = y_a;
        for (int k = 0; k < 4; ++k) {                     /* the lower edge of bin 0: y_0 = 0 */
            q0[k] = p0[0];
            q1[k] = p1[0];
            q2[k] = p2[0];
            c_a[k] = cn[0];
        }
        for (int d = 0; d < AMCT_DST; ++d) {
            L(vd) y_b;
            if (d + 1 == AMCT_DST) {
                for (int k = 0; k < 4; ++k) y_b[k] = (double)n;
            } else {
                y_b = l + (double)(d + 1) * D;
            }
            L(vd) f_b;
            AMCT_VFLOOR(f_b, y_b);
            L(vd) r0, r1, r2, c_b;                       /* the moments at the upper edge */
#if AMCT_X86 && AMCT_LANES == 8
            const __m128i b = _mm_min_epi32(_mm256_cvttpd_epi32((__m256d)f_b), _mm_set1_epi32((int)n));
            r0 = (L(vd))_mm256_i32gather_pd(p0, b, 8);
            r1 = (L(vd))_mm256_i32gather_pd(p1, b, 8);
            r2 = (L(vd))_mm256_i32gather_pd(p2, b, 8);
            c_b = (L(vd))_mm256_i32gather_pd(cn, b, 8);
#else
            for (int k = 0; k < 4; ++k) {
                int64_t b = (int64_t)f_b[k];
                b = b > n ? n : b;
                r0[k] = p0[b];
                r1[k] = p1[b];
                r2[k] = p2[b];
                c_b[k] = cn[b];
            }
#endif
            const L(vd) t0 = r0 - q0, s1 = r1 - q1, s2 = r2 - q2;
            const L(vd) cen = l + ((double)d + 0.5) * D;
            L(vd) mf;
            AMCT_VFLOOR(mf, cen);
            const L(vd) phi = cen - mf;
            const L(vd) t1 = s1 - mf * t0;
            const L(vd) t2 = s2 - mf * (s1 + t1);
            const L(vd) full = t2 + (1.0 - 2.0 * phi) * t1 + (phi * (phi - 1.0) + 1.0 / 3.0) * t0;
            const L(vd) u_lo = y_a - cen, v_lo = f_a - cen;
            const L(vd) u_hi = y_b - cen, v_hi = f_b - cen;
            const L(vd) edge = c_b * (u_hi * u_hi * u_hi - v_hi * v_hi * v_hi)
                               - c_a * (u_lo * u_lo * u_lo - v_lo * v_lo * v_lo);
            total += full + edge * (1.0 / 3.0);
            y_a = y_b;
            f_a = f_b;
            q0 = r0;
            q1 = r1;
            q2 = r2;
            c_a = c_b;
        }
        for (int k = 0; k < 4 && g * 4 + k < m; ++k)
            out[g * 4 + k] = (width * D[k] < flt_eps) ? 0.0 : total[k] * (width * width);
    }
}

static void L(ifmr_hist_losses)(const double* cum_n, const double* cum_s, const int64_t* counts, int64_t nb,
                                double start, double width, const double* m_lo, const double* k,
                                const double* s, int64_t m, double* out) {
    const double inv = 1.0 / width;   /* the streaming grid's width is a power of two: as exact as dividing */
    for (int64_t i = 0; i < m; ++i) {
        double prev_n = 0.0, prev_s = 0.0, total = 0.0;
        const int64_t levels = (int64_t)k[i];
        for (int64_t j = 0; j <= levels; ++j) {
            double cnt_at, sum_at;
            if (j < levels) {
                const double t = (m_lo[i] + (double)j + 0.5) * s[i];
                double bf = floor((t - start) * inv);
                bf = bf < 0.0 ? 0.0 : (bf > (double)(nb - 1) ? (double)(nb - 1) : bf);
                const int64_t b = (int64_t)bf;
                const double a = start + (double)b * width;
                double f = (t - a) * inv;
                f = f < 0.0 ? 0.0 : (f > 1.0 ? 1.0 : f);
                if (f >= 1.0) {
                    cnt_at = cum_n[b + 1];
                    sum_at = cum_s[b + 1];
                } else {
                    const double nf = (double)counts[b] * f;
                    cnt_at = cum_n[b] + nf;
                    sum_at = cum_s[b] + nf * (a + f * (0.5 * width));
                }
            } else {                       /* above the last boundary: everything */
                cnt_at = cum_n[nb];
                sum_at = cum_s[nb];
            }
            const double q = (m_lo[i] + (double)j) * s[i];
            total += q * (q * (cnt_at - prev_n) - 2.0 * (sum_at - prev_s));
            prev_n = cnt_at;
            prev_s = sum_at;
        }
        out[i] = total;
    }
}

#undef AMCT_VFLOOR
#undef VF
#undef VI
#undef W
#undef L
#endif  /* AMCT_LANES */
