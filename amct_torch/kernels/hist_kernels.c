/* Fused CPU histogram kernels of the observers' update, loaded by
 * amct_torch/algorithms/native.py (which falls back to the same formulas in torch ops).
 *
 * Why C: a histogram needs a scatter per element. With torch ops every step (scale, shift,
 * truncate, offset, count) is a separate pass over memory and the scatter (index_add_) runs
 * on one thread. Here an element is read once: a block of 1024 values gets its bins (and
 * offsets, flags, extremes) in SIMD registers, then the block's scatter runs from L1; the
 * caller splits the data over threads, one private histogram each.
 *
 * The one compilation unit; hist_select.h (sorting, selection, the top/bottom merge) and
 * hist_lanes.h (the per-width SIMD kernels) are parts of it, not separate libraries.
 *
 * SIMD: GCC/clang vector extensions. The slice kernels are written once (hist_lanes.h) and
 * compiled twice by including that file twice: with 4 lanes (SSE2, NEON: every CPU of the
 * architecture) and, on x86-64, with 8 lanes for AVX2; amct_set_isa picks one at run time,
 * so one build runs on any CPU. The streaming slice scatters inside its vector loop, a few
 * vectors behind the binning, so that the two overlap (scatter_run).
 *
 * Bit-exactness with the torch path: the same float32 operations in the same order, compiled
 * with -ffp-contract=off (a fused multiply-add would round once instead of twice). Results
 * are integers, so they do not depend on how the data was split or on the vector width.
 *
 * Repeated bins: post-ReLU activations are often half exact zeros, so one bin would take
 * every other increment and each increment would wait for the previous one. Exact zeros are
 * sent to eight rotating trash slots after the real ones and added to the zero's bin once at
 * the end. Buffers therefore have slots + AMCT_TRASH entries; the trash is left as garbage.
 * (HFMG's AVX2 slice left-packs the bins it counts instead, so zeros cost no store at all.)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define BLOCK 1024                 /* a multiple of every vector width */
#define AMCT_TRASH 8
#define AMCT_DST 256               /* HFMG destination bins (docs/algorithms.md) */
/* The slices prefetch the line AMCT_AHEAD blocks ahead (into L2, hint 2) once per 16
 * values, spread through the vector loop: one 64-line burst at each block's start cost 15 %
 * on data in cache (it ties up the line-fill buffers that the scatter's misses need).
 * Against no software prefetch (1M values on 2 threads, streaming IFMR): the same on data in
 * L2/L3, 1.7× faster on data from memory (a 256 MB working set); HFMG likewise (1.9×). */
#define AMCT_AHEAD 8
#define AMCT_LAG 32                /* streaming IFMR: values between binning and scatter */
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

/* Add m packed entries (bins jb, offsets qb) to acc. The streaming slice calls it inside
 * its vector loop for the values AMCT_LAG back instead of after the block: the scattered
 * read-modify-writes (bound by the stores, about one a cycle, more where the histogram
 * leaves L1) then overlap the vector arithmetic of the next values, which otherwise ran as
 * a separate phase (the reorder window holds ~30 values of it, not a block): 0.63 → 0.56 ns
 * per value on one thread. More lag (64–256) changes nothing; prefetching the bins' lines
 * for writing is 30 % slower. */
AMCT_INLINE void scatter_run(int64_t* acc, const int32_t* jb, const int32_t* qb, int m, int64_t one) {
    for (int i = 0; i < m; ++i) acc[jb[i]] += (int64_t)qb[i] + one;
}

/* Count a block's bins: int32 counts of one slice (a smaller histogram to keep
 * in cache, 15 % faster here than int64), in two copies taken alternately (the caller adds
 * c1 into c0 at the end): a run of equal bins — an image's flat regions, values clipped at a
 * bound — then makes two chains of dependent increments instead of one (38 % of the values in
 * one bin: 0.47 → 0.34 ms per 1M values; real nsfw inputs: the same or a little faster). */
AMCT_INLINE void scatter_count2(int32_t* c0, int32_t* c1, const int32_t* jb, int m) {
    int i = 0;
    for (; i + 8 <= m; i += 8) {
        int32_t j[8];
        for (int k = 0; k < 8; ++k) j[k] = jb[i + k];
        for (int k = 0; k < 8; k += 2) {
            c0[j[k]] += 1;
            c1[j[k + 1]] += 1;
        }
    }
    for (; i < m; ++i) c0[jb[i]] += 1;
}

