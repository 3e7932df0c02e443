//! The host emulation of the kernels, inside `cargo test` (`kernels/host_emulation/`: the
//! `.cu` sources themselves compiled by g++, one host thread per CUDA thread, a barrier for
//! `__syncthreads`). Two checks:
//!
//! * `risk_set.cpp`: the fused risk-set scan on 24 layouts (Cox and Fine–Gray, strata,
//!   weights, Breslow and Efron) against the brute-force reference of [`crate::layout`].
//! * `ccd.cpp`: the device's coordinate stepper (the launches of `device.rs` per operation)
//!   as a process that [`EmulatedStepper`] drives through the core's one CCD driver
//!   ([`ccd::drive`]): the same driver, from the CPU's [`LikelihoodStepper`] and from the
//!   emulated device, gives the same statuses, iterations and iterates (to rounding) — with
//!   the active set, retries after NaN/∞ and every classic rule.
//!
//! Needs g++ ≥ 11 (C++20 `<barrier>`); without one the tests say SKIPPED, except under CI
//! (`CI` set), where they fail.

use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use crate::layout::{reference, RiskSetLayout, SccsLayout};
use epifusion_core::error::Result;
use epifusion_core::model::ccd::{self, CcdOptions, CcdResult, Convergence, FitStatus};
use epifusion_core::model::design::{DesignBuilder, DesignMatrix, OutcomeRecord};
use epifusion_core::model::prior::{Prior, PriorSet};
use epifusion_core::model::risk_set::test_support::{build, random_records, Spec};
use epifusion_core::model::stepper::{CoordinateStepper, LikelihoodStepper};
use epifusion_core::model::{cpu_likelihood, LikelihoodOptions, ModelKind, Ties};
use std::fmt::Write as _;

fn line<T: std::fmt::LowerExp>(out: &mut String, name: &str, v: &[T]) {
    let _ = write!(out, "{name} {}", v.len());
    for x in v {
        let _ = write!(out, " {x:e}");
    }
    out.push('\n');
}

fn dump_risk_set_cases(dir: &str) -> Vec<String> {
    let mut files = Vec::new();
    let mut case = 0;
    for (seed, n, fine_gray, strata) in [
        (1, 60, false, 1),
        (2, 700, false, 4),
        (3, 60, true, 1),
        (4, 2000, true, 7),
    ] {
        let spec = Spec {
            n,
            p: 3,
            strata,
            weights: true,
            counting: false,
            fine_gray,
            offset: false,
        };
        let (recs, covs) = random_records(spec, seed);
        let x = build(&recs, &covs);
        let kind = if fine_gray {
            ModelKind::FineGray
        } else {
            ModelKind::Cox
        };
        let l = RiskSetLayout::build(&x, kind).unwrap();
        let beta = [0.3, -0.2, 0.5];
        let eta = reference::eta(&l.csc, &l.offset, n, &beta);
        let we: Vec<f64> = (0..n).map(|k| l.w[k] * eta[k].exp()).collect();
        for ties in [Ties::Breslow, Ties::Efron] {
            for j in [None, Some(0), Some(2)] {
                let mut xcol = vec![0.0; n];
                if let Some(j) = j {
                    for (k, v) in l.csc.column(j) {
                        xcol[k] = v;
                    }
                }
                let want = reference::risk_set(&l, &beta, j, ties);
                let mut s = String::new();
                line(&mut s, "efron", &[i32::from(ties == Ties::Efron)]);
                line(&mut s, "n_strata", &[l.n_strata]);
                line(&mut s, "stratum", &l.stratum);
                line(&mut s, "y", &l.y);
                line(&mut s, "w", &l.w);
                line(&mut s, "eta", &eta);
                line(&mut s, "we", &we);
                line(&mut s, "xcol", &xcol);
                line(&mut s, "comp_scale", &l.comp_scale);
                line(&mut s, "grp", &l.grp);
                line(&mut s, "grp_first", &l.grp_first);
                line(&mut s, "grp_d", &l.grp_d);
                line(&mut s, "grp_wsum", &l.grp_wsum);
                line(&mut s, "grp_G", &l.grp_g);
                line(&mut s, "want", &want);
                let file = format!("{dir}/risk_set_case{case}.txt");
                std::fs::write(&file, s).unwrap();
                files.push(file);
                case += 1;
            }
        }
    }
    files
}

