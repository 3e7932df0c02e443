//! `epifusion bench`: a timed fit on seeded synthetic data or a benchmark folder.

use super::*;

#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// cox, fine_gray or sccs.
    #[arg(long, value_parser = parse_model)]
    pub(crate) model: ModelKind,
    /// Rows (cox, fine_gray) or cases (sccs).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) n: usize,
    /// Covariates (drugs for sccs).
    #[arg(long, default_value_t = 1000)]
    pub(crate) p: usize,
    /// Density of the indicator covariates (cox, fine_gray).
    #[arg(long, default_value_t = 0.05)]
    pub(crate) density: f64,
    /// Laplace λ [100 for cox and fine_gray, 3 for sccs].
    #[arg(long)]
    pub(crate) lambda: Option<f64>,
    /// Threads [1].
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// Ties for cox / fine_gray: breslow or efron.
    #[arg(long, default_value = "breslow", value_parser = parse_ties)]
    pub(crate) ties: Ties,
    /// Stopping rule: optimality (the fitting functions' default), gradient or objective.
    #[arg(long, default_value = "optimality", value_parser = parse_convergence)]
    pub(crate) convergence: Convergence,
    /// Convergence tolerance.
    #[arg(long, default_value_t = 1e-6)]
    pub(crate) tolerance: f64,
    /// Generator seed.
    #[arg(long, default_value_t = 123)]
    pub(crate) seed: u64,
    /// Load a benchmark directory (outcomes_cox / outcomes_fgr / outcomes + covariates
    /// .parquet) instead of generating data.
    #[arg(long)]
    pub(crate) data: Option<PathBuf>,
    /// auto, cpu or cuda (auto uses the CPU until the CUDA kernels are verified on a GPU).
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub(crate) device: Device,
    /// Storage precision of the design on the GPU: f64, or f32 with f64 accumulation.
    #[arg(long, default_value = "f64", value_parser = parse_precision)]
    pub(crate) precision: Precision,
    /// Only generate / load the data and report its size (no fit).
    #[arg(long)]
    pub(crate) generate_only: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also time a K-fold auto-search cross-validation of the Laplace variance (seed 1)
    /// against the single fit.
    #[arg(long)]
    pub(crate) cv_folds: Option<usize>,
    /// Also time the profile-likelihood 95% interval of this covariate id, fitted unpenalized
    /// (the others keep the Laplace prior), against the single fit.
    #[arg(long)]
    pub(crate) profile_covariate: Option<i64>,
    /// Visit every coordinate in every cycle (no active-set cycles between full cycles).
    #[arg(long)]
    pub(crate) no_active_set: bool,
    /// Also time a regularization path of this many λ values, log-spaced from λ_max down to
    /// the benchmark's λ (warm starts, strong rule), against the single fit at that λ.
    #[arg(long)]
    pub(crate) path: Option<usize>,
    /// With --path: fit every coordinate at every λ (no strong-rule screening).
    #[arg(long)]
    pub(crate) no_strong_rule: bool,
}

/// Reference CPU seconds: Cyclops 3.7.0's fit time, one thread, re-measured on the development
/// machine's CPU (DESIGN.md §10) for (model, N), P = 1000. N = 1e6 is scaled from the original
/// CPU's 121 / 405 s by the N = 1e5 ratio (4.84 / 5.2); SCCS 1e6 likewise (5.6 s there).
pub(crate) fn reference_seconds(model: ModelKind, n: usize) -> Option<f64> {
    match (model, n) {
        (ModelKind::Cox, 100_000) => Some(4.84),
        (ModelKind::Cox, 1_000_000) => Some(112.0),
        (ModelKind::FineGray, 100_000) => Some(21.15),
        (ModelKind::FineGray, 1_000_000) => Some(375.0),
        (ModelKind::ConditionalPoisson, 100_000) => Some(0.22),
        (ModelKind::ConditionalPoisson, 1_000_000) => Some(5.2),
        _ => None,
    }
}

pub(crate) fn load_bench_dir(dir: &Path, model: ModelKind) -> Result<DesignMatrix> {
    let outcomes = match model {
        ModelKind::Cox => "outcomes_cox.parquet",
        ModelKind::FineGray => "outcomes_fgr.parquet",
        _ => "outcomes.parquet",
    };
    let read = ReadOptions {
        require_time: true,
        ..Default::default()
    };
    let (b, _) = convert::read_long(&dir.join(outcomes), &dir.join("covariates.parquet"), &read)
        .with_context(|| format!("loading {}", dir.display()))?;
    Ok(b.build()?)
}