/* The AVX2 left-pack's lane orders: row `mask` lists the set bits of mask in order (then
 * zeros), filled by amct_set_isa. */
static uint8_t amct_pack_lut[256][8];

static void fill_pack_lut(void) {
    if (amct_pack_lut[255][7] == 7) return;              /* filled */
    for (int mask = 0; mask < 256; ++mask) {
        int c = 0;
        for (int k = 0; k < 8; ++k)
            if (mask >> k & 1) amct_pack_lut[mask][c++] = (uint8_t)k;
        while (c < 8) amct_pack_lut[mask][c++] = 0;
    }
}

/* The slice kernels, once per vector width (hist_lanes.h). */
#define AMCT_LANES 4
#include "hist_lanes.h"
#undef AMCT_LANES
#if AMCT_HAVE_AVX2
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#define AMCT_LANES 8
#include "hist_lanes.h"
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
    fill_pack_lut();
    amct_isa = want == 0 ? 0 : avx2;
    return amct_isa;
}

static int wide(void) {
    if (amct_isa < 0) amct_set_isa(-1);
    return amct_isa;
}

/* The width dispatch: name##8(...) when w (the AVX2 build, where there is one), else
 * name##4(...). */
#if AMCT_HAVE_AVX2
#define AMCT_BY_WIDTH(w, name, ...) ((w) ? name##8(__VA_ARGS__) : name##4(__VA_ARGS__))
#else
#define AMCT_BY_WIDTH(w, name, ...) ((void)(w), name##4(__VA_ARGS__))
#endif

/* One slice of a streaming-IFMR update on the current frame (the width dispatch of
 * amct_stream_update_mt's slices), fused: the packed histogram (stream_entry;
 * the caller bounds n so that no field overflows) plus the values that can enter the exact
 * top/bottom buffers (v > thr_hi into cand[0..cap], v < thr_lo into cand[cap+1..2cap+1];
 * every qualifying value is counted, stored while there is room; infinite thresholds give a
 * plain histogram).
 * Elements outside the frame (or NaN/Inf) are not binned but counted: then the caller throws
 * the result away and takes the general path. res = {n_hi, n_lo, outside}; ext = {min, max}
 * of the values (NaN left out). */
static void amct_stream_update(const float* x, int64_t n, float s, float base, int64_t slots,
                               int64_t offset_bits, int64_t* acc, float thr_hi, float thr_lo,
                               float* cand, int64_t cap, int64_t* res, float* ext) {
    AMCT_BY_WIDTH(wide(), stream_slice, x, n, s, base, slots, offset_bits, acc, thr_hi, thr_lo, cand, cap, res,
                  ext);
}

/* One slice of amct_hfmg_hist_mt (the width dispatch). HFMG bins of [mn, mx] with bin width
 * w: j = min(trunc((x − mn)/w), nbins − 1), float32 maths, into cnt int32 [nbins + AMCT_TRASH]
 * (n < 2^31; cnt2, as large, is the second copy of scatter_count2, added into cnt at the end); res = {non-zero if a value lies outside
 * [mn, mx] or is NaN, NaN count}. When a value lies outside, the batch widens the range and
 * the caller histograms it again on the union (HFMG step 1): the counts are then incomplete, and
 * ext = {min, max} of the values from the first block with one outside on (NaN left out) —
 * the values before lie inside [mn, mx], so the union of [mn, mx] and ext is the union with
 * the batch's range. *stop is shared by the slices of one call: a slice that meets a value
 * outside raises it, and the others then scan their remaining blocks for extremes only
 * (their counts are thrown away too), so a widening batch is not binned to its end on every
 * thread. With mn > mx (no range yet) the call is a pure min/max pass. */
static void amct_hfmg_hist(const float* x, int64_t n, float mn, float mx, float w, int64_t nbins,
                           int32_t* cnt, int32_t* cnt2, float* ext, int64_t* res, int* stop) {
    AMCT_BY_WIDTH(wide(), hfmg_slice, x, n, mn, mx, w, nbins, cnt, cnt2, ext, res, stop);
}

