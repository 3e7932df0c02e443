# Cross-check of epifusion's fits against R (survival, cmprsk, glmnet, gnm) on R's own data sets
# and seeded simulations: writes one wide-form CSV per case and cases.json (model, options,
# reference coefficients / SEs / log-likelihood). `run.py` fits every case with `epifusion fit`
# and prints the largest differences. A developer tool, not part of the test suite (it needs R):
#
#   apt-get install r-base-core r-cran-survival r-cran-cmprsk r-cran-glmnet r-cran-gnm
#   Rscript scripts/r_crosscheck/gen.R /tmp/rx && python3 scripts/r_crosscheck/run.py target/release/epifusion /tmp/rx
#
# References are R's defaults except the stopping rules: crr (gtol = 1e-14: its default 1e-6
# stops up to ~1e-5 short of its own optimum on tied data) and glm (epsilon = 1e-15: its default
# 1e-8 leaves the SEs ~2e-5 off). glmnet's Cox is not an exact reference: its solution misses the
# Breslow KKT conditions by up to ~10 % (ours meets them: the score / n is ±λ exactly) and at
# λ → 0 it is 2.5e-4 from coxph; its logistic and Poisson fits are exact. Poisson's LL differs
# by R's constant Σ log y!.
suppressMessages({library(survival); library(cmprsk); library(glmnet); library(gnm)})
args <- commandArgs(trailingOnly = TRUE)
out <- if (length(args)) args[1] else "r_crosscheck_cases"; dir.create(out, showWarnings = FALSE)
cases <- list()
wcsv <- function(name, df) write.csv(df, file.path(out, paste0(name, ".csv")), row.names = FALSE, na = "")
addcase <- function(name, model, data, options, coef, se, se_robust = NULL, ll = NA, ref = "") {
  wcsv(name, data)
  cases[[length(cases) + 1]] <<- list(name = name, model = model, options = options, ref = ref,
    coef = unname(coef), se = if (is.null(se)) NULL else unname(se), se_robust = if (is.null(se_robust)) NULL else unname(se_robust), ll = ll)
}
num <- function(df) { for (n in names(df)) df[[n]] <- as.numeric(df[[n]]); df }
coxcase <- function(name, fit, X, extra, ties, robust = FALSE, options = list()) {
  d <- num(data.frame(extra, X, check.names = FALSE))
  options$ties <- ties; options$ci <- "wald"
  if (robust) options$se <- "robust"
  rse <- if (robust) sqrt(diag(fit$var)) else NULL
  mse <- if (robust) sqrt(diag(fit$naive.var)) else sqrt(diag(fit$var))
  addcase(name, "cox", d, options, coef(fit), mse, rse, fit$loglik[2])
}
# ---- Cox
l <- na.omit(lung[, c("time","status","age","sex","ph.ecog","ph.karno","wt.loss")])
for (ties in c("efron","breslow")) {
  f <- coxph(Surv(time, status == 2) ~ age + sex + ph.ecog + ph.karno + wt.loss, data = l, ties = ties)
  coxcase(paste0("lung_", ties), f, l[, c("age","sex","ph.ecog","ph.karno","wt.loss")], data.frame(time = l$time, y = as.integer(l$status == 2)), ties)
}
v <- veteran; X <- model.matrix(~ trt + celltype + karno + diagtime + age + prior, v)[, -1]
f <- coxph(Surv(time, status) ~ trt + celltype + karno + diagtime + age + prior, v)
coxcase("veteran_efron", f, X, data.frame(time = v$time, y = v$status), "efron")
f <- coxph(Surv(time, status) ~ trt + karno + age + strata(celltype), v)
coxcase("veteran_strata", f, v[, c("trt","karno","age")], data.frame(time = v$time, y = v$status, stratum_id = as.integer(v$celltype)), "efron")
p <- pbc[!is.na(pbc$trt), ]
f <- coxph(Surv(time, status == 2) ~ age + edema + log(bili) + log(albumin) + log(protime), p)
X <- data.frame(age = p$age, edema = p$edema, lbili = log(p$bili), lalb = log(p$albumin), lpro = log(p$protime))
coxcase("pbc_efron", f, X, data.frame(time = p$time, y = as.integer(p$status == 2)), "efron")
# counting process + cluster
g <- cgd
f <- coxph(Surv(tstart, tstop, status) ~ treat + sex + age + inherit + steroids + propylac, g, cluster = id)
X <- model.matrix(~ treat + sex + age + inherit + steroids + propylac, g)[, -1]
coxcase("cgd_cluster", f, X, data.frame(start_time = g$tstart, time = g$tstop, y = g$status, cluster_id = g$id), "efron", robust = TRUE)
h <- heart
for (ties in c("efron","breslow")) {
  f <- coxph(Surv(start, stop, event) ~ age + year + surgery + transplant, h, ties = ties)
  coxcase(paste0("heart_", ties), f, data.frame(age = h$age, year = h$year, surgery = h$surgery, transplant = as.numeric(as.character(h$transplant))), data.frame(start_time = h$start, time = h$stop, y = h$event), ties)
}
b <- bladder2
f <- coxph(Surv(start, stop, event) ~ rx + number + size + strata(enum), b, cluster = id)
coxcase("bladder2_strata_cluster", f, b[, c("rx","number","size")], data.frame(start_time = b$start, time = b$stop, y = b$event, stratum_id = b$enum, cluster_id = b$id), "efron", robust = TRUE)
r <- rats
f <- coxph(Surv(time, status) ~ rx + cluster(litter), r, ties = "breslow")
coxcase("rats_cluster_breslow", f, r[, c("rx"), drop = FALSE], data.frame(time = r$time, y = r$status, cluster_id = r$litter), "breslow", robust = TRUE)
f <- coxph(Surv(time, status) ~ rx, r, robust = TRUE)
coxcase("rats_robust_rows", f, r[, c("rx"), drop = FALSE], data.frame(time = r$time, y = r$status), "efron", robust = TRUE)
k <- kidney
f <- coxph(Surv(time, status) ~ age + sex + disease, k, cluster = id)
X <- model.matrix(~ age + sex + disease, k)[, -1]
coxcase("kidney_cluster", f, X, data.frame(time = k$time, y = k$status, cluster_id = k$id), "efron", robust = TRUE)
# weights (case weights) and offsets
set.seed(7); w <- sample(1:3, nrow(l), replace = TRUE)
f <- coxph(Surv(time, status == 2) ~ age + sex + ph.ecog, l, weights = w)
coxcase("lung_weights_int", f, l[, c("age","sex","ph.ecog")], data.frame(time = l$time, y = as.integer(l$status == 2), weight = w), "efron")
w2 <- runif(nrow(l), 0.2, 2)
f <- coxph(Surv(time, status == 2) ~ age + sex + ph.ecog, l, weights = w2, robust = TRUE)
coxcase("lung_weights_frac_robust", f, l[, c("age","sex","ph.ecog")], data.frame(time = l$time, y = as.integer(l$status == 2), weight = w2), "efron", robust = TRUE)
o <- l$ph.karno / 100
f <- coxph(Surv(time, status == 2) ~ age + sex + offset(o), l)
coxcase("lung_offset", f, l[, c("age","sex")], data.frame(time = l$time, y = as.integer(l$status == 2), offset = o), "efron")
# heavy ties: times in months
lt <- l; lt$time <- ceiling(lt$time / 30.4)
for (ties in c("efron","breslow")) {
  f <- coxph(Surv(time, status == 2) ~ age + sex + ph.ecog + wt.loss, lt, ties = ties)
  coxcase(paste0("lung_months_", ties), f, lt[, c("age","sex","ph.ecog","wt.loss")], data.frame(time = lt$time, y = as.integer(lt$status == 2)), ties)
}
co <- colon[colon$etype == 2, ]; co <- na.omit(co[, c("time","status","rx","sex","age","obstruct","perfor","adhere","nodes","differ","extent","surg")])
f <- coxph(Surv(time, status) ~ rx + sex + age + obstruct + perfor + adhere + nodes + differ + extent + surg, co)
X <- model.matrix(~ rx + sex + age + obstruct + perfor + adhere + nodes + differ + extent + surg, co)[, -1]
coxcase("colon_death", f, X, data.frame(time = co$time, y = co$status), "efron")
# ---- Fine-Gray (crr)
fgcase <- function(name, ftime, fstatus, X, failcode = 1) {
  f <- crr(ftime, fstatus, as.matrix(X), failcode = failcode, cencode = 0, gtol = 1e-14, maxiter = 200)
  y <- ifelse(fstatus == 0, 0, ifelse(fstatus == failcode, 1, 2))
  d <- num(data.frame(time = ftime, y = y, X, check.names = FALSE))
  addcase(name, "fine_gray", d, list(ci = "wald"), f$coef, sqrt(diag(f$var)), sqrt(diag(f$var)), f$loglik)
}
p2 <- pbc[!is.na(pbc$trt), ]
X <- data.frame(age = p2$age, edema = p2$edema, lbili = log(p2$bili), lalb = log(p2$albumin))
fgcase("pbc_fg_death", p2$time, p2$status, X, failcode = 2)
fgcase("pbc_fg_tx", p2$time, p2$status, X, failcode = 1)
m <- na.omit(mgus2[, c("age","sex","hgb","creat","ptime","pstat","futime","death")])
et <- ifelse(m$pstat == 0, m$futime, m$ptime); ev <- ifelse(m$pstat == 0, 2 * m$death, 1)
fgcase("mgus2_fg", et, ev, data.frame(age = m$age, male = as.numeric(m$sex == "M"), hgb = m$hgb, creat = m$creat))
set.seed(3); n <- 400; x1 <- rnorm(n); x2 <- rbinom(n, 1, .4); tt <- ceiling(rexp(n, exp(.3 * x1)) * 10)
st <- sample(0:2, n, replace = TRUE, prob = c(.3, .4, .3))
fgcase("sim_fg_ties", tt, st, data.frame(x1 = x1, x2 = x2))
# ---- GLMs
inf <- infert
f <- glm(case ~ spontaneous + induced + age + parity, binomial, inf, control = glm.control(epsilon = 1e-15, maxit = 100))
addcase("infert_logistic", "logistic", num(data.frame(y = inf$case, inf[, c("spontaneous","induced","age","parity")])), list(ci = "wald"), coef(f)[c(2:5, 1)], sqrt(diag(vcov(f)))[c(2:5, 1)], NULL, as.numeric(logLik(f)))
f <- clogit(case ~ spontaneous + induced + strata(stratum), inf, method = "approximate")
addcase("infert_clogit", "conditional_logistic", num(data.frame(y = inf$case, stratum_id = inf$stratum, inf[, c("spontaneous","induced")])), list(ci = "wald"), coef(f), sqrt(diag(f$var)), NULL, f$loglik[2])
set.seed(5); n <- 300; a <- rnorm(n); b <- rbinom(n, 1, .5); expo <- runif(n, 1, 5); cnt <- rpois(n, expo * exp(-1 + .4 * a + .3 * b))
f <- glm(cnt ~ a + b + offset(log(expo)), poisson, control = glm.control(epsilon = 1e-15, maxit = 100))
X <- cbind(1, a, b); mu <- fitted(f); B <- solve(t(X) %*% (X * mu)); M <- t(X) %*% (X * (cnt - mu)^2); hc0 <- sqrt(diag(B %*% M %*% B))
addcase("sim_poisson_offset", "poisson", data.frame(time = expo, y = cnt, a = a, b = b), list(ci = "wald", se = "robust"), coef(f)[c(2, 3, 1)], sqrt(diag(vcov(f)))[c(2, 3, 1)], hc0[c(2, 3, 1)], as.numeric(logLik(f)))
# ---- penalized fits (glmnet: its λ = our λ / n) and conditional models
l2 <- na.omit(lung[, c("time","status","age","sex","ph.ecog","ph.karno","wt.loss")])
l <- l2; X <- as.matrix(l[, 3:7]); n <- nrow(X); y <- Surv(l$time, as.integer(l$status == 2))
for (lg in c(0.02, 0.05)) {
  f <- glmnet(X, y, family = "cox", lambda = lg, standardize = FALSE, thresh = 1e-20, maxit = 1e7)
  addcase(sprintf("lung_cox_lasso_%g", lg), "cox", data.frame(time = l$time, y = as.integer(l$status == 2), X),
    list(prior = "laplace", lambda = lg * n, ci = "none"), as.numeric(coef(f)), NULL, NULL, NA, "glmnet")
}
f <- glmnet(X, y, family = "cox", lambda = 0.1, alpha = 0, standardize = FALSE, thresh = 1e-20, maxit = 1e7)
addcase("lung_cox_ridge", "cox", data.frame(time = l$time, y = as.integer(l$status == 2), X),
  list(prior = "normal", variance = 1 / (0.1 * n), ci = "none"), as.numeric(coef(f)), NULL, NULL, NA, "glmnet")
