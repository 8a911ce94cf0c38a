/* Sorting, selection and the top/bottom merge of hist_kernels.c (streaming IFMR's exact
 * extremes), included there once after its common definitions. Scalar code: the inputs are
 * the few thousand values that pass a threshold, not the data. Not a header to include
 * anywhere else. */
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
