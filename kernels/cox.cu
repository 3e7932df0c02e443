// Cox and Fine–Gray partial likelihoods with strata and Breslow or Efron ties (DESIGN.md §5,
// paper 001 §2.5–2.8).
//
// Rows in the model's internal order (stratum, time DESC, row id). Per row: w, y (0, 1, 2),
// stratum, η, we = w·exp(η), and for Fine–Gray comp_scale = 1/G(T−) on competing rows (y = 2),
// 0 elsewhere. An *event group* is the set of rows of one (stratum, time) with at least one
// event; grp[k] = g on the group's last row k (−1 on every other row); the group's rows are
// grp_first[g]..=k, it has grp_d[g] events of total weight grp_wsum[g], and for Fine–Gray
// grp_G[g] = G(t−). The risk set of group g is every row of its stratum up to and including k
// (time ≥ t: a forward prefix sum, reset at stratum starts) plus, for Fine–Gray, the competing
// rows of its stratum after k (time < t) weighted G(t−)/G(T−) (a backward sum: the stratum total
// minus the prefix). Tied events are grouped (Breslow) or get Efron's d terms with the mean
// event weight, exactly as `brute` in crates/core/src/model/risk_set.rs.
//
// Per coordinate: `risk_set_scatter` writes column j into the dense scratch column xcol, one
// fused `risk_set_gradient` block does the segmented tuple prefix scan (and the Fine–Gray
// backward sums), the transform to (g, h) and the reduction; `ccd_step` takes the step and
// `risk_set_update` applies it to the nonzeros and clears xcol. Nothing crosses to the host.

// xcol[k] = x_kj on column j's nonzeros (xcol is all zero between coordinates).
extern "C" __global__ void PREC(risk_set_scatter)(
    int j,
    const long long* __restrict__ col_ptr,
    const int* __restrict__ row_idx,
    const VAL_T* __restrict__ vals,
    const long long* __restrict__ val_off,
    double* __restrict__ xcol)
{
    const VAL_T* cv = epi_column_values(vals, val_off, j);
    const long long lo = col_ptr[j], hi = col_ptr[j + 1];
    for (long long i = lo + blockIdx.x * (long long)blockDim.x + threadIdx.x; i < hi; i += (long long)gridDim.x * blockDim.x) {
        xcol[row_idx[i]] = epi_value(cv, i - lo);
    }
}

// β_j += Δ (*delta from ccd_step) on column j's nonzeros: η += Δx, we = w·exp(η); clears xcol.
extern "C" __global__ void PREC(risk_set_update)(
    int j,
    const double* __restrict__ delta,
    const long long* __restrict__ col_ptr,
    const int* __restrict__ row_idx,
    const VAL_T* __restrict__ vals,
    const long long* __restrict__ val_off,
    const double* __restrict__ w,
    double* __restrict__ eta,
    double* __restrict__ we,
    double* __restrict__ xcol)
{
    const double d = *delta;
    const VAL_T* cv = epi_column_values(vals, val_off, j);
    const long long lo = col_ptr[j], hi = col_ptr[j + 1];
    for (long long i = lo + blockIdx.x * (long long)blockDim.x + threadIdx.x; i < hi; i += (long long)gridDim.x * blockDim.x) {
        const int k = row_idx[i];
        xcol[k] = 0.0;
        if (d != 0.0) {
            const double e = eta[k] + d * epi_value(cv, i - lo);
            eta[k] = e;
            we[k] = w[k] * exp(e);
        }
    }
}

// we = w·exp(η) for every row (after η was rebuilt from scratch).
extern "C" __global__ void PREC(risk_set_recompute)(int n, const double* __restrict__ w, const double* __restrict__ eta, double* __restrict__ we) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        we[k] = w[k] * exp(eta[k]);
    }
}

// Row k's contribution to the six scanned sums: forward (we, we·x, we·x²) and, for Fine–Gray
// competing rows, the backward (c, c·x, c·x²) with c = we/G(T−).
__device__ __forceinline__ void risk_set_add(double* a, int k, const double* we, const double* xcol, const double* comp_scale) {
    const double c = we[k], x = xcol[k];
    a[0] += c; a[1] += c * x; a[2] += c * x * x;
    if (comp_scale != nullptr) {
        const double b = c * comp_scale[k];
        a[3] += b; a[4] += b * x; a[5] += b * x * x;
    }
}

__device__ __forceinline__ bool risk_set_head(int k, const int* stratum) {
    return k == 0 || stratum[k] != stratum[k - 1];
}

