// The device's coordinate stepper (crates/cuda/src/device.rs, `DeviceStepper`) with the kernels
// of kernels/{ccd,sccs,cox}.cu on host threads: each operation launches the same kernels in the
// same order as the device does. The sequence of operations — cycles, the active set, retries,
// convergence, statuses — is the core's one CCD driver (`ccd::drive`), which runs this program
// through `EmulatedStepper` (crates/cuda/src/emulation.rs) over a line protocol on
// stdin/stdout. Numbers travel as the decimal bits of IEEE doubles (exact both ways).
//
//   start <bound0> <β_0> … <β_{p−1}>   → <LL>
//   cycle <m> <j_1> … <j_m>             → <NaN flag> <largest KKT violation> <β_0> … <β_{p−1}>
//   refresh                             → <LL>
//   gradients <m> <j_1> … <j_m>         → <g_1> … <g_m>
//
// argv[1]: the layout (name, length, values per line; written by the Rust test).
#include "shim.h"
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#define VAL_T double
#define PREC(name) name##_f64
#include "../common.cuh"
#include "../ccd.cu"
#include "../sccs.cu"
#include "../cox.cu"

static unsigned grid_for(long long work) {
    long long b = (work + EPI_BLOCK - 1) / EPI_BLOCK;
    return (unsigned)std::clamp(b, 1LL, 1024LL);
}

static double read_f64() {
    unsigned long long bits = 0;
    std::cin >> bits;
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
}

static void write_f64(double v) {
    unsigned long long bits;
    std::memcpy(&bits, &v, sizeof v);
    std::printf(" %llu", bits);
}

struct Emulated {
    std::map<std::string, std::vector<double>> a;
    bool sccs;
    std::vector<long long> col_ptr, val_off, strat_ptr, col_run_ptr, run_lo, run_hi, grp_first;
    std::vector<int> row_idx, run_stratum, stratum, y, grp, grp_d, prior_kind;
    std::vector<double> prior_param, beta, bound, partials, eta, aux, den, xcol, ctot;
    int p, rows, n_strata, efron;
    double delta = 0, maxv = 0, zero = 0;
    int state = 0;

    std::vector<int> I(const char* k) { return std::vector<int>(a[k].begin(), a[k].end()); }
    std::vector<long long> L(const char* k) { return std::vector<long long>(a[k].begin(), a[k].end()); }
    double* P(const char* k) { return a[k].empty() ? nullptr : a[k].data(); }

    explicit Emulated(const char* file) {
        std::ifstream in(file);
        std::string name;
        size_t n;
        while (in >> name >> n) {
            std::vector<double> v(n);
            for (auto& x : v) in >> x;
            a[name] = v;
        }
        sccs = a["model"][0] == 0;
        col_ptr = L("col_ptr");
        val_off = L("val_off");
        row_idx = I("row_idx");
        p = (int)col_ptr.size() - 1;
        rows = sccs ? (int)a["tw"].size() : (int)a["w"].size();
        beta.assign(p, 0.0);
        bound.assign(p, 0.0);
        partials.assign(3 * 1024, 0.0);
        eta.assign(rows, 0.0);
        aux.assign(rows, 0.0);
        xcol.assign(rows, 0.0);
        prior_kind = I("prior_kind");
        prior_param = a["prior_param"];
        strat_ptr = L("strat_ptr");
        col_run_ptr = L("col_run_ptr");
        run_lo = L("run_lo");
        run_hi = L("run_hi");
        run_stratum = I("run_stratum");
        n_strata = sccs ? (int)a["nsum"].size() : (int)a["n_strata"][0];
        den.assign(n_strata + 1, 0.0);
        stratum = I("stratum");
        y = I("y");
        grp = I("grp");
        grp_d = I("grp_d");
        grp_first = L("grp_first");
        ctot.assign(3 * n_strata + 3, 0.0);
        efron = sccs ? 0 : (int)a["efron"][0];
    }

    double* vals() { return P("vals"); }

    void risk_set_gradient() {
        launch(1, EPI_BLOCK, [&] {
            risk_set_gradient_f64(rows, efron, stratum.data(), y.data(), P("w"), eta.data(), aux.data(), xcol.data(),
                                  P("comp_scale"), grp.data(), grp_first.data(), grp_d.data(), P("grp_wsum"), P("grp_G"),
                                  ctot.data(), partials.data());
        });
    }

