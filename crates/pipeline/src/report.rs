//! The run report: one self-contained HTML page (no script, no external resources) with a
//! forest plot of the estimates (inline SVG, ratio scale on a log axis), the attrition and
//! diagnostics tables of every analysis and the run metadata.

use std::fmt::Write as _;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::array_value_to_string;

/// One row of the forest plot: a ratio (exp of a coefficient) with its interval.
#[derive(Debug, Clone, PartialEq)]
pub struct ForestRow {
    /// Analysis unit id.
    pub analysis: String,
    /// Coefficient label.
    pub label: String,
    /// exp(estimate).
    pub ratio: f64,
    /// exp(lower bound), when known.
    pub lower: Option<f64>,
    /// exp(upper bound), when known.
    pub upper: Option<f64>,
}

/// What the report shows of one analysis unit.
#[derive(Debug, Clone, Default)]
pub struct ReportAnalysis {
    /// Unit id.
    pub id: String,
    /// Description from the pipeline file.
    pub description: Option<String>,
    /// Design name.
    pub design: String,
    /// Model name.
    pub model: String,
    /// (role, concept set).
    pub roles: Vec<(String, String)>,
    /// "computed in this run" or "complete from run …".
    pub provenance: String,
    /// Attrition table.
    pub attrition: Vec<RecordBatch>,
    /// Diagnostics table.
    pub diagnostics: Vec<RecordBatch>,
    /// Problems found with the results (e.g. a `report` id without a coefficient).
    pub warnings: Vec<String>,
    /// PS-adjusted cohort units: the CohortMethod plots and diagnostics.
    pub cohort: Option<CohortPlots>,
}

/// What the report draws of a PS-adjusted cohort unit (from its `cm_*` tables).
#[derive(Debug, Clone, Default)]
pub struct CohortPlots {
    /// Preference score, target density, comparator density (`cm_preference_score_dist`).
    pub preference: Vec<(f64, f64, f64)>,
    /// |SDM| before and after adjustment per covariate (`cm_covariate_balance`).
    pub balance: Vec<(f64, f64)>,
    /// Day, target survival, comparator survival (`cm_kaplan_meier_dist`).
    pub km: Vec<(f64, f64, f64)>,
    /// `cm_diagnostics_summary`.
    pub diagnostics: Vec<RecordBatch>,
}

/// Axis ranges and the plot area of a small chart.
struct Chart {
    class: &'static str,
    x: (f64, f64),
    y: (f64, f64),
    x_label: String,
    y_label: String,
}

const CHART_W: f64 = 420.0;
const CHART_H: f64 = 260.0;
const MARGIN: f64 = 45.0;