pub(crate) fn run_bench(a: &BenchArgs) -> Result<()> {
    let lambda = a.lambda.unwrap_or(match a.model {
        ModelKind::ConditionalPoisson => 3.0,
        _ => 100.0,
    });
    let started = Instant::now();
    let design = match &a.data {
        Some(dir) => load_bench_dir(dir, a.model)?,
        None => {
            let data = match a.model {
                ModelKind::Cox => epifusion::bench::cox_data(a.n, a.p, a.density, a.seed)?,
                ModelKind::FineGray => {
                    epifusion::bench::fine_gray_data(a.n, a.p, a.density, a.seed)?
                }
                ModelKind::ConditionalPoisson => epifusion::bench::sccs_data(a.n, a.p, a.seed)?,
                other => bail!(
                    "bench supports cox, fine_gray and sccs (got {})",
                    other.name()
                ),
            };
            data.design
        }
    };
    let data_seconds = started.elapsed().as_secs_f64();
    let n_units = match a.model {
        ModelKind::ConditionalPoisson => design.n_strata(),
        _ => design.n_rows(),
    };
    let (n_cols, csc_bytes) = (design.n_cols(), design.csc_bytes());
    let mut out = serde_json::json!({
        "model": a.model.name(),
        "source": a.data.as_ref().map_or("generated".to_string(), |d| d.display().to_string()),
        "seed": a.seed,
        "rows": design.n_rows(),
        "strata": design.n_strata(),
        "columns": design.n_cols(),
        "nnz": design.nnz(),
        "csc_bytes": design.csc_bytes(),
        "rows_with_events": design.rows.y.iter().filter(|&y| y > 0.0).count(),
        "data_seconds": data_seconds,
        "lambda": lambda,
        "ties": format!("{:?}", a.ties).to_lowercase(),
        "threads": a.threads,
    });
    if !a.generate_only {
        let mut opts = FitOptions::new(a.model);
        opts.prior = Prior::Laplace { lambda };
        opts.ties = a.ties;
        opts.ccd.tolerance = a.tolerance;
        opts.ccd.convergence = a.convergence;
        opts.ccd.active_set = !a.no_active_set;
        opts.ci = CiMethod::None;
        opts.threads = Some(a.threads);
        opts.device = a.device;
        opts.precision = a.precision;
        let cpu_before = epifusion::bench::cpu_seconds();
        let mut keep = (a.cv_folds.is_some() || a.profile_covariate.is_some() || a.path.is_some())
            .then(|| design.clone());
        let r = fit_owned(design, &opts)?;
        let fit_seconds = r.fit_seconds;
        // Building the likelihood (sorting the columns etc.) is the rest of the wall time.
        out["setup_seconds"] = (r.seconds - fit_seconds).into();
        if let (Some(a), Some(b)) = (cpu_before, epifusion::bench::cpu_seconds()) {
            out["cpu_seconds"] = (b - a).into();
        }
        let l1: f64 = r.coefficients.iter().map(|c| c.estimate.abs()).sum();
        let nonzero = r.coefficients.iter().filter(|c| c.estimate != 0.0).count();
        out["fit_seconds"] = fit_seconds.into();
        out["total_fit_seconds"] = r.seconds.into();
        out["cycles"] = r.iterations.into();
        out["coordinate_updates"] = r.coordinate_updates.into();
        out["updates_per_second"] = (r.coordinate_updates as f64 / fit_seconds.max(1e-12)).into();
        out["log_likelihood"] = r.log_likelihood.into();
        out["objective"] = (r.log_likelihood - lambda * l1).into();
        out["nonzero"] = nonzero.into();
        out["status"] = r.status.name().into();
        out["device"] = r.device.clone().into();
        if let Some(g) = &r.gpu {
            // Estimated from the kernels' access pattern (no hardware counters); the fit time
            // stops after the stream is synchronized.
            let bytes = g.bytes_per_cycle as f64 * r.iterations as f64;
            let bandwidth = bytes / fit_seconds.max(1e-12);
            out["precision"] = a.precision.suffix().into();
            out["gpu_design_bytes"] = g.design_bytes.into();
            out["gpu_setup_seconds"] = g.setup_seconds.into();
            out["gpu_bytes_per_cycle"] = g.bytes_per_cycle.into();
            out["gpu_effective_bandwidth_gb_s"] = (bandwidth / 1e9).into();
            out["gpu_bandwidth_fraction_of_4_3_tb_s"] = (bandwidth / 4.3e12).into();
        }
        if let Some(note) = &r.device_note {
            eprintln!("{note}");
        }
        let reference = (n_cols == 1000)
            .then(|| reference_seconds(a.model, n_units))
            .flatten();
        if let Some(ref_s) = reference {
            out["reference_seconds"] = ref_s.into();
            out["speedup_vs_reference"] = (ref_s / fit_seconds.max(1e-12)).into();
        }
        if let Some(k) = a.cv_folds {
            let mut o = opts.clone();
            o.cv = Some(CvOptions {
                folds: k,
                ..Default::default()
            });
            // As the SQL functions run it: consuming the design (the last use of it when no
            // profile or path follows), so that the peak memory is the CV's own.
            let last = a.profile_covariate.is_none() && a.path.is_none();
            let design =
                if last { keep.take() } else { keep.clone() }.context("the kept design")?;
            let t = Instant::now();
            let c = fit_owned(design, &o)?;
            let secs = t.elapsed().as_secs_f64();
            let cv = c.cv.as_ref().expect("cv ran");
            out["cv_seconds"] = secs.into();
            out["cv_over_fit"] = (secs / r.seconds.max(1e-12)).into();
            out["cv_variance"] = cv.variance.into();
            out["cv_candidates"] = cv.curve.len().into();
            out["cv_fits"] = cv.fits.into();
            out["cv_stop_reason"] = cv.stop_reason.clone().into();
        }
        if let (Some(id), Some(design)) = (a.profile_covariate, &keep) {
            let mut o = opts.clone();
            o.exclude = vec![id];
            o.ci = CiMethod::None;
            let t = Instant::now();
            epifusion::fit::fit(design, &o)?;
            let plain_s = t.elapsed().as_secs_f64();
            o.ci = CiMethod::Profile;
            let t = Instant::now();
            let p = epifusion::fit::fit(design, &o)?;
            let secs = t.elapsed().as_secs_f64();
            let c = p
                .coefficient(id)
                .context("--profile-covariate: no such covariate id")?;
            out["profile_covariate"] = id.into();
            out["profile_fit_seconds"] = plain_s.into();
            out["profile_total_seconds"] = secs.into();
            out["profile_seconds"] = (secs - plain_s).into();
            out["profile_estimate"] = c.estimate.into();
            out["profile_ci"] = serde_json::json!([c.ci_lower, c.ci_upper]);
        }
        if let (Some(n), Some(design)) = (a.path, &keep) {
            use epifusion::model::path::{PathGrid, PathOptions};
            let mut o = opts.clone();
            // λ_max first (a one-point path: the fit of the unpenalized coefficients).
            o.path = Some(PathOptions {
                grid: PathGrid::Log {
                    n: 1,
                    min_ratio: None,
                },
                strong_rule: true,
            });
            let lambda_max = epifusion::fit::fit(design, &o)?
                .path
                .context("a path")?
                .lambda_max;
            if lambda >= lambda_max {
                bail!("--path: λ = {lambda} is not below λ_max = {lambda_max}");
            }
            o.path = Some(PathOptions {
                grid: PathGrid::Log {
                    n,
                    min_ratio: Some(lambda / lambda_max),
                },
                strong_rule: !a.no_strong_rule,
            });
            let cpu_before = epifusion::bench::cpu_seconds();
            let t = Instant::now();
            let p = epifusion::fit::fit(design, &o)?;
            let secs = t.elapsed().as_secs_f64();
            let path = p.path.as_ref().context("a path")?;
            if let (Some(a), Some(b)) = (cpu_before, epifusion::bench::cpu_seconds()) {
                out["path_cpu_seconds"] = (b - a).into();
            }
            let last = path.points.last().context("a path point")?;
            let gap = r
                .coefficients
                .iter()
                .zip(&last.beta)
                .map(|(c, b)| (c.estimate - b).abs())
                .fold(0.0, f64::max);
            out["path_lambdas"] = path.points.len().into();
            out["path_lambda_max"] = lambda_max.into();
            out["path_strong_rule"] = path.strong_rule.into();
            out["path_seconds"] = path.seconds.into();
            out["path_total_seconds"] = secs.into();
            out["path_over_fit"] = (path.seconds / fit_seconds.max(1e-12)).into();
            out["path_iterations"] = path
                .points
                .iter()
                .map(|q| q.iterations)
                .sum::<usize>()
                .into();
            out["path_kkt_refits"] = path
                .points
                .iter()
                .map(|q| q.kkt_refits)
                .sum::<usize>()
                .into();
            out["path_mean_strong_set"] = (path.points.iter().map(|q| q.strong_set).sum::<usize>()
                as f64
                / path.points.len() as f64)
                .into();
            out["path_coordinate_updates"] = path.coordinate_updates.into();
            out["path_converged"] = path
                .points
                .iter()
                .filter(|q| q.status == epifusion::model::ccd::FitStatus::Converged)
                .count()
                .into();
            out["path_last_objective"] = (last.log_likelihood + last.log_prior).into();
            out["path_last_nonzero"] = last.non_zero.into();
            out["path_last_max_gap_to_fit"] = gap.into();
        }
    }
    let rss = epifusion::bench::peak_rss_bytes();
    out["peak_rss_bytes"] = rss.into();
    if let Some(rss) = rss {
        out["peak_rss_over_csc"] = (rss as f64 / csc_bytes.max(1) as f64).into();
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_bench_text(&out);
    }
    Ok(())
}

