// A whole CCD fit with the kernels of kernels/{ccd,sccs,cox}.cu on host threads, launched in the
// same sequence as crates/cuda/src/device.rs (gradient → ccd_step → update per coordinate; η from
// scratch and LL once per cycle; gradient (KKT) convergence), compared with the CPU optimum.
#include "shim.h"
#include <cstdio>
#include <fstream>
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

int main(int argc, char** argv) {
    int failures = 0;
    for (int c = 1; c < argc; ++c) {
        std::ifstream in(argv[c]);
        std::map<std::string, std::vector<double>> a;
        std::string name;
        size_t n;
        while (in >> name >> n) {
            std::vector<double> v(n);
            for (auto& x : v) in >> x;
            a[name] = v;
        }
        auto I = [&](const char* k) { return std::vector<int>(a[k].begin(), a[k].end()); };
        auto L = [&](const char* k) { return std::vector<long long>(a[k].begin(), a[k].end()); };
        auto P = [&](const char* k) -> double* { return a[k].empty() ? nullptr : a[k].data(); };
        const bool sccs = a["model"][0] == 0;
        std::vector<long long> col_ptr = L("col_ptr"), val_off = L("val_off");
        std::vector<int> row_idx = I("row_idx");
        const int p = (int)col_ptr.size() - 1;
        const int rows = sccs ? (int)a["tw"].size() : (int)a["w"].size();
        std::vector<double> beta(p, 0.0), bound(p, 2.0), partials(3 * 1024), eta(rows), aux(rows), den, xcol(rows);
        std::vector<int> prior_kind(p, (int)a["prior"][0]);
        std::vector<double> prior_param(p, a["prior"][1]);
        double delta = 0, maxv = 0;
        int state = 0;
        // SCCS arrays
        std::vector<long long> strat_ptr = L("strat_ptr"), col_run_ptr = L("col_run_ptr"), run_lo = L("run_lo"), run_hi = L("run_hi");
        std::vector<int> run_stratum = I("run_stratum");
        const int n_strata = sccs ? (int)a["nsum"].size() : (int)a["n_strata"][0];
        den.assign(n_strata + 1, 0.0);
        // risk-set arrays
        std::vector<int> stratum = I("stratum"), y = I("y"), grp = I("grp"), grp_d = I("grp_d");
        std::vector<long long> grp_first = L("grp_first");
        std::vector<double> ctot(3 * n_strata + 3);
        const int efron = sccs ? 0 : (int)a["efron"][0];
        double* vals = P("vals");

        auto recompute = [&]() {
            launch(grid_for(rows), EPI_BLOCK, [&] { eta_reset_f64(rows, P("offset"), eta.data()); });
            for (int j = 0; j < p; ++j)
                launch(grid_for(col_ptr[j + 1] - col_ptr[j]), EPI_BLOCK, [&] {
                    eta_add_column_f64(j, col_ptr.data(), row_idx.data(), vals, val_off.data(), beta.data(), eta.data());
                });
            double ll = 0;
            if (sccs) {
                unsigned g = grid_for(n_strata);
                launch(g, EPI_BLOCK, [&] {
                    sccs_recompute_f64(n_strata, strat_ptr.data(), P("tw"), P("yw"), P("nsum"), eta.data(), aux.data(), den.data(), partials.data());
                });
                for (unsigned b = 0; b < g; ++b) ll += partials[3 * b + 2];
            } else {
                launch(grid_for(rows), EPI_BLOCK, [&] { risk_set_recompute_f64(rows, P("w"), eta.data(), aux.data()); });
                launch(1, EPI_BLOCK, [&] {
                    risk_set_gradient_f64(rows, efron, stratum.data(), y.data(), P("w"), eta.data(), aux.data(), xcol.data(),
                                          P("comp_scale"), grp.data(), grp_first.data(), grp_d.data(), P("grp_wsum"), P("grp_G"),
                                          ctot.data(), partials.data());
                });
                ll = partials[2];
            }
            return ll;
        };
        double ll = recompute();
        int cycles = 0;
        for (; cycles < 100000; ++cycles) {
            maxv = 0;
            for (int j = 0; j < p; ++j) {
                if (sccs) {
                    unsigned g = grid_for(col_run_ptr[j + 1] - col_run_ptr[j]);
                    launch(g, EPI_BLOCK, [&] {
                        sccs_gradient_f64(j, col_ptr.data(), vals, val_off.data(), row_idx.data(), col_run_ptr.data(), run_lo.data(),
                                          run_hi.data(), run_stratum.data(), aux.data(), den.data(), P("nsum"), partials.data());
                    });
                    launch(1, EPI_BLOCK, [&] {
                        ccd_step_f64(j, P("gconst"), partials.data(), (int)g, prior_kind.data(), prior_param.data(), beta.data(),
                                     bound.data(), &delta, &maxv, &state);
                    });
                    launch(g, EPI_BLOCK, [&] {
                        sccs_update_f64(j, &delta, col_ptr.data(), vals, val_off.data(), row_idx.data(), col_run_ptr.data(),
                                        run_lo.data(), run_hi.data(), run_stratum.data(), P("tw"), eta.data(), aux.data(), den.data());
                    });
                } else {
                    unsigned g = grid_for(col_ptr[j + 1] - col_ptr[j]);
                    launch(g, EPI_BLOCK, [&] {
                        risk_set_scatter_f64(j, col_ptr.data(), row_idx.data(), vals, val_off.data(), xcol.data());
                    });
                    launch(1, EPI_BLOCK, [&] {
                        risk_set_gradient_f64(rows, efron, stratum.data(), y.data(), P("w"), eta.data(), aux.data(), xcol.data(),
                                              P("comp_scale"), grp.data(), grp_first.data(), grp_d.data(), P("grp_wsum"),
                                              P("grp_G"), ctot.data(), partials.data());
                    });
                    launch(1, EPI_BLOCK, [&] {
                        ccd_step_f64(j, nullptr, partials.data(), 1, prior_kind.data(), prior_param.data(), beta.data(),
                                     bound.data(), &delta, &maxv, &state);
                    });
                    launch(g, EPI_BLOCK, [&] {
                        risk_set_update_f64(j, &delta, col_ptr.data(), row_idx.data(), vals, val_off.data(), P("w"), eta.data(),
                                            aux.data(), xcol.data());
                    });
                }
            }
            if (state) break;
            ll = recompute();
            if (maxv < 1e-10) break;
        }
        const auto& want = a["want_beta"];
        bool ok = !state;
        double worst = 0;
        for (int j = 0; j < p; ++j) worst = fmax(worst, fabs(beta[j] - want[j]) / (1 + fabs(want[j])));
        ok = ok && worst < 1e-8 && fabs(ll - a["want_ll"][0]) <= 1e-8 * (1 + fabs(ll));
        std::printf("%s %s: %s, %d cycles, max rel |Δβ| %.2e, LL %.12g (cpu %.12g)\n", ok ? "ok  " : "FAIL", argv[c],
                    sccs ? "sccs" : "risk set", cycles + 1, worst, ll, a["want_ll"][0]);
        failures += !ok;
    }
    return failures != 0;
}
