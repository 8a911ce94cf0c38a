/* The per-width SIMD kernels of hist_kernels.c, which includes this file once per vector
 * width with AMCT_LANES set (4: SSE2/NEON; 8: AVX2 under a target pragma) after its common
 * definitions; every name gets the width as a suffix (L(name)), so the two copies coexist.
 * Not a header to include anywhere else. */
#ifndef AMCT_LANES
#error "hist_lanes.h is included by hist_kernels.c with AMCT_LANES set"
#endif

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

/* AVX2: store the lanes of j where keep is true, in order, at out (a whole vector is
 * written; the lanes past the count are garbage) and return their count. HFMG's scatter
 * then skips the exact zeros and the dropped values instead of sending them to the trash
 * slots: post-ReLU data is often half zeros, and every store costs the same. Elsewhere
 * (AMCT_PACK 0) the trash slots remain. */
#if AMCT_X86 && AMCT_LANES == 8
#define AMCT_PACK 1
AMCT_INLINE int L(pack)(VI j, VI keep, int32_t* out) {
    const int mask = _mm256_movemask_ps((__m256)keep);
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)amct_pack_lut[mask]));
    _mm256_storeu_si256((__m256i*)out, _mm256_permutevar8x32_epi32((__m256i)j, idx));
    return __builtin_popcount((unsigned)mask);
}
#else
#define AMCT_PACK 0
#endif

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

/* amct_add_packed on m ≤ BLOCK slots, W/2 slots a vector: the fields of every row summed in
 * registers, then added to the state. The fields are non-negative (so a logical shift
 * splits them) and the offset sums stay below 2^40, so the int64 → double conversion (no
 * AVX2 instruction) is the exact bit trick: the integer as the mantissa of 2^52, minus
 * 2^52. (Summing the rows into two stack arrays first, then converting, took 4× as long:
 * 19 µs for one row of 16K slots.) */
