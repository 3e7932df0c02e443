// Self-controlled case series (conditional Poisson), DESIGN.md §5 and paper 000 §2.4.
//
// Rows in the model's internal order (stratum, row id); stratum s holds rows
// strat_ptr[s]..strat_ptr[s+1]. Per row: tw = t·w (interval length × weight), yw = y·w, η and
// te = tw·exp(η). Per stratum: n_s = Σ yw and D_s = Σ te. Column j's entries are split into
// *runs*, one per stratum it touches: runs col_run_ptr[j]..col_run_ptr[j+1], run r covering
// entries run_lo[r]..run_hi[r] (global entry indices) of stratum run_stratum[r]. A run is
// owned by one thread, so updates of D_s need no atomics; per coordinate the work is O(nnz_j).

// Fused per-stratum transform–reduce for column j: per run, N = Σ te x, N2 = Σ te x²,
// p = N/D_s; the block's partial gradient −Σ n_s p and curvature Σ n_s (N2/D_s − p²).
// (g_j = Σ yw x − Σ_s n_s p_s; the constant Σ yw x comes in `gconst` of ccd_step.)
extern "C" __global__ void __launch_bounds__(EPI_BLOCK) PREC(sccs_gradient)(
    int j,
    const long long* __restrict__ col_ptr,
    const VAL_T* __restrict__ vals,
    const long long* __restrict__ val_off,
    const int* __restrict__ row_idx,
    const long long* __restrict__ col_run_ptr,
    const long long* __restrict__ run_lo,
    const long long* __restrict__ run_hi,
    const int* __restrict__ run_stratum,
    const double* __restrict__ te,
    const double* __restrict__ den,
    const double* __restrict__ nsum,
    double* __restrict__ partials)
{
    const VAL_T* cv = epi_column_values(vals, val_off, j);
    const long long c0 = col_ptr[j];
    double g = 0.0, h = 0.0, unused = 0.0;
    for (long long r = col_run_ptr[j] + blockIdx.x * (long long)EPI_BLOCK + threadIdx.x; r < col_run_ptr[j + 1];
         r += (long long)gridDim.x * EPI_BLOCK) {
        double n1 = 0.0, n2 = 0.0;
        for (long long i = run_lo[r]; i < run_hi[r]; ++i) {
            const double x = epi_value(cv, i - c0);
            const double c = te[row_idx[i]] * x;
            n1 += c;
            n2 += c * x;
        }
        const int s = run_stratum[r];
        const double d = den[s], n = nsum[s];
        const double p = n1 / d;
        g -= n * p;
        h += n * (n2 / d - p * p);
    }
    epi_block_sum3(g, h, unused);
    if (threadIdx.x == 0) {
        partials[3 * blockIdx.x] = g;
        partials[3 * blockIdx.x + 1] = h;
        partials[3 * blockIdx.x + 2] = 0.0;
    }
}

// β_j += Δ (Δ = *delta, written by ccd_step): η += Δx, te = tw·exp(η) and D_s += Σ Δte for the
// runs of column j. Nothing to do when Δ = 0 (the common case under a Laplace prior).
extern "C" __global__ void __launch_bounds__(EPI_BLOCK) PREC(sccs_update)(
    int j,
    const double* __restrict__ delta,
    const long long* __restrict__ col_ptr,
    const VAL_T* __restrict__ vals,
    const long long* __restrict__ val_off,
    const int* __restrict__ row_idx,
    const long long* __restrict__ col_run_ptr,
    const long long* __restrict__ run_lo,
    const long long* __restrict__ run_hi,
    const int* __restrict__ run_stratum,
    const double* __restrict__ tw,
    double* __restrict__ eta,
    double* __restrict__ te,
    double* __restrict__ den)
{
    const double d = *delta;
    if (d == 0.0) return;
    const VAL_T* cv = epi_column_values(vals, val_off, j);
    const long long c0 = col_ptr[j];
    for (long long r = col_run_ptr[j] + blockIdx.x * (long long)EPI_BLOCK + threadIdx.x; r < col_run_ptr[j + 1];
         r += (long long)gridDim.x * EPI_BLOCK) {
        double change = 0.0;
        for (long long i = run_lo[r]; i < run_hi[r]; ++i) {
            const int k = row_idx[i];
            const double e = eta[k] + d * epi_value(cv, i - c0);
            const double nt = tw[k] * exp(e);
            change += nt - te[k];
            eta[k] = e;
            te[k] = nt;
        }
        den[run_stratum[r]] += change;
    }
}

// From scratch, after η was rebuilt (eta_reset + eta_add_column): te = tw·exp(η), D_s = Σ te, and
// the block's part of LL = Σ yw η − Σ_s n_s log D_s in partials[3b + 2].
extern "C" __global__ void __launch_bounds__(EPI_BLOCK) PREC(sccs_recompute)(
    int n_strata,
    const long long* __restrict__ strat_ptr,
    const double* __restrict__ tw,
    const double* __restrict__ yw,
    const double* __restrict__ nsum,
    const double* __restrict__ eta,
    double* __restrict__ te,
    double* __restrict__ den,
    double* __restrict__ partials)
{
    double ll = 0.0, u = 0.0, v = 0.0;
    for (int s = blockIdx.x * EPI_BLOCK + threadIdx.x; s < n_strata; s += gridDim.x * EPI_BLOCK) {
        double d = 0.0, lin = 0.0;
        for (long long k = strat_ptr[s]; k < strat_ptr[s + 1]; ++k) {
            const double t = tw[k] * exp(eta[k]);
            te[k] = t;
            d += t;
            lin += yw[k] * eta[k];
        }
        den[s] = d;
        ll += lin;
        if (nsum[s] > 0.0) ll -= nsum[s] * log(d);
    }
    epi_block_sum3(ll, u, v);
    if (threadIdx.x == 0) {
        partials[3 * blockIdx.x] = 0.0;
        partials[3 * blockIdx.x + 1] = 0.0;
        partials[3 * blockIdx.x + 2] = ll;
    }
}
