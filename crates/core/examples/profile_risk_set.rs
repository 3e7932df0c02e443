//! Where the time of a Cox / Fine–Gray coordinate-descent cycle goes (development aid).
use epifusion_core::bench::{cox_data, fine_gray_data};
use epifusion_core::model::cox::Cox;
use epifusion_core::model::fine_gray::FineGray;
use epifusion_core::model::{Likelihood, Ties};
use std::time::Instant;

fn profile(name: &str, lik: &mut dyn Likelihood, groups: usize) {
    let p = lik.n_coef();
    let mut s = 0.0;
    for j in 0..p {
        s += lik.gradient_hessian(j).0;
    }
    let t = Instant::now();
    for j in 0..p {
        s += lik.gradient_hessian(j).0;
    }
    let walk = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for j in 0..200 {
        lik.update(j, 0.01);
        s += lik.gradient_hessian(j + 1).0;
    }
    let upd = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let beta: Vec<f64> = (0..p).map(|j| if j % 5 == 0 { 0.1 } else { 0.0 }).collect();
    for _ in 0..10 {
        lik.set_beta(&beta);
        s += lik.log_likelihood();
    }
    let setb = t.elapsed().as_secs_f64() / 10.0;
    println!(
        "{name}: G={groups} walk all {p} cols {walk:.4}s ({:.1} us/col); update+refresh+walk {:.1} us; set_beta {setb:.4}s [{s:.1}]",
        walk / p as f64 * 1e6,
        upd / 200.0 * 1e6
    );
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(100_000, |s| s.parse().unwrap());
    let d = cox_data(n, 1000, 0.05, 123).unwrap();
    let mut cox = Cox::new(&d.design, Ties::Breslow).unwrap();
    let g = cox.n_groups();
    profile("cox", &mut cox, g);
    let mut cox = Cox::new(&d.design, Ties::Breslow).unwrap();
    fit_counted("cox", &mut cox, 100.0);
    let d = fine_gray_data(n, 1000, 0.05, 123).unwrap();
    let mut fg = FineGray::new(&d.design, Ties::Breslow).unwrap();
    let g = fg.n_groups();
    profile("fine_gray", &mut fg, g);
    let mut fg = FineGray::new(&d.design, Ties::Breslow).unwrap();
    fit_counted("fine_gray", &mut fg, 100.0);
}

/// Counts what coordinate descent asks of the likelihood.
struct Counting<'a> {
    inner: &'a mut dyn Likelihood,
    grads: u64,
    updates: u64,
    sets: u64,
    t_grad: f64,
    t_upd: f64,
    t_set: f64,
}

impl Likelihood for Counting<'_> {
    fn n_coef(&self) -> usize {
        self.inner.n_coef()
    }
    fn set_beta(&mut self, beta: &[f64]) {
        let t = Instant::now();
        self.sets += 1;
        if std::env::var("TRACE").is_ok() {
            let nz = beta.iter().filter(|b| **b != 0.0).count();
            eprintln!(
                "  set_beta #{}: grads {} updates {} nz {nz}",
                self.sets, self.grads, self.updates
            );
        }
        self.inner.set_beta(beta);
        self.t_set += t.elapsed().as_secs_f64();
    }
    fn log_likelihood(&mut self) -> f64 {
        self.inner.log_likelihood()
    }
    fn gradient_hessian(&mut self, j: usize) -> (f64, f64) {
        let t = Instant::now();
        self.grads += 1;
        let r = self.inner.gradient_hessian(j);
        self.t_grad += t.elapsed().as_secs_f64();
        r
    }
    fn update(&mut self, j: usize, delta: f64) {
        let t = Instant::now();
        self.updates += 1;
        self.inner.update(j, delta);
        self.t_upd += t.elapsed().as_secs_f64();
    }
    fn information(&mut self, cols: &[usize]) -> Vec<f64> {
        let t = Instant::now();
        let r = self.inner.information(cols);
        if std::env::var("TRACE").is_ok() {
            eprintln!(
                "  information k={} {:.4}s",
                cols.len(),
                t.elapsed().as_secs_f64()
            );
        }
        r
    }
    fn polish_max_block(&self) -> usize {
        self.inner.polish_max_block()
    }
    fn approximate_information(&mut self, cols: &[usize]) -> Option<Vec<f64>> {
        let t = Instant::now();
        let r = self.inner.approximate_information(cols);
        if std::env::var("TRACE").is_ok() {
            eprintln!(
                "  approximate information k={} {:.4}s",
                cols.len(),
                t.elapsed().as_secs_f64()
            );
        }
        r
    }
    fn boxed_clone(&self) -> Box<dyn Likelihood> {
        unimplemented!()
    }
}

/// Fit with counters.
pub fn fit_counted(name: &str, lik: &mut dyn Likelihood, lambda: f64) {
    use epifusion_core::model::ccd::{fit, CcdOptions};
    use epifusion_core::model::prior::{Prior, PriorSet};
    let p = lik.n_coef();
    let mut c = Counting {
        inner: lik,
        grads: 0,
        updates: 0,
        sets: 0,
        t_grad: 0.0,
        t_upd: 0.0,
        t_set: 0.0,
    };
    let priors = PriorSet::new(Prior::Laplace { lambda }, &vec![false; p]);
    let t = Instant::now();
    let r = fit(
        &mut c,
        &priors,
        &vec![0.0; p],
        None,
        &CcdOptions::fit_default(),
    )
    .unwrap();
    let nz = r.beta.iter().filter(|b| **b != 0.0).count();
    let l1: f64 = r.beta.iter().map(|b| b.abs()).sum();
    println!(
        "{name}: {:?} {} it {:.3}s obj {:.6} nz {nz}; grads {} ({:.3}s) updates {} ({:.3}s) set_beta {} ({:.3}s)",
        r.status, r.iterations, t.elapsed().as_secs_f64(), r.log_likelihood - lambda * l1,
        c.grads, c.t_grad, c.updates, c.t_upd, c.sets, c.t_set
    );
}