impl Chart {
    fn px(&self, x: f64) -> f64 {
        let span = (self.x.1 - self.x.0).max(f64::MIN_POSITIVE);
        MARGIN + (x - self.x.0) / span * (CHART_W - 2.0 * MARGIN)
    }
    fn py(&self, y: f64) -> f64 {
        let span = (self.y.1 - self.y.0).max(f64::MIN_POSITIVE);
        CHART_H - MARGIN - (y - self.y.0) / span * (CHART_H - 2.0 * MARGIN)
    }
    /// The frame, axis labels and end ticks.
    fn open(&self, title: &str) -> String {
        let (l, r, t, b) = (MARGIN, CHART_W - MARGIN, MARGIN, CHART_H - MARGIN);
        format!(
            "<svg class=\"{c}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{CHART_W}\" height=\"{CHART_H}\" \
             viewBox=\"0 0 {CHART_W} {CHART_H}\" font-family=\"sans-serif\" font-size=\"11\">\
             <title>{title}</title>\
             <rect class=\"plot-area\" x=\"{l}\" y=\"{t}\" width=\"{w}\" height=\"{h}\" fill=\"none\" stroke=\"#999\"/>\
             <text x=\"{cx}\" y=\"{ty}\" text-anchor=\"middle\" font-size=\"12\">{title}</text>\
             <text x=\"{cx}\" y=\"{xl}\" text-anchor=\"middle\">{xlab}</text>\
             <text x=\"12\" y=\"{cy}\" text-anchor=\"middle\" transform=\"rotate(-90 12 {cy})\">{ylab}</text>\
             <text x=\"{l}\" y=\"{tick}\" text-anchor=\"middle\">{x0}</text>\
             <text x=\"{r}\" y=\"{tick}\" text-anchor=\"middle\">{x1}</text>\
             <text x=\"{yl}\" y=\"{b}\" text-anchor=\"end\">{y0}</text>\
             <text x=\"{yl}\" y=\"{t4}\" text-anchor=\"end\">{y1}</text>",
            c = self.class,
            title = escape(title),
            w = r - l,
            h = b - t,
            cx = CHART_W / 2.0,
            ty = t - 12.0,
            xl = CHART_H - 8.0,
            cy = CHART_H / 2.0,
            xlab = escape(&self.x_label),
            ylab = escape(&self.y_label),
            tick = b + 14.0,
            x0 = fmt_axis(self.x.0),
            x1 = fmt_axis(self.x.1),
            yl = l - 4.0,
            y0 = fmt_axis(self.y.0),
            y1 = fmt_axis(self.y.1),
            t4 = t + 4.0,
        )
    }
    /// A polyline (step = draw as a step function).
    fn line(&self, class: &str, colour: &str, pts: &[(f64, f64)], step: bool) -> String {
        let mut d = String::new();
        let mut prev: Option<(f64, f64)> = None;
        for &(x, y) in pts.iter().filter(|p| p.0.is_finite() && p.1.is_finite()) {
            let (x, y) = (self.px(x), self.py(y));
            if let (true, Some((_, py))) = (step, prev) {
                let _ = write!(d, "{x:.1},{py:.1} ");
            }
            let _ = write!(d, "{x:.1},{y:.1} ");
            prev = Some((x, y));
        }
        format!(
            "<polyline class=\"{class}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
            d.trim_end()
        )
    }
    /// A legend entry (row `k`).
    fn legend(&self, k: usize, colour: &str, text: &str) -> String {
        let (x, y) = (CHART_W - MARGIN - 110.0, MARGIN + 14.0 + 14.0 * k as f64);
        format!(
            "<rect x=\"{x}\" y=\"{y0}\" width=\"10\" height=\"10\" fill=\"{colour}\"/>\
             <text class=\"legend\" x=\"{tx}\" y=\"{ty}\">{}</text>",
            escape(text),
            y0 = y - 9.0,
            tx = x + 14.0,
            ty = y,
        )
    }
}

fn fmt_axis(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

const TARGET_COLOUR: &str = "#1f5fa8";
const COMPARATOR_COLOUR: &str = "#c0392b";

/// Preference-score distribution of both arms.
pub fn preference_svg(pts: &[(f64, f64, f64)]) -> String {
    let c = Chart {
        class: "ps-dist",
        x: (0.0, 1.0),
        y: (0.0, 1.0),
        x_label: "preference score".into(),
        y_label: "density (scaled)".into(),
    };
    let mut s = c.open("Preference score distribution");
    let t: Vec<(f64, f64)> = pts.iter().map(|p| (p.0, p.1)).collect();
    let k: Vec<(f64, f64)> = pts.iter().map(|p| (p.0, p.2)).collect();
    s.push_str(&c.line("target", TARGET_COLOUR, &t, false));
    s.push_str(&c.line("comparator", COMPARATOR_COLOUR, &k, false));
    s.push_str(&c.legend(0, TARGET_COLOUR, "target"));
    s.push_str(&c.legend(1, COMPARATOR_COLOUR, "comparator"));
    s.push_str("</svg>");
    s
}

/// Balance scatter plot: |SDM| before (x) vs after (y) adjustment, with the 0.1 threshold.
pub fn balance_svg(pts: &[(f64, f64)]) -> String {
    let max = pts
        .iter()
        .flat_map(|p| [p.0, p.1])
        .filter(|v| v.is_finite())
        .fold(0.1f64, f64::max)
        * 1.05;
    let c = Chart {
        class: "balance",
        x: (0.0, max),
        y: (0.0, max),
        x_label: "|SDM| before adjustment".into(),
        y_label: "|SDM| after adjustment".into(),
    };
    let mut s = c.open("Covariate balance");
    let _ = write!(
        s,
        "<line class=\"threshold\" x1=\"{}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#888\" stroke-dasharray=\"4 3\"/>",
        c.px(0.0),
        c.px(max),
        y = c.py(0.1)
    );
    for &(b, a) in pts.iter().filter(|p| p.0.is_finite() && p.1.is_finite()) {
        let _ = write!(
            s,
            "<circle class=\"covariate\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{TARGET_COLOUR}\" fill-opacity=\"0.5\"/>",
            c.px(b),
            c.py(a)
        );
    }
    s.push_str("</svg>");
    s
}

/// Kaplan–Meier curves of both arms.
pub fn km_svg(pts: &[(f64, f64, f64)]) -> String {
    let t_max = pts.iter().map(|p| p.0).fold(1.0f64, f64::max);
    let s_min = pts
        .iter()
        .flat_map(|p| [p.1, p.2])
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::min);
    let lo = ((s_min - 0.02).max(0.0) * 20.0).floor() / 20.0;
    let c = Chart {
        class: "km",
        x: (0.0, t_max),
        y: (lo, 1.0),
        x_label: "days since cohort start".into(),
        y_label: "survival".into(),
    };
    let mut s = c.open("Kaplan–Meier");
    let t: Vec<(f64, f64)> = pts.iter().map(|p| (p.0, p.1)).collect();
    let k: Vec<(f64, f64)> = pts.iter().map(|p| (p.0, p.2)).collect();
    s.push_str(&c.line("target", TARGET_COLOUR, &t, true));
    s.push_str(&c.line("comparator", COMPARATOR_COLOUR, &k, true));
    s.push_str(&c.legend(0, TARGET_COLOUR, "target"));
    s.push_str(&c.legend(1, COMPARATOR_COLOUR, "comparator"));
    s.push_str("</svg>");
    s
}

