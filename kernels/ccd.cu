// Coordinate step and from-scratch recomputation shared by every model.

// One coordinate's step, on the device (launch <<<1, EPI_BLOCK>>>): g = gconst[j] (or 0) + Σ
// partial gradients, h = Σ partial curvatures; Newton step under the prior, trust region
// |Δ| ≤ bound_j then bound_j = max(2|Δ|, bound_j/2) (crates/core/src/model/ccd.rs). Writes Δ to *delta (read by
// the model's update kernel), β_j += Δ, the running KKT violation, and state[0] = 1 on NaN/∞.
extern "C" __global__ void PREC(ccd_step)(
    int j,
    const double* __restrict__ gconst,
    const double* __restrict__ partials,
    int n_partials,
    const int* __restrict__ prior_kind,
    const double* __restrict__ prior_param,
    double* __restrict__ beta,
    double* __restrict__ bound,
    double* __restrict__ delta,
    double* __restrict__ max_violation,
    int* __restrict__ state)
{
    double g = 0.0, h = 0.0, unused = 0.0;
    for (int b = threadIdx.x; b < n_partials; b += EPI_BLOCK) {
        g += partials[3 * b];
        h += partials[3 * b + 1];
    }
    epi_block_sum3(g, h, unused);
    if (threadIdx.x != 0) return;
    if (gconst != nullptr) g += gconst[j];
    if (!isfinite(g) || !isfinite(h)) {
        state[0] = 1;
        *delta = 0.0;
        return;
    }
    const int kind = prior_kind[j];
    const double param = prior_param[j];
    const double b = beta[j];
    *max_violation = fmax(*max_violation, ccd_kkt_violation(kind, param, b, g));
    double d = ccd_newton_step(kind, param, b, g, h);
    d = fmin(fmax(d, -bound[j]), bound[j]);
    bound[j] = fmax(2.0 * fabs(d), bound[j] / 2.0);
    *delta = d;
    beta[j] = b + d;
}

// η = offset (or 0): the start of the from-scratch recomputation.
extern "C" __global__ void PREC(eta_reset)(int n, const double* __restrict__ offset, double* __restrict__ eta) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        eta[k] = offset == nullptr ? 0.0 : offset[k];
    }
}

// η += β_j x_j over column j's nonzeros (its rows are distinct: no races).
extern "C" __global__ void PREC(eta_add_column)(
    int j,
    const long long* __restrict__ col_ptr,
    const int* __restrict__ row_idx,
    const VAL_T* __restrict__ vals,
    const long long* __restrict__ val_off,
    const double* __restrict__ beta,
    double* __restrict__ eta)
{
    const double bj = beta[j];
    if (bj == 0.0) return;
    const VAL_T* cv = epi_column_values(vals, val_off, j);
    const long long lo = col_ptr[j], hi = col_ptr[j + 1];
    for (long long i = lo + blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += (long long)gridDim.x * blockDim.x) {
        eta[row_idx[i]] += bj * epi_value(cv, i - lo);
    }
}