inf <- infert; Xi <- as.matrix(inf[, c("spontaneous","induced","age","parity")]); ni <- nrow(Xi)
f <- glmnet(Xi, inf$case, family = "binomial", lambda = 0.01, standardize = FALSE, thresh = 1e-20, maxit = 1e7)
cf <- as.numeric(coef(f)); addcase("infert_logistic_lasso", "logistic", data.frame(y = inf$case, Xi), list(prior = "laplace", lambda = 0.01 * ni, ci = "none"), c(cf[-1], cf[1]), NULL, NULL, NA, "glmnet")
# exclude = glmnet's penalty.factor 0, which glmnet rescales so the factors sum to p: its λ for
# the penalized ones is λ·p/(p − #unpenalized)
f <- glmnet(Xi, inf$case, family = "binomial", lambda = 0.03, penalty.factor = c(0, 1, 1, 1), standardize = FALSE, thresh = 1e-20, maxit = 1e7)
cf <- as.numeric(coef(f)); addcase("infert_logistic_lasso_exclude", "logistic", data.frame(y = inf$case, Xi), list(prior = "laplace", lambda = 0.03 * ni * 4 / 3, exclude = list(1), ci = "none"), c(cf[-1], cf[1]), NULL, NULL, NA, "glmnet")
set.seed(5); np <- 300; a <- rnorm(np); b <- rbinom(np, 1, .5); cc <- rnorm(np); expo <- runif(np, 1, 5); cnt <- rpois(np, expo * exp(-1 + .4 * a + .3 * b))
f <- glmnet(cbind(a, b, cc), cnt, family = "poisson", offset = log(expo), lambda = 0.02, standardize = FALSE, thresh = 1e-20, maxit = 1e7)
cf <- as.numeric(coef(f)); addcase("sim_poisson_lasso", "poisson", data.frame(time = expo, y = cnt, a = a, b = b, cc = cc), list(prior = "laplace", lambda = 0.02 * np, ci = "none"), c(cf[-1], cf[1]), NULL, NULL, NA, "glmnet")
# conditional Poisson (SCCS-like) with gnm
set.seed(11); ns <- 200; k <- 6; s <- rep(1:ns, each = k); tt <- sample(1:60, ns * k, TRUE); x1 <- rbinom(ns * k, 1, .3); x2 <- rbinom(ns * k, 1, .2); x3 <- rnorm(ns * k)
yy <- rpois(ns * k, tt / 100 * exp(.5 * x1 - .3 * x2 + .2 * x3 + rep(rnorm(ns), each = k)))
keep <- ave(yy, s, FUN = sum) > 0
d <- data.frame(stratum_id = s, time = tt, y = yy, x1 = x1, x2 = x2, x3 = x3)[keep, ]
g <- gnm(y ~ x1 + x2 + x3 + offset(log(time)), eliminate = factor(stratum_id), family = poisson, data = d, tolerance = 1e-12)
addcase("sim_condpois_gnm", "sccs", d, list(ci = "wald"), coef(g), sqrt(diag(vcov(g))), NULL, NA, "gnm")
# conditional logistic, several cases per stratum: clogit approximate (Breslow)
set.seed(12); ns <- 150; k <- 5; s <- rep(1:ns, each = k); z1 <- rnorm(ns * k); z2 <- rbinom(ns * k, 1, .4)
p <- plogis(-1 + .7 * z1 + .5 * z2 + rep(rnorm(ns), each = k)); yc <- rbinom(ns * k, 1, p)
ok <- ave(yc, s, FUN = sum) > 0 & ave(yc, s, FUN = sum) < k
dc <- data.frame(stratum_id = s, y = yc, z1 = z1, z2 = z2)[ok, ]
f <- clogit(y ~ z1 + z2 + strata(stratum_id), dc, method = "approximate", control = coxph.control(eps = 1e-14, iter.max = 100))
addcase("sim_clogit_multi_approx", "conditional_logistic", dc, list(ci = "wald"), coef(f), sqrt(diag(f$var)), NULL, f$loglik[2], "clogit")
js <- function(x) if (is.null(x)) "null" else if (is.list(x)) { if (!is.null(names(x))) paste0("{", paste(sprintf('"%s": %s', names(x), sapply(x, js)), collapse = ", "), "}") else paste0("[", paste(sapply(x, js), collapse = ", "), "]") } else if (is.character(x)) { if (length(x) == 1) sprintf('"%s"', x) else paste0("[", paste(sprintf('"%s"', x), collapse = ","), "]") } else { v <- ifelse(is.na(x), "null", sprintf("%.15g", x)); if (length(x) == 1) v else paste0("[", paste(v, collapse = ","), "]") }
writeLines(paste0("[", paste(sapply(cases, js), collapse = ",\n"), "]"), file.path(out, "cases.json"))