fn cohort_section(c: &CohortPlots) -> String {
    let mut s = String::from(
        "<h4>Propensity scores, balance and Kaplan–Meier</h4><div class=\"cohort-plots\">",
    );
    s.push_str(&preference_svg(&c.preference));
    s.push_str(&balance_svg(&c.balance));
    if c.km.is_empty() {
        s.push_str("<p class=\"empty\">(no Kaplan–Meier curves)</p>");
    } else {
        s.push_str(&km_svg(&c.km));
    }
    s.push_str("</div><h4>CohortMethod diagnostics</h4>");
    s.push_str(&batches_table("cm-diagnostics", &c.diagnostics));
    s
}

/// Everything on the page.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Pipeline name.
    pub title: String,
    /// Pipeline description.
    pub description: Option<String>,
    /// Run metadata (label, value).
    pub metadata: Vec<(String, String)>,
    /// Forest plot rows, in order.
    pub forest: Vec<ForestRow>,
    /// Analyses, in order.
    pub analyses: Vec<ReportAnalysis>,
    /// More sections (self-contained HTML, e.g. the SCCS calibration plots and diagnostics of
    /// [`crate::sccs_results`]), shown after the estimates.
    pub extra_sections: Vec<String>,
}

/// Escape text for HTML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A ratio for display: 3 significant digits.
pub fn fmt_ratio(x: f64) -> String {
    if !x.is_finite() {
        return if x > 0.0 { "∞".into() } else { "–".into() };
    }
    if x == 0.0 {
        return "0".into();
    }
    let digits = (2 - x.abs().log10().floor() as i32).clamp(0, 6) as usize;
    format!("{x:.digits$}")
}

fn interval_text(r: &ForestRow) -> String {
    match (r.lower, r.upper) {
        (Some(l), Some(u)) => format!("{} ({}–{})", fmt_ratio(r.ratio), fmt_ratio(l), fmt_ratio(u)),
        _ => format!("{} (no interval)", fmt_ratio(r.ratio)),
    }
}