/// The layout of `kind` on `x` with its priors, as `ccd.cpp` reads it.
fn dump_layout(file: &str, kind: ModelKind, ties: Ties, x: &DesignMatrix, priors: &PriorSet) {
    let (kinds, params): (Vec<i32>, Vec<f64>) = priors
        .per_coef
        .iter()
        .map(|p| match *p {
            Prior::None => (0, 0.0),
            Prior::Laplace { lambda } => (1, lambda),
            Prior::Normal { variance } => (2, variance),
        })
        .unzip();
    let mut s = String::new();
    line(&mut s, "prior_kind", &kinds);
    line(&mut s, "prior_param", &params);
    let csc = if kind == ModelKind::ConditionalPoisson {
        let l = SccsLayout::build(x).unwrap();
        line(&mut s, "model", &[0]);
        line(&mut s, "strat_ptr", &l.strat_ptr);
        line(&mut s, "tw", &l.tw);
        line(&mut s, "yw", &l.yw);
        line(&mut s, "offset", &l.offset);
        line(&mut s, "nsum", &l.nsum);
        line(&mut s, "col_run_ptr", &l.col_run_ptr);
        line(&mut s, "run_lo", &l.run_lo);
        line(&mut s, "run_hi", &l.run_hi);
        line(&mut s, "run_stratum", &l.run_stratum);
        line(&mut s, "gconst", &l.gconst);
        l.csc
    } else {
        let l = RiskSetLayout::build(x, kind).unwrap();
        line(&mut s, "model", &[1]);
        line(&mut s, "efron", &[i32::from(ties == Ties::Efron)]);
        line(&mut s, "n_strata", &[l.n_strata]);
        line(&mut s, "stratum", &l.stratum);
        line(&mut s, "y", &l.y);
        line(&mut s, "w", &l.w);
        line(&mut s, "offset", &l.offset);
        line(&mut s, "comp_scale", &l.comp_scale);
        line(&mut s, "grp", &l.grp);
        line(&mut s, "grp_first", &l.grp_first);
        line(&mut s, "grp_d", &l.grp_d);
        line(&mut s, "grp_wsum", &l.grp_wsum);
        line(&mut s, "grp_G", &l.grp_g);
        l.csc
    };
    line(&mut s, "col_ptr", &csc.col_ptr);
    line(&mut s, "row_idx", &csc.row_idx);
    line(&mut s, "val_off", &csc.val_off);
    line(&mut s, "vals", &csc.vals);
    std::fs::write(file, s).unwrap();
}

/// The device's stepper emulated on host threads: `ccd.cpp` as a child process, one
/// operation per line (the protocol is in `ccd.cpp`'s header).
struct EmulatedStepper {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    p: usize,
}

impl EmulatedStepper {
    fn spawn(exe: &str, layout: &str, p: usize) -> Self {
        let mut child = Command::new(exe)
            .arg(layout)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        EmulatedStepper {
            child,
            stdin,
            stdout,
            p,
        }
    }

    /// Send one operation, return the reply's numbers (f64 bits; the NaN flag as is).
    fn call(&mut self, op: &str) -> Vec<u64> {
        writeln!(self.stdin, "{op}").unwrap();
        self.stdin.flush().unwrap();
        let mut reply = String::new();
        self.stdout.read_line(&mut reply).unwrap();
        assert!(!reply.is_empty(), "ccd.cpp ended on `{op}`");
        reply
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect()
    }
}

fn bits(v: &[f64]) -> String {
    v.iter().map(|x| format!(" {}", x.to_bits())).collect()
}