// The fused scan–transform–reduce of one coordinate (launch <<<1, EPI_BLOCK>>>): partials[0..3]
// = (g_j, h_j, LL). With xcol all zero it gives LL alone (the per-cycle convergence value).
// Each thread owns a contiguous chunk of rows: (A) segmented chunk sums, (B) a block-wide
// segmented scan of the chunk sums (Hillis–Steele in shared memory), (C, Fine–Gray) stratum
// totals of the backward sums, (D) a rescan of the chunk from its carry that evaluates every
// group ending in it. Deterministic: fixed chunks and a fixed combination order.
// `ctot` is scratch of 3 doubles per stratum (Fine–Gray only).
extern "C" __global__ void __launch_bounds__(EPI_BLOCK) PREC(risk_set_gradient)(
    int n,
    int efron,
    const int* __restrict__ stratum,
    const int* __restrict__ y,
    const double* __restrict__ w,
    const double* __restrict__ eta,
    const double* __restrict__ we,
    const double* __restrict__ xcol,
    const double* __restrict__ comp_scale,
    const int* __restrict__ grp,
    const long long* __restrict__ grp_first,
    const int* __restrict__ grp_d,
    const double* __restrict__ grp_wsum,
    const double* __restrict__ grp_G,
    double* __restrict__ ctot,
    double* __restrict__ partials)
{
    __shared__ double sv[6][EPI_BLOCK];
    __shared__ int sf[EPI_BLOCK];
    const int t = threadIdx.x;
    const int chunk = (n + EPI_BLOCK - 1) / EPI_BLOCK;
    const int lo = min(n, t * chunk), hi = min(n, lo + chunk);

    // (A) chunk sums since the chunk's last stratum start.
    double a[6] = {0, 0, 0, 0, 0, 0};
    int flag = 0;
    for (int k = lo; k < hi; ++k) {
        if (risk_set_head(k, stratum)) {
            flag = 1;
            #pragma unroll
            for (int m = 0; m < 6; ++m) a[m] = 0.0;
        }
        risk_set_add(a, k, we, xcol, comp_scale);
    }
    // (B) inclusive segmented scan over threads: (f1, v1) ⊕ (f2, v2) = (f1|f2, f2 ? v2 : v1 + v2).
    #pragma unroll
    for (int m = 0; m < 6; ++m) sv[m][t] = a[m];
    sf[t] = flag;
    __syncthreads();
    for (int off = 1; off < EPI_BLOCK; off <<= 1) {
        double left[6];
        int lf = 0;
        if (t >= off) {
            #pragma unroll
            for (int m = 0; m < 6; ++m) left[m] = sv[m][t - off];
            lf = sf[t - off];
        }
        __syncthreads();
        if (t >= off) {
            if (!sf[t]) {
                #pragma unroll
                for (int m = 0; m < 6; ++m) sv[m][t] += left[m];
            }
            sf[t] |= lf;
        }
        __syncthreads();
    }
    double carry[6];
    #pragma unroll
    for (int m = 0; m < 6; ++m) carry[m] = t > 0 ? sv[m][t - 1] : 0.0;

    // (C) Fine–Gray: stratum totals of the backward sums.
    if (comp_scale != nullptr) {
        double r[6];
        #pragma unroll
        for (int m = 0; m < 6; ++m) r[m] = carry[m];
        for (int k = lo; k < hi; ++k) {
            if (risk_set_head(k, stratum)) {
                #pragma unroll
                for (int m = 0; m < 6; ++m) r[m] = 0.0;
            }
            risk_set_add(r, k, we, xcol, comp_scale);
            if (k == n - 1 || stratum[k + 1] != stratum[k]) {
                ctot[3 * stratum[k]] = r[3];
                ctot[3 * stratum[k] + 1] = r[4];
                ctot[3 * stratum[k] + 2] = r[5];
            }
        }
        __syncthreads();  // orders the global writes above before the reads below, block-wide
    }

    // (D) rescan and evaluate the groups.
    double g = 0.0, h = 0.0, ll = 0.0;
    double r[6];
    #pragma unroll
    for (int m = 0; m < 6; ++m) r[m] = carry[m];
    for (int k = lo; k < hi; ++k) {
        if (risk_set_head(k, stratum)) {
            #pragma unroll
            for (int m = 0; m < 6; ++m) r[m] = 0.0;
        }
        risk_set_add(r, k, we, xcol, comp_scale);
        if (y[k] == 1) {
            g += w[k] * xcol[k];
            ll += w[k] * eta[k];
        }
        const int gi = grp[k];
        if (gi < 0) continue;
        double s0 = r[0], s1 = r[1], s2 = r[2];
        if (comp_scale != nullptr) {
            const double G = grp_G[gi];
            const int s = stratum[k];
            s0 += G * (ctot[3 * s] - r[3]);
            s1 += G * (ctot[3 * s + 1] - r[4]);
            s2 += G * (ctot[3 * s + 2] - r[5]);
        }
        const int d = grp_d[gi];
        double e0 = 0.0, e1 = 0.0, e2 = 0.0;
        int terms = 1;
        double wbar = grp_wsum[gi];
        if (efron && d >= 2) {
            for (long long i = grp_first[gi]; i <= k; ++i) {
                if (y[i] == 1) {
                    const double c = we[i], x = xcol[i];
                    e0 += c; e1 += c * x; e2 += c * x * x;
                }
            }
            terms = d;
            wbar /= d;
        }
        for (int l = 0; l < terms; ++l) {
            const double f = (double)l / d;
            const double den = s0 - f * e0;
            const double m1 = s1 - f * e1;
            g -= wbar * m1 / den;
            h += wbar * ((s2 - f * e2) / den - m1 * m1 / (den * den));
            ll -= wbar * log(den);
        }
    }
    epi_block_sum3(g, h, ll);
    if (t == 0) {
        partials[0] = g;
        partials[1] = h;
        partials[2] = ll;
    }
}