/// The forest plot as an SVG element.
pub fn forest_svg(rows: &[ForestRow]) -> String {
    const ROW: f64 = 26.0;
    const TOP: f64 = 30.0;
    const PLOT_W: f64 = 360.0;
    const TEXT_W: f64 = 200.0;
    // Room for the longest label (12 px sans-serif: at most ~7 px per character).
    let longest = rows
        .iter()
        .map(|r| r.analysis.chars().count() + r.label.chars().count() + 3)
        .max()
        .unwrap_or(0);
    let label_w = (longest as f64 * 7.0 + 16.0).max(200.0);
    let width = label_w + PLOT_W + TEXT_W;
    let height = TOP + ROW * rows.len().max(1) as f64 + 50.0;
    let finite = |x: f64| x.is_finite() && x > 0.0;
    let values = rows
        .iter()
        .flat_map(|r| [Some(r.ratio), r.lower, r.upper])
        .flatten()
        .filter(|&x| finite(x))
        .chain([1.0]);
    let (mut lo, mut hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    lo = (lo / 1.25).max(1e-3);
    hi = (hi * 1.25).min(1e3);
    let (llo, lhi) = (lo.ln(), hi.ln());
    let x = |v: f64| {
        let v = v.clamp(lo, hi);
        label_w + (v.ln() - llo) / (lhi - llo) * PLOT_W
    };
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="forest" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="Forest plot">"#
    );
    let _ = write!(
        s,
        r##"<text x="{label_w}" y="18" class="axis-title" font-size="13" font-weight="bold">Estimate (ratio, log scale) with 95% interval</text>"##
    );
    let bottom = TOP + ROW * rows.len().max(1) as f64;
    // Axis with ticks.
    let _ = write!(
        s,
        r##"<rect class="plot-area" x="{label_w}" y="{TOP}" width="{PLOT_W}" height="{}" fill="none"/><line class="axis" x1="{label_w}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="#333"/>"##,
        bottom - TOP,
        label_w + PLOT_W
    );
    for t in [
        0.001, 0.01, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 10.0, 100.0, 1000.0,
    ] {
        if t < lo || t > hi {
            continue;
        }
        let tx = x(t);
        let _ = write!(
            s,
            r##"<line x1="{tx:.1}" y1="{bottom}" x2="{tx:.1}" y2="{}" stroke="#333"/><text class="tick" x="{tx:.1}" y="{}" font-size="11" text-anchor="middle">{}</text>"##,
            bottom + 5.0,
            bottom + 18.0,
            fmt_ratio(t)
        );
    }
    let one = x(1.0);
    let _ = write!(
        s,
        r##"<line class="reference" x1="{one:.1}" y1="{TOP}" x2="{one:.1}" y2="{bottom}" stroke="#888" stroke-dasharray="4 3"/>"##
    );
    if rows.is_empty() {
        let _ = write!(
            s,
            r#"<text x="{label_w}" y="{}" font-size="12">No estimates to plot.</text>"#,
            TOP + 16.0
        );
    }
    for (i, r) in rows.iter().enumerate() {
        let cy = TOP + ROW * i as f64 + ROW / 2.0;
        let _ = write!(
            s,
            r#"<g class="forest-row" data-analysis="{}" data-ratio="{}">"#,
            escape(&r.analysis),
            r.ratio
        );
        let _ = write!(
            s,
            r#"<text class="label" x="4" y="{:.1}" font-size="12">{} · {}</text>"#,
            cy + 4.0,
            escape(&r.analysis),
            escape(&r.label)
        );
        if let (Some(l), Some(u)) = (r.lower, r.upper) {
            let _ = write!(
                s,
                r##"<line class="ci" x1="{:.1}" y1="{cy:.1}" x2="{:.1}" y2="{cy:.1}" stroke="#1f4e79" stroke-width="2"/>"##,
                x(l),
                x(u)
            );
        }
        if finite(r.ratio) {
            let _ = write!(
                s,
                r##"<rect class="estimate" x="{:.1}" y="{:.1}" width="10" height="10" fill="#1f4e79"/>"##,
                x(r.ratio) - 5.0,
                cy - 5.0
            );
        }
        let _ = write!(
            s,
            r#"<text class="value" x="{:.1}" y="{:.1}" font-size="12">{}</text></g>"#,
            label_w + PLOT_W + 10.0,
            cy + 4.0,
            escape(&interval_text(r))
        );
    }
    s.push_str("</svg>");
    s
}

/// A record-batch table as an HTML table.
pub fn batches_table(class: &str, batches: &[RecordBatch]) -> String {
    let Some(first) = batches.first() else {
        return "<p class=\"empty\">(none)</p>".into();
    };
    let mut s = format!("<table class=\"{}\"><thead><tr>", escape(class));
    for f in first.schema().fields() {
        let _ = write!(s, "<th>{}</th>", escape(f.name()));
    }
    s.push_str("</tr></thead><tbody>");
    for b in batches {
        for row in 0..b.num_rows() {
            s.push_str("<tr>");
            for col in b.columns() {
                let v = if col.is_null(row) {
                    String::new()
                } else {
                    array_value_to_string(col, row).unwrap_or_default()
                };
                let _ = write!(s, "<td>{}</td>", escape(&v));
            }
            s.push_str("</tr>");
        }
    }
    s.push_str("</tbody></table>");
    s
}