fn coords_arg(coords: &[usize]) -> String {
    let mut s = format!(" {}", coords.len());
    for j in coords {
        let _ = write!(s, " {j}");
    }
    s
}

impl CoordinateStepper for EmulatedStepper {
    fn n_coef(&self) -> usize {
        self.p
    }

    fn start(&mut self, beta: &[f64], bound0: f64) -> Result<f64> {
        let r = self.call(&format!("start{}", bits(&[bound0]) + &bits(beta)));
        Ok(f64::from_bits(r[0]))
    }

    fn cycle(
        &mut self,
        coords: &[usize],
        beta: &mut [f64],
        updates: &mut u64,
    ) -> Result<Option<f64>> {
        let r = self.call(&format!("cycle{}", coords_arg(coords)));
        assert_eq!(r.len(), 2 + self.p);
        for (b, &x) in beta.iter_mut().zip(&r[2..]) {
            *b = f64::from_bits(x);
        }
        *updates += coords.len() as u64;
        Ok((r[0] == 0).then(|| f64::from_bits(r[1])))
    }

    fn refresh(&mut self) -> Result<f64> {
        Ok(f64::from_bits(self.call("refresh")[0]))
    }

    fn gradients(&mut self, coords: &[usize]) -> Result<Vec<f64>> {
        let r = self.call(&format!("gradients{}", coords_arg(coords)));
        Ok(r.into_iter().map(f64::from_bits).collect())
    }

    fn finish(&mut self, _beta: Option<&[f64]>) -> Result<()> {
        Ok(())
    }
}

impl Drop for EmulatedStepper {
    fn drop(&mut self) {
        // ccd.cpp ends at the end of its input.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// g++ (or `$CXX`), when it runs; `None` (after saying SKIPPED) where it does not, except
/// under CI.
fn cxx() -> Option<String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    if Command::new(&cxx).arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs {cxx} (≥ 11) for the host emulation of the kernels"
        );
        println!("SKIPPED host emulation of the kernels: no {cxx}");
        return None;
    }
    Some(cxx)
}