    // `refresh` of the device: η from scratch, then the model's state and LL.
    double refresh() {
        launch(grid_for(rows), EPI_BLOCK, [&] { eta_reset_f64(rows, P("offset"), eta.data()); });
        for (int j = 0; j < p; ++j)
            launch(grid_for(col_ptr[j + 1] - col_ptr[j]), EPI_BLOCK, [&] {
                eta_add_column_f64(j, col_ptr.data(), row_idx.data(), vals(), val_off.data(), beta.data(), eta.data());
            });
        double ll = 0;
        if (sccs) {
            unsigned g = grid_for(n_strata);
            launch(g, EPI_BLOCK, [&] {
                sccs_recompute_f64(n_strata, strat_ptr.data(), P("tw"), P("yw"), P("nsum"), eta.data(), aux.data(), den.data(),
                                   partials.data());
            });
            for (unsigned b = 0; b < g; ++b) ll += partials[3 * b + 2];
        } else {
            launch(grid_for(rows), EPI_BLOCK, [&] { risk_set_recompute_f64(rows, P("w"), eta.data(), aux.data()); });
            risk_set_gradient();
            ll = partials[2];
        }
        return ll;
    }

    // `launch_gradient` of the device: column j's partials; returns the number of blocks.
    unsigned launch_gradient(int j) {
        if (sccs) {
            unsigned g = grid_for(col_run_ptr[j + 1] - col_run_ptr[j]);
            launch(g, EPI_BLOCK, [&] {
                sccs_gradient_f64(j, col_ptr.data(), vals(), val_off.data(), row_idx.data(), col_run_ptr.data(), run_lo.data(),
                                  run_hi.data(), run_stratum.data(), aux.data(), den.data(), P("nsum"), partials.data());
            });
            return g;
        }
        launch(grid_for(col_ptr[j + 1] - col_ptr[j]), EPI_BLOCK, [&] {
            risk_set_scatter_f64(j, col_ptr.data(), row_idx.data(), vals(), val_off.data(), xcol.data());
        });
        risk_set_gradient();
        return 1;
    }

    // `launch_update` of the device with the step *d.
    void launch_update(int j, const double* d) {
        if (sccs) {
            launch(grid_for(col_run_ptr[j + 1] - col_run_ptr[j]), EPI_BLOCK, [&] {
                sccs_update_f64(j, d, col_ptr.data(), vals(), val_off.data(), row_idx.data(), col_run_ptr.data(), run_lo.data(),
                                run_hi.data(), run_stratum.data(), P("tw"), eta.data(), aux.data(), den.data());
            });
        } else {
            launch(grid_for(col_ptr[j + 1] - col_ptr[j]), EPI_BLOCK, [&] {
                risk_set_update_f64(j, d, col_ptr.data(), row_idx.data(), vals(), val_off.data(), P("w"), eta.data(), aux.data(),
                                    xcol.data());
            });
        }
    }

    // `coordinate` of the device: gradient → ccd_step → update.
    void coordinate(int j) {
        const unsigned g = launch_gradient(j);
        launch(1, EPI_BLOCK, [&] {
            ccd_step_f64(j, sccs ? P("gconst") : nullptr, partials.data(), (int)g, prior_kind.data(), prior_param.data(),
                         beta.data(), bound.data(), &delta, &maxv, &state);
        });
        launch_update(j, &delta);
    }

    // `gradient` of the device: partials summed in block order; risk sets clear xcol.
    double gradient(int j) {
        const unsigned n = launch_gradient(j);
        double g = 0;
        for (unsigned b = 0; b < n; ++b) g += partials[3 * b];
        if (sccs) return a["gconst"][j] + g;
        launch_update(j, &zero);
        return g;
    }
};

static std::vector<int> read_coords() {
    size_t m = 0;
    std::cin >> m;
    std::vector<int> js(m);
    for (auto& j : js) std::cin >> j;
    return js;
}

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: ccd <layout file>\n");
        return 2;
    }
    Emulated e(argv[1]);
    std::string op;
    while (std::cin >> op) {
        if (op == "start") {
            const double bound0 = read_f64();
            for (auto& b : e.beta) b = read_f64();
            e.bound.assign(e.p, bound0);
            e.state = 0;
            write_f64(e.refresh());
        } else if (op == "cycle") {
            e.maxv = 0;
            for (int j : read_coords()) e.coordinate(j);
            std::printf(" %d", e.state);
            write_f64(e.maxv);
            for (double b : e.beta) write_f64(b);
        } else if (op == "refresh") {
            write_f64(e.refresh());
        } else if (op == "gradients") {
            for (int j : read_coords()) write_f64(e.gradient(j));
        } else {
            std::fprintf(stderr, "unknown operation `%s`\n", op.c_str());
            return 2;
        }
        std::printf("\n");
        std::fflush(stdout);
    }
    return 0;
}
