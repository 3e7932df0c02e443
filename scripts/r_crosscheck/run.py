#!/usr/bin/env python3
"""Fit every case written by gen.R with `epifusion fit` and compare with R (see gen.R).

    python3 scripts/r_crosscheck/run.py BINARY CASES_DIR [case ...]

Prints per case: status, iterations, max |Δβ|, max relative Δ of the model and robust SEs and of
`std_error`, |ΔLL| (Poisson's LL differs by R's constant Σ log y!), and flags differences above
1e-6 (β) / 1e-5 (SE). glmnet's Cox cases are flagged by design (gen.R).
"""
import csv, json, math, os, subprocess, sys, tempfile

binary, cases_dir = sys.argv[1], sys.argv[2]
only = set(sys.argv[3:])
out_dir = tempfile.mkdtemp(prefix="r_crosscheck_")
nan = float("nan")


def as_list(v):
    return v if isinstance(v, list) or v is None else [v]


def rel(rows, key, ref):
    if not ref:
        return nan
    return max(abs(float(r[key] or "nan") / s - 1) for r, s in zip(rows, ref))


for c in json.load(open(os.path.join(cases_dir, "cases.json"))):
    if only and c["name"] not in only:
        continue
    out = os.path.join(out_dir, c["name"] + ".csv")
    cmd = [binary, "fit", "--model", c["model"], "--outcomes",
           os.path.join(cases_dir, c["name"] + ".csv"), "--options", json.dumps(c["options"]),
           "--output", out]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        print(f"{c['name']:28s} FAILED: {p.stderr.strip()[:300]}")
        continue
    rows = list(csv.DictReader(open(out)))
    # R lists the intercept first; gen.R moves it last, as here.
    rows = [r for r in rows if r["covariate_id"]] + [r for r in rows if not r["covariate_id"]]
    coef, se, rse = as_list(c["coef"]), as_list(c.get("se")), as_list(c.get("se_robust"))
    dc = max(abs(float(r["estimate"]) - b) for r, b in zip(rows, coef))
    d_model, d_rob = rel(rows, "std_error_model", se if not rse else None), rel(rows, "std_error_robust", rse)
    d_std = rel(rows, "std_error", rse or se)
    ll = c.get("ll")
    dll = abs(float(rows[0]["log_likelihood"]) - ll) if isinstance(ll, (int, float)) else nan
    bad = dc > 1e-6 or any(x > 1e-5 for x in (d_model, d_rob, d_std) if not math.isnan(x))
    print(f"{c['name']:28s} {rows[0]['status']:10s} it={rows[0]['iterations']:>3s} "
          f"dβ {dc:.1e} dse_model {d_model:.1e} dse_robust {d_rob:.1e} dstd {d_std:.1e} "
          f"dLL {dll:.1e} {c.get('ref', '')}{'  <-- differs' if bad else ''}")