/// The whole page.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let title = escape(&r.title);
    let _ = write!(
        s,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title} — epifusion report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; font-size: 13px; }}
th {{ background: #eef2f6; }}
h2 {{ border-bottom: 1px solid #ccc; }}
.meta td:first-child {{ font-weight: bold; }}
.warning {{ color: #8a4b00; background: #fff4e0; padding: 4px 8px; }}
</style></head><body>
<h1>{title}</h1>
"#
    );
    if let Some(d) = &r.description {
        let _ = writeln!(s, "<p class=\"description\">{}</p>", escape(d));
    }
    let warnings: Vec<&String> = r.analyses.iter().flat_map(|a| &a.warnings).collect();
    if !warnings.is_empty() {
        s.push_str("<h2 id=\"warnings\">Warnings</h2>\n<ul class=\"warnings\">");
        for w in warnings {
            let _ = write!(s, "<li class=\"warning\">{}</li>", escape(w));
        }
        s.push_str("</ul>\n");
    }
    s.push_str("<h2 id=\"estimates\">Estimates</h2>\n");
    s.push_str(&forest_svg(&r.forest));
    s.push_str("\n<table class=\"estimates\"><thead><tr><th>analysis</th><th>coefficient</th><th>ratio</th><th>lower</th><th>upper</th></tr></thead><tbody>");
    for f in &r.forest {
        let opt = |v: Option<f64>| v.map(fmt_ratio).unwrap_or_default();
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&f.analysis),
            escape(&f.label),
            fmt_ratio(f.ratio),
            opt(f.lower),
            opt(f.upper)
        );
    }
    s.push_str("</tbody></table>\n");
    for section in &r.extra_sections {
        s.push_str(section);
    }
    s.push_str("<h2 id=\"analyses\">Analyses</h2>\n");
    for a in &r.analyses {
        let _ = writeln!(
            s,
            "<section class=\"analysis\" id=\"analysis-{id}\"><h3>{id}</h3>",
            id = escape(&a.id)
        );
        let roles = a
            .roles
            .iter()
            .map(|(r, c)| format!("{r}: {c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            s,
            "<p>Design <b>{}</b>, model <b>{}</b>{}. {}.</p>",
            escape(&a.design),
            escape(&a.model),
            if roles.is_empty() {
                String::new()
            } else {
                format!("; {}", escape(&roles))
            },
            escape(&a.provenance)
        );
        if let Some(d) = &a.description {
            let _ = writeln!(s, "<p>{}</p>", escape(d));
        }
        for w in &a.warnings {
            let _ = writeln!(s, "<p class=\"warning\">Warning: {}</p>", escape(w));
        }
        s.push_str("<h4>Attrition</h4>");
        s.push_str(&batches_table("attrition", &a.attrition));
        s.push_str("<h4>Diagnostics</h4>");
        s.push_str(&batches_table("diagnostics", &a.diagnostics));
        if let Some(c) = &a.cohort {
            s.push_str(&cohort_section(c));
        }
        s.push_str("</section>\n");
    }
    s.push_str("<h2 id=\"metadata\">Run metadata</h2>\n<table class=\"meta\"><tbody>");
    for (k, v) in &r.metadata {
        let _ = write!(s, "<tr><td>{}</td><td>{}</td></tr>", escape(k), escape(v));
    }
    s.push_str("</tbody></table>\n</body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_and_escaping() {
        assert_eq!(fmt_ratio(1.23456), "1.23");
        assert_eq!(fmt_ratio(0.0123456), "0.0123");
        assert_eq!(fmt_ratio(12.3456), "12.3");
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }

    #[test]
    fn forest_rows_are_on_the_right_side_of_one() {
        let rows = vec![
            ForestRow {
                analysis: "a".into(),
                label: "x".into(),
                ratio: 2.0,
                lower: Some(1.5),
                upper: Some(3.0),
            },
            ForestRow {
                analysis: "b".into(),
                label: "y".into(),
                ratio: 0.5,
                lower: None,
                upper: None,
            },
        ];
        let svg = forest_svg(&rows);
        assert_eq!(svg.matches("class=\"forest-row\"").count(), 2);
        assert_eq!(svg.matches("class=\"ci\"").count(), 1);
        assert!(svg.contains("2.00 (1.50–3.00)"), "{svg}");
        assert!(svg.contains("0.500 (no interval)"), "{svg}");
    }
}
