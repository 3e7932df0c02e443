// Runs kernels/cox.cu's risk_set_gradient on host threads over the cases written by
// `cargo test -p epifusion-cuda emulation` (crates/cuda/src/emulation.rs) and compares with the Rust reference.
#include "shim.h"
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#define VAL_T double
#define PREC(name) name##_f64
#include "../common.cuh"
#include "../cox.cu"

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
        auto ints = [&](const char* k) {
            std::vector<int> v(a[k].begin(), a[k].end());
            return v;
        };
        auto longs = [&](const char* k) {
            std::vector<long long> v(a[k].begin(), a[k].end());
            return v;
        };
        auto ptr = [&](const char* k) -> const double* { return a[k].empty() ? nullptr : a[k].data(); };
        const int rows = (int)a["w"].size();
        std::vector<int> stratum = ints("stratum"), y = ints("y"), grp = ints("grp"), grp_d = ints("grp_d");
        std::vector<long long> grp_first = longs("grp_first");
        std::vector<double> ctot(3 * (size_t)a["n_strata"][0] + 3), partials(3 * 1024);
        const int efron = (int)a["efron"][0];
        launch(1, EPI_BLOCK, [&] {
            risk_set_gradient_f64(rows, efron, stratum.data(), y.data(), ptr("w"), ptr("eta"), ptr("we"),
                                  ptr("xcol"), ptr("comp_scale"), grp.data(), grp_first.data(), grp_d.data(),
                                  ptr("grp_wsum"), ptr("grp_G"), ctot.data(), partials.data());
        });
        const auto& want = a["want"];
        bool ok = true;
        for (int m = 0; m < 3; ++m) {
            const double tol = 1e-10 * (1 + fmax(fabs(want[m]), fabs(partials[m])));
            if (!(fabs(partials[m] - want[m]) <= tol)) ok = false;
        }
        std::printf("%s %s: got (%.12g, %.12g, %.12g) want (%.12g, %.12g, %.12g)\n", ok ? "ok  " : "FAIL", argv[c],
                    partials[0], partials[1], partials[2], want[0], want[1], want[2]);
        failures += !ok;
    }
    return failures != 0;
}