#include "hist_select.h"      /* sorting, selection and the top/bottom merge */

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
        nans += AMCT_BY_WIDTH(w, group_extremes, x, group, b0, b1, hi, lo);
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
    int stop = 0;
    wide();
    #pragma omp parallel for num_threads(nt) schedule(static, 1)
    for (int32_t t = 0; t < np; ++t) {
        memset(cnt + t * cnt_stride, 0, sizeof(int32_t) * cnt_stride);
        amct_hfmg_hist(x + bounds[t], bounds[t + 1] - bounds[t], mn, mx, w, nbins, cnt + t * cnt_stride,
                       cnt + t * cnt_stride + cnt_stride / 2, ext + 2 * t, res + 2 * t, &stop);
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
        AMCT_BY_WIDTH(w, add_packed_block, np, acc + j0, stride, m, offset_bits, counts + j0, dsum + j0);
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

/* HFMG: analytic L2 loss of every candidate range (HFMG step 3, docs/algorithms.md), the formula of
 * hfmg.losses evaluated per candidate in registers instead of as ~45 passes over
 * [candidates, 257] tensors. pref: int64 [3][n + 1] prefix sums of c_j, c_j·j, c_j·j²;
 * cnt: int64 [n + 1] counts with cnt[n] = 0. In source-bin units, destination bin d of
 * candidate (l, r) spans [y_d, y_{d+1}), y_k = l + k·D, D = (r − l + 1)/256, y_0 = 0,
 * y_256 = n; centre c = l + (d + ½)·D. Its error: whole source bins from the int64 moments
 * re-centred on m = ⌊c⌋, plus the partial bins at both edges, c_J((y − c)³ − (J − c)³)/3;
 * summed over the destination bins those corrections come to −D·Σ_k c_J·ρ_k², J = ⌊y_k⌋,
 * ρ_k = y_k − J (hfmg.losses derives it), which the kernels use.
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
    }
    const int w = wide();
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int32_t t = 0; t < nt; ++t) {                   /* contiguous candidate ranges */
        const int64_t i0 = m * t / nt, i1 = m * (t + 1) / nt;
        if (dp)
            AMCT_BY_WIDTH(w, hfmg_losses_lanes, dp, n, lefts, rights, i0, i1, width, flt_eps, out);
        else
            AMCT_BY_WIDTH(w, hfmg_losses, pref, cnt, n, lefts, rights, i0, i1, width, flt_eps, out);
    }
    free(dp);
}

/* HFMG: move the counts of [old_min, old_max] onto [new_min, new_max] ⊇ it (the same n bins,
 * old_max > old_min), hfmg.redistribute's float64 operations in the same order: old bin j,
 * [lo, hi), goes to the new bin a holding lo, or is split with a + 1 when it straddles a's
 * upper edge, the lower share floor(frac·count). out (n, zeroed here) must not alias counts.
 * A widening batch pays this on every update, which in torch ops is ~0.13 ms (2048 bins). */
void amct_hfmg_redistribute(const int64_t* counts, int64_t n, double old_min, double old_max,
                            double new_min, double new_max, int64_t* out) {
    const double nw = (new_max - new_min) / (double)n;
    const double ow = (old_max - old_min) / (double)n;
    memset(out, 0, sizeof(int64_t) * (size_t)n);
    for (int64_t j = 0; j < n; ++j) {
        const double lo = old_min + (double)j * ow;
        const double hi = lo + ow;
        double a = floor((lo - new_min) / nw);
        a = a < 0.0 ? 0.0 : (a > (double)(n - 1) ? (double)(n - 1) : a);
        const double edge = new_min + (a + 1.0) * nw;
        double frac = (edge - lo) / ow;
        frac = frac < 0.0 ? 0.0 : (frac > 1.0 ? 1.0 : frac);
        const int64_t ai = (int64_t)a, c = counts[j];
        const int64_t low = (hi > edge && ai < n - 1) ? (int64_t)floor(frac * (double)c) : c;
        out[ai] += low;
        out[ai + 1 < n ? ai + 1 : n - 1] += c - low;
    }
}

/* HFMG: the greedy walk (HFMG step 2), literally (hfmg._host_walk in C). pre: int64
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
    AMCT_BY_WIDTH(wide(), ifmr_hist_losses, cum_n, cum_s, counts, nb, start, width, m_lo, k, s, m, out);
    free(cum);
    return 0;
}