/// A fresh directory for one test's files.
fn scratch(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("epi_emulation_{}_{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.to_string_lossy().to_string()
}

/// Compile `kernels/host_emulation/<source>` with g++ into `dir`; returns the program.
fn compile(cxx: &str, dir: &str, source: &str) -> String {
    let src_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels/host_emulation");
    let exe = format!("{dir}/{}", source.trim_end_matches(".cpp"));
    let out = Command::new(cxx)
        .args([
            "-std=c++20",
            "-O1",
            "-pthread",
            "-Wall",
            "-Wno-unknown-pragmas",
        ])
        .arg(format!("{src_dir}/{source}"))
        .args(["-o", &exe])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cxx} {source} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

#[test]
fn risk_set_kernel_on_host_threads_agrees_with_the_reference() {
    let Some(cxx) = cxx() else { return };
    let dir = scratch("risk_set");
    let exe = compile(&cxx, &dir, "risk_set.cpp");
    let cases = dump_risk_set_cases(&dir);
    let out = Command::new(&exe).args(&cases).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("risk_set.cpp: {text}");
    assert!(
        out.status.success(),
        "host emulation of risk_set.cpp failed:\n{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// One problem for both steppers.
struct Problem {
    what: String,
    kind: ModelKind,
    ties: Ties,
    x: DesignMatrix,
    priors: PriorSet,
}

/// The same driver on the CPU stepper and on the emulated device: the same status and
/// iterations, iterates and objectives to rounding. Returns (CPU, emulated).
fn both(exe: &str, dir: &str, pr: &Problem, opts: &CcdOptions) -> (CcdResult, CcdResult) {
    let p = pr.x.n_cols();
    let beta0 = vec![0.0; p];
    let mut lik = cpu_likelihood(pr.kind, &pr.x, LikelihoodOptions { ties: pr.ties }).unwrap();
    let cpu = ccd::drive(
        &mut LikelihoodStepper::new(lik.as_mut(), &pr.priors),
        &pr.priors,
        &beta0,
        None,
        opts,
    )
    .unwrap();
    let layout = format!("{dir}/layout.txt");
    dump_layout(&layout, pr.kind, pr.ties, &pr.x, &pr.priors);
    let mut emulated = EmulatedStepper::spawn(exe, &layout, p);
    let dev = ccd::drive(&mut emulated, &pr.priors, &beta0, None, opts).unwrap();
    let what = format!("{} {:?}", pr.what, opts.convergence);
    println!(
        "{what}: {:?} after {} iterations (cpu), {:?} after {} (emulated device)",
        cpu.status, cpu.iterations, dev.status, dev.iterations
    );
    assert_eq!(cpu.status, dev.status, "{what}");
    assert_eq!(cpu.iterations, dev.iterations, "{what}");
    assert_eq!(
        cpu.objective_trace.len(),
        dev.objective_trace.len(),
        "{what}"
    );
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-8 * (1.0 + a.abs().max(b.abs()));
    // An ill-conditioned attempt's β is wherever the non-finite value stopped it (the CPU
    // stops at that coordinate, the device finishes the cycle): only the status counts.
    if cpu.status != FitStatus::IllConditioned {
        for (j, (a, b)) in cpu.beta.iter().zip(&dev.beta).enumerate() {
            assert!(close(*a, *b), "{what}: β[{j}] {a} (cpu) vs {b} (emulated)");
            assert_eq!(*a == 0.0, *b == 0.0, "{what}: zero pattern at {j}");
        }
        for (a, b) in cpu.objective_trace.iter().zip(&dev.objective_trace) {
            assert!(
                close(*a, *b),
                "{what}: objective {a} (cpu) vs {b} (emulated)"
            );
        }
        assert!(close(cpu.log_likelihood, dev.log_likelihood), "{what}: LL");
    }
    (cpu, dev)
}

fn random_problem(
    kind: ModelKind,
    ties: Ties,
    seed: u64,
    n: usize,
    p: usize,
    strata: u64,
    prior: Prior,
) -> Problem {
    let spec = Spec {
        n,
        p,
        strata,
        weights: true,
        counting: false,
        fine_gray: kind == ModelKind::FineGray,
        offset: kind == ModelKind::ConditionalPoisson,
    };
    let (recs, covs) = random_records(spec, seed);
    let mut excluded = vec![false; p];
    excluded[0] = true;
    Problem {
        what: format!("{kind:?} {ties:?} seed {seed} {prior:?}"),
        kind,
        ties,
        x: build(&recs, &covs),
        priors: PriorSet::new(prior, &excluded),
    }
}

/// Seeded SCCS, Cox (Breslow, Efron) and Fine–Gray problems with no prior, a Laplace
/// prior (one unpenalized column) and a Normal prior, under the gradient and objective
/// rules: the CPU's optimum from the emulated device, by the same driver.
#[test]
fn one_driver_on_the_cpu_and_the_emulated_device_agree() {
    let Some(cxx) = cxx() else { return };
    let dir = scratch("ccd");
    let exe = compile(&cxx, &dir, "ccd.cpp");
    let tight = CcdOptions {
        convergence: Convergence::Gradient,
        tolerance: 1e-10,
        max_iterations: 100_000,
        ..Default::default()
    };
    for (kind, ties, seed, n, strata) in [
        (ModelKind::ConditionalPoisson, Ties::Breslow, 21, 300, 40),
        (ModelKind::Cox, Ties::Breslow, 22, 400, 3),
        (ModelKind::Cox, Ties::Efron, 23, 400, 3),
        (ModelKind::FineGray, Ties::Efron, 24, 500, 4),
    ] {
        for prior in [
            Prior::None,
            Prior::Laplace { lambda: 3.0 },
            Prior::Normal { variance: 0.5 },
        ] {
            let pr = random_problem(kind, ties, seed, n, 4, strata, prior);
            let (cpu, _) = both(&exe, &dir, &pr, &tight);
            assert_eq!(cpu.status, FitStatus::Converged, "{}", pr.what);
        }
        let pr = random_problem(
            kind,
            ties,
            seed,
            n,
            4,
            strata,
            Prior::Laplace { lambda: 3.0 },
        );
        let objective = CcdOptions {
            convergence: Convergence::Objective,
            ..CcdOptions::default()
        };
        both(&exe, &dir, &pr, &objective);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Laplace prior that zeroes most coefficients: the driver's active set changes the
/// sequence of cycles (fewer coordinate updates), and the emulated device follows it.
#[test]
fn the_active_set_drives_the_emulated_device() {
    let Some(cxx) = cxx() else { return };
    let dir = scratch("active");
    let exe = compile(&cxx, &dir, "ccd.cpp");
    for (kind, ties, seed) in [
        (ModelKind::Cox, Ties::Efron, 31),
        (ModelKind::ConditionalPoisson, Ties::Breslow, 32),
    ] {
        let pr = random_problem(
            kind,
            ties,
            seed,
            300,
            10,
            30,
            Prior::Laplace { lambda: 6.0 },
        );
        let opts = CcdOptions {
            convergence: Convergence::Gradient,
            tolerance: 1e-9,
            ..CcdOptions::default()
        };
        let (with, with_dev) = both(&exe, &dir, &pr, &opts);
        let (without, _) = both(
            &exe,
            &dir,
            &pr,
            &CcdOptions {
                active_set: false,
                ..opts
            },
        );
        let zeros = with.beta.iter().filter(|b| **b == 0.0).count();
        assert!(zeros >= 2, "{}: {zeros} zero coefficients", pr.what);
        assert_eq!(
            with.coordinate_updates, with_dev.coordinate_updates,
            "{}",
            pr.what
        );
        assert!(
            with.coordinate_updates < without.coordinate_updates,
            "{}: the active set saved nothing ({} vs {})",
            pr.what,
            with.coordinate_updates,
            without.coordinate_updates
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A monotone Cox likelihood (the only x = 1 on the earliest event of 1000 rows): the
/// first Newton step is about 1000, exp overflows under an initial bound of 10⁴ and 10³,
/// and the driver retries with 10² — on the CPU and on the emulated device alike; with no
/// retries both report ill-conditioning.
#[test]
fn retries_drive_the_emulated_device() {
    let Some(cxx) = cxx() else { return };
    let dir = scratch("retry");
    let exe = compile(&cxx, &dir, "ccd.cpp");
    let n = 1000;
    let mut b = DesignBuilder::new();
    for i in 0..n {
        b.push_outcome(OutcomeRecord {
            row_id: i as i64,
            time: Some(1.0 + i as f64),
            y: f64::from(i % 3 != 2),
            ..Default::default()
        });
        if i == 0 {
            b.push_covariate(i as i64, 1, 1.0);
        }
        if i % 4 == 1 {
            b.push_covariate(i as i64, 2, 1.0);
        }
        if i % 5 == 2 {
            b.push_covariate(i as i64, 3, 0.5 + (i % 7) as f64);
        }
    }
    let pr = Problem {
        what: "monotone Cox".into(),
        kind: ModelKind::Cox,
        ties: Ties::Breslow,
        x: b.build().unwrap(),
        priors: PriorSet::new(Prior::None, &[false; 3]),
    };
    let opts = CcdOptions {
        convergence: Convergence::Objective,
        initial_bound: 1e4,
        max_iterations: 30,
        ..CcdOptions::default()
    };
    let (cpu, dev) = both(&exe, &dir, &pr, &opts);
    assert_ne!(cpu.status, FitStatus::IllConditioned);
    assert_eq!(cpu.beta[0], 100.0, "the third attempt's bound");
    assert_eq!(dev.beta[0], 100.0);
    let no_retry = CcdOptions {
        max_retries: 0,
        ..opts
    };
    let (cpu, _) = both(&exe, &dir, &pr, &no_retry);
    assert_eq!(cpu.status, FitStatus::IllConditioned);
    let _ = std::fs::remove_dir_all(&dir);
}