static void L(add_packed_block)(int32_t np, const int64_t* acc, int64_t stride, int m, int64_t offset_bits,
                                int64_t* counts, double* dsum) {
    typedef uint64_t VQ __attribute__((vector_size(4 * W)));
    typedef double VD __attribute__((vector_size(4 * W)));
    const uint64_t mask = ((uint64_t)1 << offset_bits) - 1, magic = 0x4330000000000000ull;
    const double two52 = 4503599627370496.0;
    int j = 0;
    for (; j + W / 2 <= m; j += W / 2) {
        VQ c, q, r, cnt;
        VD d, v;
        memcpy(&r, acc + j, sizeof r);
        q = r & mask;
        c = r >> offset_bits;
        for (int32_t t = 1; t < np; ++t) {
            memcpy(&r, acc + t * stride + j, sizeof r);
            q += r & mask;
            c += r >> offset_bits;
        }
        memcpy(&cnt, counts + j, sizeof cnt);
        cnt += c;
        memcpy(counts + j, &cnt, sizeof cnt);
        q |= magic;                                     /* the bits of 2^52 + q */
        memcpy(&v, &q, sizeof v);
        memcpy(&d, dsum + j, sizeof d);
        d += (v - two52) * (1.0 / 65536.0);
        memcpy(dsum + j, &d, sizeof d);
    }
    for (; j < m; ++j) {
        uint64_t c = 0, q = 0;
        for (int32_t t = 0; t < np; ++t) {
            const uint64_t r = (uint64_t)acc[t * stride + j];
            q += r & mask;
            c += r >> offset_bits;
        }
        q |= magic;
        double v;
        memcpy(&v, &q, sizeof v);
        counts[j] += (int64_t)c;
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
    const int64_t one = (int64_t)1 << offset_bits;
    const float top = (float)slots;
    VI lane = L(trash_lanes)((int32_t)slots), step = L(isplat)(W < AMCT_TRASH ? W : 0);
    int64_t zeros = 0, n_hi = 0, n_lo = 0, outside = 0;
    float s_lo = INFINITY, s_hi = -INFINITY;
    for (int64_t st = 0; st < n; st += BLOCK) {
        const int m = (int)(n - st < BLOCK ? n - st : BLOCK);
        const float* p = x + st;
        const float* pf = st + AMCT_AHEAD * BLOCK < n ? p + AMCT_AHEAD * BLOCK : p;   /* see AMCT_AHEAD */
        VI n_ok = L(isplat)(0), n_keep = n_ok;
        VF vhi = L(splat)(-INFINITY), vlo = L(splat)(INFINITY);
        int i = 0;
        for (; i + W <= m; i += W) {
            VF v;
            memcpy(&v, p + i, sizeof v);
            if (!(i & 15)) __builtin_prefetch(pf + i, 0, 2);
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
            if (i >= AMCT_LAG)                   /* the entries of AMCT_LAG values back */
                scatter_run(acc, jb + i - AMCT_LAG, qb + i - AMCT_LAG, W, one);
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
        const int k0 = i > AMCT_LAG ? i - AMCT_LAG : 0;   /* the entries the loop has not added */
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
        scatter_run(acc, jb + k0, qb + k0, m - k0, one);
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
 * outside — in this slice or, through *stop, in another — the blocks are scanned for them. */
static void L(hfmg_slice)(const float* x, int64_t n, float mn, float mx, float w, int64_t nbins,
                          int32_t* cnt, int32_t* cnt2, float* ext, int64_t* res, int* stop) {
    int32_t jb[BLOCK + W] __attribute__((aligned(64)));      /* + W: L(pack) stores whole vectors */
    const int32_t last = (int32_t)nbins - 1;
    const VI lastv = L(isplat)(last);
#if !AMCT_PACK
    VI lane = L(trash_lanes)((int32_t)nbins), step = L(isplat)(W < AMCT_TRASH ? W : 0);
#endif
    int64_t zeros = 0, outside = !(mn <= mx), nans = 0;
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t st = 0; st < n; st += BLOCK) {
        const int m = (int)(n - st < BLOCK ? n - st : BLOCK);
        const float* p = x + st;
        const float* pf = st + AMCT_AHEAD * BLOCK < n ? p + AMCT_AHEAD * BLOCK : p;   /* see AMCT_AHEAD */
        if (!outside && __atomic_load_n(stop, __ATOMIC_RELAXED))
            outside = -1;                        /* another slice found the batch widens */
        if (outside) {                           /* the range grows: extremes only */
            L(minmax_block)(p, m, &lo, &hi, &nans);
            continue;
        }
        VI n_in = L(isplat)(0);
#if !AMCT_PACK
        VI n_keep = n_in;
#endif
        int i = 0, kept = 0;
        for (; i + W <= m; i += W) {
            VF v;
            memcpy(&v, p + i, sizeof v);
            if (!(i & 15)) __builtin_prefetch(pf + i, 0, 2);
            VF t = v - mn;
            t = t / w;
            VI in = (v >= mn) & (v <= mx);          /* false for NaN */
            VI j = __builtin_convertvector(t, VI);  /* garbage where !in: those are dropped */
#if AMCT_X86 && AMCT_LANES == 8
            j = (VI)_mm256_min_epi32((__m256i)j, (__m256i)lastv);
#else
            j = L(select)(j < lastv, j, lastv);
#endif
            VI keep = in & (v != 0.0f);
#if AMCT_PACK
            kept += L(pack)(j, keep, jb + kept);
#else
            VI jj = L(select)(keep, j, lane);
            memcpy(jb + i, &jj, sizeof jj);
            lane += step;
            step = -step;
            n_keep -= keep;
#endif
            n_in -= in;
        }
        const int32_t c_in = L(hsum)(n_in);
#if AMCT_PACK
        int32_t c_zero = c_in - kept, c_out = i - c_in;      /* in range and not kept: zeros */
#else
        int32_t c_zero = c_in - L(hsum)(n_keep), c_out = i - c_in;
        kept = i;
#endif
        for (; i < m; ++i) {                     /* the tail of the last block: same maths */
            float v = p[i];
            int in = (v >= mn) & (v <= mx);
            int isz = (v == 0.0f);
            if (in & !isz) jb[kept++] = hfmg_bin(v, mn, w, last);
            c_zero += isz & in;
            c_out += !in;
        }
        if (c_out) {                             /* this batch widens the range */
            outside = c_out;
            __atomic_store_n(stop, 1, __ATOMIC_RELAXED);
            L(minmax_block)(p, m, &lo, &hi, &nans);
            continue;
        }
        zeros += c_zero;
        scatter_count2(cnt, cnt2, jb, kept);
    }
    if (!outside)
        for (int64_t j = 0; j < nbins; ++j) cnt[j] += cnt2[j];
    if (zeros && !outside)                       /* the exact zeros, sent to the trash above */
        cnt[hfmg_bin(0.0f, mn, w, last)] += (int32_t)zeros;
    ext[0] = lo;
    ext[1] = hi;
    res[0] = outside;
    res[1] = nans;
}

/* The searches' loss kernels (amct_hfmg_losses, amct_ifmr_hist_losses have the contracts): scalar
 * code, compiled once per width so that the wide build may vectorise the per-bin arithmetic
 * (the sums keep their order: the same results). The HFMG ones take candidates [i0, i1) and
 * no threads: the caller's parallel loop spreads the ranges (an OpenMP region inside a
 * function of the AVX2 build does not compile with clang: its outlined body lacks the
 * target attribute). */
static void L(hfmg_losses)(const int64_t* pref, const int64_t* cnt, int64_t n, const int64_t* lefts,
                           const int64_t* rights, int64_t i0, int64_t i1, double width, double flt_eps,
                           double* out) {
    const int64_t* p0 = pref;
    const int64_t* p1 = pref + (n + 1);
    const int64_t* p2 = pref + 2 * (n + 1);
    for (int64_t i = i0; i < i1; ++i) {
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
        double total = 0.0, split = 0.0;
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
            const double rho = y[d + 1] - jf[d + 1];
            total += full;
            split += (double)cnt[b] * (rho * rho);
        }
        total -= D * split;
        out[i] = (width * D < flt_eps) ? 0.0 : total * (width * width);
    }
}

/* amct_hfmg_losses with the moments as exact doubles (dp: p0, p1, p2, cnt, n + 1 each), four
 * candidates a vector: each lane runs the scalar kernel's operations in its order (the same
 * sums), and the integer steps are exact in float64, so the losses are the scalar kernel's
 * bit for bit. The moments at a bin's upper edge carry over as the next destination bin's
 * lower edge. */
typedef double L(vd) __attribute__((vector_size(32)));

/* dst = ⌊v⌋ lane-wise. A statement, not a function: the 4-lane build has no AVX, and
 * compilers warn about passing 32-byte vectors to functions there. */
#if AMCT_X86 && AMCT_LANES == 8
#define AMCT_VFLOOR(dst, v) ((dst) = (L(vd))_mm256_floor_pd((__m256d)(v)))
#else
#define AMCT_VFLOOR(dst, v) do { for (int k_ = 0; k_ < 4; ++k_) (dst)[k_] = floor((v)[k_]); } while (0)
#endif

static void L(hfmg_losses_lanes)(const double* dp, int64_t n, const int64_t* lefts, const int64_t* rights,
                                 int64_t i0, int64_t i1, double width, double flt_eps, double* out) {
    const double* p0 = dp;
    const double* p1 = dp + (n + 1);
    const double* p2 = dp + 2 * (n + 1);
    const double* cn = dp + 3 * (n + 1);
    for (int64_t g = i0; g < i1; g += 4) {                /* four candidates from g */
        L(vd) l, D;
        for (int k = 0; k < 4; ++k) {
            const int64_t i = g + k < i1 ? g + k : i1 - 1;   /* the last group repeats */
            l[k] = (double)lefts[i];
            D[k] = (double)(rights[i] - lefts[i] + 1) / AMCT_DST;
        }
        L(vd) q0 = {0.0, 0.0, 0.0, 0.0}, q1 = q0, q2 = q0, total = q0, split = q0;
        for (int k = 0; k < 4; ++k) {                     /* the lower edge of bin 0: y_0 = 0 */
            q0[k] = p0[0];
            q1[k] = p1[0];
            q2[k] = p2[0];
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
            const L(vd) rho = y_b - f_b;
            total += full;
            split += c_b * (rho * rho);
            q0 = r0;
            q1 = r1;
            q2 = r2;
        }
        total -= D * split;
        for (int k = 0; k < 4 && g + k < i1; ++k)
            out[g + k] = (width * D[k] < flt_eps) ? 0.0 : total[k] * (width * width);
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
#undef AMCT_PACK
#undef VF
#undef VI
#undef W
#undef L
