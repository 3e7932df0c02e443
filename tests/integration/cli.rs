//! End-to-end tests of the `epifusion` binary: bad input gives clear errors; a fit on the
//! bundled lung data runs once the Cox likelihood exists.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn epifusion(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_epifusion"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run the epifusion binary")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("epifusion-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

const LUNG: &str = "tests/data/survival_lung.csv";

#[test]
fn missing_column_is_named() {
    let o = epifusion(&["fit", "--model", "cox", "--outcomes", LUNG]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("`y`") && e.contains("not found"), "{e}");
    // The long form: a covariate table without covariate_id.
    let dir = temp_dir("missing");
    let oc = write(&dir, "o.csv", "row_id,time,y\n1,2,1\n2,3,0\n");
    let cc = write(&dir, "c.csv", "row_id,covariate\n1,7\n");
    let o = epifusion(&[
        "fit",
        "--model",
        "cox",
        "--outcomes",
        &oc,
        "--covariates",
        &cc,
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("covariate_id") && e.contains("c.csv"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn null_in_required_column_names_row() {
    let dir = temp_dir("null");
    let oc = write(&dir, "o.csv", "rowId,time,y\n1,2,1\n2,3,\n");
    let cc = write(&dir, "c.csv", "rowId,covariateId\n1,7\n");
    let o = epifusion(&[
        "fit",
        "--model",
        "cox",
        "--outcomes",
        &oc,
        "--covariates",
        &cc,
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("`y`") && e.contains("row 2"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_option_and_bad_values_are_clear() {
    let o = epifusion(&["fit", "--model", "cox", "--outcomes", LUNG, "--bogus"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--bogus"), "{}", stderr(&o));
    let o = epifusion(&["fit", "--model", "coxx", "--outcomes", LUNG]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("unknown model `coxx`"),
        "{}",
        stderr(&o)
    );
    let o = epifusion(&[
        "fit",
        "--model",
        "cox",
        "--outcomes",
        LUNG,
        "--lambda",
        "1",
        "--variance",
        "2",
    ]);
    assert!(!o.status.success());
    let o = epifusion(&[
        "fit",
        "--model",
        "cox",
        "--outcomes",
        LUNG,
        "--y",
        "status",
        "--output",
        "r.xlsx",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("r.xlsx"), "{}", stderr(&o));
    let o = epifusion(&["fit", "--model", "cox", "--outcomes", "no/such/file.csv"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no/such/file.csv"), "{}", stderr(&o));
}

#[test]
fn bench_generates_data() {
    let o = epifusion(&[
        "bench",
        "--model",
        "sccs",
        "--n",
        "200",
        "--p",
        "50",
        "--generate-only",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["strata"], 200);
    assert!(v["nnz"].as_u64().unwrap() > 0);
}

/// Runs once the Cox likelihood is merged; until then the fit says "not implemented yet".
#[test]
fn fit_lung_wide_form() {
    let dir = temp_dir("lung");
    let out = dir.join("lung.json").display().to_string();
    let o = epifusion(&[
        "fit",
        "--model",
        "cox",
        "--outcomes",
        LUNG,
        "--y",
        "status",
        "--event-value",
        "2",
        "--covariates-columns",
        "age,sex",
        "--ci",
        "wald",
        "--output",
        &out,
    ]);
    if stderr(&o).contains("not implemented yet") {
        eprintln!("SKIPPED fit_lung_wide_form: the Cox likelihood is not implemented yet");
        return;
    }
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(
        s.contains("age") && s.contains("sex") && s.contains("228 rows"),
        "{s}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    // R: coxph(Surv(time, status) ~ age + sex, lung, ties = "breslow"): sex ≈ −0.513.
    let sex = v[1]["estimate"].as_f64().unwrap();
    assert!((sex + 0.513).abs() < 0.01, "{sex}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cv_bootstrap_and_profiles_from_the_command_line() {
    let dir = temp_dir("selection");
    let out = |n: &str| dir.join(n).display().to_string();
    let o = epifusion(&[
        "fit",
        "--model",
        "cox",
        "--outcomes",
        "tests/data/survival_rossi.csv",
        "--time",
        "week",
        "--y",
        "arrest",
        "--covariates-columns",
        "fin,age,race,wexp,mar,paro,prio",
        "--prior",
        "normal",
        "--cv",
        "--folds",
        "4",
        "--exclude",
        "fin",
        "--bootstrap",
        "20",
        "--profile",
        "1",
        "--profile-grid",
        "--cv-output",
        &out("cv.csv"),
        "--bootstrap-output",
        &out("boot.json"),
        "--profile-output",
        &out("profile.csv"),
        "--output",
        &out("fit.csv"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("cross-validation: variance") && e.contains("bootstrap: 20 replicates"),
        "{e}"
    );
    let cv = std::fs::read_to_string(dir.join("cv.csv")).unwrap();
    let header: Vec<&str> = cv.lines().next().unwrap().split(',').collect();
    let sel = header.iter().position(|h| *h == "selected").unwrap();
    let selected = cv
        .lines()
        .skip(1)
        .filter(|l| l.split(',').nth(sel) == Some("true"))
        .count();
    assert_eq!(selected, 1, "{cv}");
    let boot: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("boot.json")).unwrap()).unwrap();
    assert_eq!(boot.as_array().unwrap().len(), 7);
    assert_eq!(boot[0]["covariate"], "fin");
    assert_eq!(boot[0]["replicates"], 20);
    let profile = std::fs::read_to_string(dir.join("profile.csv")).unwrap();
    assert_eq!(
        profile.lines().count(),
        1 + 1000 + 1,
        "header, grid, estimate"
    );
    // The fitted prior variance is the selected one.
    let fit = std::fs::read_to_string(dir.join("fit.csv")).unwrap();
    assert!(fit.lines().next().unwrap().ends_with("prior_variance"));
    // Mistakes are named.
    let o = epifusion(&[
        "fit",
        "--model",
        "cox",
        "--outcomes",
        LUNG,
        "--y",
        "status",
        "--event-value",
        "2",
        "--cv-grid",
        "0.1",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--cv"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Unknown covariate row ids: the CLI's advice names its own flag, and the flag works.
#[test]
fn unknown_row_ids_advise_the_cli_flag() {
    let dir = temp_dir("unknown-rows");
    let out = write(&dir, "o.csv", "row_id,y\n1,1\n2,0\n3,1\n4,0\n");
    let cov = write(&dir, "c.csv", "row_id,covariate_id\n1,7\n3,7\n4,7\n99,7\n");
    let args = [
        "fit",
        "--model",
        "logistic",
        "--outcomes",
        &out,
        "--covariates",
        &cov,
    ];
    let o = epifusion(&args);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("1 entries refer to row ids with no outcome row (first: row_id 99); pass --drop-unknown-rows"),
        "{err}"
    );
    let mut args = args.to_vec();
    args.push("--drop-unknown-rows");
    let o = epifusion(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("dropped 1 covariate entries with unknown row ids"),
        "{}",
        stderr(&o)
    );
}

/// A covariate id equal to the intercept's marker is rejected, naming the row.
#[test]
fn intercept_marker_is_not_a_covariate_id() {
    let dir = temp_dir("intercept-id");
    let out = write(&dir, "o.csv", "row_id,y\n1,1\n2,0\n");
    let cov = write(
        &dir,
        "c.csv",
        "row_id,covariate_id\n2,-9223372036854775808\n",
    );
    let o = epifusion(&[
        "fit",
        "--model",
        "logistic",
        "--outcomes",
        &out,
        "--covariates",
        &cov,
    ]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("row_id 2") && err.contains("is reserved (it marks the intercept)"),
        "{err}"
    );
}

/// `fit --path N --path-output FILE`: the path table has one row per (λ, coefficient), its
/// first λ is λ_max with only the unpenalized coefficient non-zero, and the printed
/// coefficients are its last point. A fixed λ with a path is refused.
#[test]
fn path_from_the_command_line() {
    let dir = temp_dir("path");
    let out = dir.join("path.csv").display().to_string();
    let args = [
        "fit",
        "--model",
        "cox",
        "--outcomes",
        "tests/data/survival_rossi.csv",
        "--time",
        "week",
        "--y",
        "arrest",
        "--covariates-columns",
        "fin,age,race,wexp,mar,paro,prio",
        "--exclude",
        "fin",
    ];
    let mut with_path = args.to_vec();
    with_path.extend([
        "--path",
        "12",
        "--path-min-ratio",
        "0.01",
        "--path-output",
        &out,
    ]);
    let o = epifusion(&with_path);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("path: 12 λ"), "{}", stderr(&o));
    let csv = std::fs::read_to_string(&out).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(
        header[..5],
        [
            "lambda",
            "covariate_id",
            "estimate",
            "log_likelihood",
            "non_zero"
        ]
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 12 * 7);
    for r in &rows[..7] {
        let nonzero = r[2].parse::<f64>().unwrap() != 0.0;
        assert_eq!(nonzero, r[5] == "fin", "{r:?}");
        assert_eq!(r[4], "1");
    }
    let last_fin: f64 = rows[11 * 7][2].parse().unwrap();
    let printed = stdout(&o);
    let fin_line = printed.lines().find(|l| l.starts_with("fin")).unwrap();
    let fin: f64 = fin_line.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!((fin - last_fin).abs() < 1e-6, "{fin} vs {last_fin}");
    let mut fixed = args.to_vec();
    fixed.extend(["--options", r#"{"path": {"n": 5}, "lambda": 2}"#]);
    let o = epifusion(&fixed);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("lambda") && stderr(&o).contains("path"),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
