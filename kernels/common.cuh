// Shared by every epifusion kernel (prepended to each `.cu` source by `src/backend/cuda`).
//
// The host prepends two lines before this file:
//   #define VAL_T double|float      storage type of the sparse column values
//   #define PREC(name) name##_f64|name##_f32   entry-point suffix
// Everything is accumulated in double whatever VAL_T is (DESIGN.md §6).
//
// Partials: every gradient kernel writes, per block b, partials[3*b + 0..3] =
// (gradient part, curvature part, log-likelihood part); `ccd_step` adds them in block order, so
// results do not depend on scheduling (no floating-point atomics anywhere).

#define EPI_BLOCK 256

// Prior kinds, as in src/model/prior.rs.
#define PRIOR_NONE 0
#define PRIOR_LAPLACE 1
#define PRIOR_NORMAL 2

// Design matrix in CSC over the model's internal row order: column j's entries are
// col_ptr[j]..col_ptr[j+1] of row_idx; its values start at vals[val_off[j]], or val_off[j] < 0
// for an indicator column (0/1: no values stored).
__device__ __forceinline__ const VAL_T* epi_column_values(const VAL_T* vals, const long long* val_off, int j) {
    return val_off[j] < 0 ? nullptr : vals + val_off[j];
}

// Value of the column's i-th entry (i counted from the column start).
__device__ __forceinline__ double epi_value(const VAL_T* __restrict__ cv, long long i) {
    return cv == nullptr ? 1.0 : (double)cv[i];
}

// Deterministic block-wide sum of three doubles (blockDim.x == EPI_BLOCK); the result is valid
// in thread 0.
__device__ __forceinline__ void epi_block_sum3(double& a, double& b, double& c) {
    __shared__ double sa[EPI_BLOCK], sb[EPI_BLOCK], sc[EPI_BLOCK];
    const int t = threadIdx.x;
    sa[t] = a; sb[t] = b; sc[t] = c;
    __syncthreads();
    for (int s = EPI_BLOCK / 2; s > 0; s >>= 1) {
        if (t < s) {
            sa[t] += sa[t + s]; sb[t] += sb[t + s]; sc[t] += sc[t + s];
        }
        __syncthreads();
    }
    a = sa[0]; b = sb[0]; c = sc[0];
}

// The unclipped Newton step of one coordinate under its prior: the same arithmetic as
// `newton_step` in src/model/ccd.rs.
__device__ __forceinline__ double ccd_newton_step(int kind, double param, double beta, double g, double h) {
    if (kind == PRIOR_NORMAL) {
        return (g - beta / param) / (h + 1.0 / param);
    }
    if (h <= 0.0) return 0.0;
    if (kind == PRIOR_NONE) return g / h;
    const double lambda = param;
    if (beta == 0.0) {
        const double up = (g - lambda) / h;
        if (up > 0.0) return up;
        const double down = (g + lambda) / h;
        if (down < 0.0) return down;
        return 0.0;
    }
    const double s = beta > 0.0 ? 1.0 : -1.0;
    const double d = (g - lambda * s) / h;
    return (beta + d) * s < 0.0 ? -beta : d;
}

// Optimality (KKT) violation of one coordinate: `kkt_violation` in src/model/ccd.rs.
__device__ __forceinline__ double ccd_kkt_violation(int kind, double param, double beta, double g) {
    if (kind == PRIOR_NONE) return fabs(g);
    if (kind == PRIOR_NORMAL) return fabs(g - beta / param);
    if (beta == 0.0) return fmax(fabs(g) - param, 0.0);
    return fabs(g - param * (beta > 0.0 ? 1.0 : -1.0));
}