pub(crate) fn print_bench_text(v: &serde_json::Value) {
    let mib = |b: &serde_json::Value| b.as_f64().map(|b| format!("{:.1} MiB", b / 1048576.0));
    let f = |k: &str| v.get(k).cloned().unwrap_or(serde_json::Value::Null);
    let line = |label: &str, value: Option<String>| {
        if let Some(value) = value {
            println!("{label:<24}{value}");
        }
    };
    let num = |k: &str| f(k).as_f64();
    line("model", f("model").as_str().map(String::from));
    line("source", f("source").as_str().map(String::from));
    line("rows", num("rows").map(|x| format!("{x}")));
    line("strata", num("strata").map(|x| format!("{x}")));
    line("columns", num("columns").map(|x| format!("{x}")));
    line("nnz", num("nnz").map(|x| format!("{x}")));
    line(
        "rows with events",
        num("rows_with_events").map(|x| format!("{x}")),
    );
    line("CSC bytes", mib(&f("csc_bytes")));
    line(
        "generate/load",
        num("data_seconds").map(|s| format!("{s:.3} s")),
    );
    line("λ", num("lambda").map(|x| format!("{x}")));
    line("threads", num("threads").map(|x| format!("{x}")));
    line("ties", f("ties").as_str().map(String::from));
    line("setup", num("setup_seconds").map(|s| format!("{s:.3} s")));
    line("fit", num("fit_seconds").map(|s| format!("{s:.3} s")));
    line(
        "CPU (setup + fit)",
        num("cpu_seconds").map(|s| format!("{s:.3} s")),
    );
    line("cycles", num("cycles").map(|x| format!("{x}")));
    line(
        "coordinate updates/s",
        num("updates_per_second").map(|x| format!("{x:.0}")),
    );
    line(
        "log-likelihood",
        num("log_likelihood").map(|x| format!("{x:.6}")),
    );
    line("objective", num("objective").map(|x| format!("{x:.6}")));
    line("non-zero", num("nonzero").map(|x| format!("{x}")));
    line("status", f("status").as_str().map(String::from));
    line("device", f("device").as_str().map(String::from));
    line(
        "GPU traffic",
        num("gpu_bytes_per_cycle").map(|b| {
            format!(
                "{:.1} MiB/cycle (estimated), {:.1} GB/s = {:.1}% of 4.3 TB/s, precision {}",
                b / 1048576.0,
                num("gpu_effective_bandwidth_gb_s").unwrap_or(0.0),
                100.0 * num("gpu_bandwidth_fraction_of_4_3_tb_s").unwrap_or(0.0),
                f("precision").as_str().unwrap_or("f64")
            )
        }),
    );
    line(
        "CV",
        num("cv_seconds").map(|s| {
            format!(
                "{s:.3} s ({:.1}× the fit)",
                num("cv_over_fit").unwrap_or(0.0)
            )
        }),
    );
    line(
        "CV variance",
        num("cv_variance").map(|x| {
            format!(
                "{x:.6e} ({} candidates, {} fits)",
                num("cv_candidates").unwrap_or(0.0),
                num("cv_fits").unwrap_or(0.0)
            )
        }),
    );
    line(
        "profile CI",
        num("profile_seconds").map(|s| {
            format!(
                "{s:.3} s (fit {:.3} s), interval {}",
                num("profile_fit_seconds").unwrap_or(0.0),
                f("profile_ci")
            )
        }),
    );
    line(
        "path",
        num("path_seconds").map(|s| {
            format!(
                "{} λ from λ_max {:.4e}: {s:.3} s ({:.1}× the fit), {} iterations, {} KKT \
                 refits, mean strong set {:.1}, last objective {:.6}, max |Δβ| to the fit {:.2e}",
                num("path_lambdas").unwrap_or(0.0),
                num("path_lambda_max").unwrap_or(0.0),
                num("path_over_fit").unwrap_or(0.0),
                num("path_iterations").unwrap_or(0.0),
                num("path_kkt_refits").unwrap_or(0.0),
                num("path_mean_strong_set").unwrap_or(0.0),
                num("path_last_objective").unwrap_or(0.0),
                num("path_last_max_gap_to_fit").unwrap_or(0.0),
            )
        }),
    );
    line("peak RSS", mib(&f("peak_rss_bytes")));
    line(
        "peak RSS / CSC",
        num("peak_rss_over_csc").map(|x| format!("{x:.2}")),
    );
    if let (Some(r), Some(s)) = (num("reference_seconds"), num("speedup_vs_reference")) {
        line(
            "vs reference CPU",
            Some(format!("speed-up {s:.2}× (reference {r} CPU-s)")),
        );
    }
}
