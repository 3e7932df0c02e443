//! Matching on the propensity score: CohortMethod's `matchOnPs` and its greedy C++ matcher
//! (`src/Match.cpp`).
//!
//! # Definition
//!
//! 1. Subjects are ordered by propensity score (a stable sort: ties keep input order).
//! 2. The matching scale and the caliper: with `caliper ≤ 0`, no subjects, or all scores equal,
//!    there is no caliper and distances are on the score itself (whatever the scale).
//!    Otherwise, by [`CaliperScale`]:
//!    `propensity_score`: distances on the score, the caliper as given; `standardized`: the
//!    caliper is multiplied by the (n − 1) standard deviation of the scores; `standardized_logit`
//!    (default, Austin 2011): distances on `logit(score)`, the caliper multiplied by the standard
//!    deviation of the finite logits. The caliper is computed once on the whole population,
//!    strata included. A pair is acceptable when its distance is **strictly less** than the
//!    caliper.
//! 3. `max_ratio = 0` means no maximum (CohortMethod uses 999).
//! 4. Greedy matching in rounds `r = 1, 2, …, max_ratio`: each round builds a heap of candidate
//!    pairs, for every target subject its nearest not-yet-matched comparator on each side in the
//!    score order, then repeatedly takes the closest pair: an unmatched target subject and a free
//!    comparator start a new matched set; a target subject whose set has fewer than `r`
//!    comparators takes the free comparator into its set; when the comparator was taken
//!    meanwhile, the target subject's nearest free comparator (either side) is pushed instead.
//!    A round ends at the first pair outside the caliper, when the heap is empty, or when every
//!    comparator is matched. Rounds stop after a round that matched nobody or once every
//!    comparator is matched. So every target subject gets one comparator before any gets a
//!    second (variable-ratio matching, Rassen et al. 2012).
//! 5. With strata (CohortMethod's `stratificationColumns`), subjects are matched only within
//!    their stratum, strata taken in increasing order of their id.
//! 6. `allow_reverse_match`: when the target arm is larger than the comparator arm, the arms'
//!    roles are swapped for matching (n-to-1 matching; CohortMethod's target estimator becomes
//!    "atu").
//!
//! Every matched set holds exactly one subject of the (possibly swapped) target arm and 1 to
//! `max_ratio` of the other arm; unmatched subjects are dropped. The matcher is deterministic: it
//! has no random element, so no seed.
//!
//! # Differences from CohortMethod
//!
//! * **Matched-set ids** are consecutive from 0 across strata. CohortMethod offsets the ids of
//!   each stratum by the previous maximum + 1 *unless that maximum is 0*, so when the first
//!   stratum yields a single matched set its id collides with the second stratum's first set.
//! * **Ties** between equal distances in the heap are broken by the order in which pairs were
//!   pushed (C++'s `std::priority_queue` leaves them in an unspecified order).
//! * A round whose heap runs empty ends (the C++ loop would re-examine its last pair and, in
//!   corner cases, not terminate).
//!
//! References: Rassen JA, Shelat AA, Myers J, et al. One-to-many propensity score matching in
//! cohort studies. *Pharmacoepidemiol Drug Saf* 2012;21(S2):69–80. Austin PC. Optimal caliper
//! widths for propensity-score matching. *Pharm Stat* 2011;10(2):150–161.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use serde::Deserialize;

use super::{arm_counts, check_len, check_ps, AttritionStep};
use crate::error::{Error, Result};

/// CohortMethod's value for "no maximum ratio".
const UNLIMITED_RATIO: usize = 999;
/// CohortMethod's value for "no caliper".
const NO_CALIPER: f64 = 9999.0;

/// The scale of the caliper (CohortMethod's `caliperScale`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaliperScale {
    /// On the propensity score itself.
    #[serde(alias = "propensity score")]
    PropensityScore,
    /// In standard deviations of the propensity score.
    Standardized,
    /// In standard deviations of the logit of the propensity score (the default).
    #[default]
    #[serde(alias = "standardized logit")]
    StandardizedLogit,
}

/// Settings of [`match_on_ps`] (defaults are `matchOnPs`'s).
///
/// | key | default | meaning |
/// |---|---|---|
/// | `caliper` | 0.2 | caliper, ≥ 0 (0: none) |
/// | `caliper_scale` | `standardized_logit` | `propensity_score`, `standardized` or `standardized_logit` (also written with spaces, as in R) |
/// | `max_ratio` | 1 | most comparators per target subject (0: no maximum) |
/// | `allow_reverse_match` | false | swap the arms when the target arm is larger |
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MatchSettings {
    /// Caliper.
    pub caliper: f64,
    /// Scale of the caliper.
    pub caliper_scale: CaliperScale,
    /// Most comparators per target subject (0: no maximum).
    pub max_ratio: usize,
    /// Allow n-to-1 matching when the target arm is larger.
    pub allow_reverse_match: bool,
}

impl Default for MatchSettings {
    fn default() -> Self {
        MatchSettings {
            caliper: 0.2,
            caliper_scale: CaliperScale::StandardizedLogit,
            max_ratio: 1,
            allow_reverse_match: false,
        }
    }
}

impl MatchSettings {
    /// Validate.
    pub fn check(&self) -> Result<()> {
        if !(self.caliper.is_finite() && self.caliper >= 0.0) {
            return Err(Error::option(
                "caliper",
                format!("must be a finite number ≥ 0 (got {})", self.caliper),
            ));
        }
        Ok(())
    }
}

/// Result of [`match_on_ps`].
#[derive(Debug, Clone, PartialEq)]
pub struct Matching {
    /// Matched subjects, as increasing indices into the input.
    pub kept: Vec<usize>,
    /// Matched-set id (`stratum_id`) of each kept subject, parallel to `kept`.
    pub stratum_id: Vec<i64>,
    /// Number of matched sets.
    pub n_sets: usize,
    /// The caliper on the matching scale (`None`: no caliper).
    pub caliper: Option<f64>,
    /// The arms were swapped (`allow_reverse_match`): each set has one comparator subject and
    /// its matched target subjects; the estimand is then CohortMethod's "atu".
    pub reversed: bool,
    /// The attrition row `Matched on propensity score`.
    pub attrition: AttritionStep,
}

/// Sample standard deviation (n − 1), NaN for fewer than two values.
fn sample_sd(x: impl Iterator<Item = f64> + Clone) -> f64 {
    let (mut n, mut sum) = (0usize, 0.0f64);
    for v in x.clone() {
        n += 1;
        sum += v;
    }
    if n < 2 {
        return f64::NAN;
    }
    let mean = sum / n as f64;
    let ss: f64 = x.map(|v| (v - mean) * (v - mean)).sum();
    (ss / (n - 1) as f64).sqrt()
}

fn logit(p: f64) -> f64 {
    (p / (1.0 - p)).ln()
}

/// Match target to comparator subjects on the propensity score (see the module documentation).
/// `strata`, when given, holds each subject's stratum; subjects are matched only within it.
pub fn match_on_ps(
    treatment: &[bool],
    propensity_score: &[f64],
    strata: Option<&[i64]>,
    settings: &MatchSettings,
) -> Result<Matching> {
    settings.check()?;
    let n = treatment.len();
    check_len("propensity_score", propensity_score.len(), n)?;
    check_ps(propensity_score)?;
    if let Some(s) = strata {
        check_len("strata", s.len(), n)?;
    }
    let (nt, nc) = arm_counts(treatment);
    let reversed = settings.allow_reverse_match && nt > nc;
    let target: Vec<bool> = treatment.iter().map(|&t| t != reversed).collect();

    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| propensity_score[a].total_cmp(&propensity_score[b]));
    let all_equal = order
        .first()
        .zip(order.last())
        .is_none_or(|(&a, &b)| propensity_score[a] == propensity_score[b]);
    let no_caliper = settings.caliper <= 0.0 || all_equal;
    // As CohortMethod: the logit scale only when there is a caliper on it.
    let on_logit = !no_caliper && settings.caliper_scale == CaliperScale::StandardizedLogit;
    let score: Vec<f64> = order
        .iter()
        .map(|&i| {
            let p = propensity_score[i];
            if on_logit {
                logit(p)
            } else {
                p
            }
        })
        .collect();
    let caliper = if no_caliper {
        None
    } else {
        Some(match settings.caliper_scale {
            CaliperScale::PropensityScore => settings.caliper,
            CaliperScale::Standardized => {
                settings.caliper * sample_sd(propensity_score.iter().copied())
            }
            CaliperScale::StandardizedLogit => {
                settings.caliper * sample_sd(score.iter().copied().filter(|s| s.is_finite()))
            }
        })
    };
    let max_ratio = if settings.max_ratio == 0 {
        UNLIMITED_RATIO
    } else {
        settings.max_ratio
    };

    // Groups of positions (in score order) per stratum, strata in increasing id order.
    let groups: Vec<Vec<usize>> = match strata {
        None => vec![(0..n).collect()],
        Some(s) => {
            let mut by: Vec<(i64, usize)> = order
                .iter()
                .enumerate()
                .map(|(pos, &i)| (s[i], pos))
                .collect();
            by.sort_by_key(|&(id, pos)| (id, pos));
            let mut groups: Vec<Vec<usize>> = Vec::new();
            let mut last = None;
            for (id, pos) in by {
                if last != Some(id) {
                    groups.push(Vec::new());
                    last = Some(id);
                }
                if let Some(g) = groups.last_mut() {
                    g.push(pos);
                }
            }
            groups
        }
    };

    let mut set_of = vec![-1i64; n];
    let mut next_id = 0i64;
    for g in &groups {
        let s: Vec<f64> = g.iter().map(|&pos| score[pos]).collect();
        let t: Vec<bool> = g.iter().map(|&pos| target[order[pos]]).collect();
        let ids = greedy_match(&s, &t, max_ratio, caliper.unwrap_or(NO_CALIPER));
        let mut max_id = -1;
        for (k, &id) in ids.iter().enumerate() {
            if id >= 0 {
                set_of[order[g[k]]] = id + next_id;
                max_id = max_id.max(id);
            }
        }
        next_id += max_id + 1;
    }
    let kept: Vec<usize> = (0..n).filter(|&i| set_of[i] >= 0).collect();
    let stratum_id: Vec<i64> = kept.iter().map(|&i| set_of[i]).collect();
    let target_kept = kept.iter().filter(|&&i| treatment[i]).count();
    Ok(Matching {
        attrition: AttritionStep {
            description: "Matched on propensity score".into(),
            target: target_kept,
            comparator: kept.len() - target_kept,
        },
        kept,
        stratum_id,
        n_sets: next_id as usize,
        caliper,
        reversed,
    })
}

/// A candidate pair: (distance, push sequence) order, the smallest first.
#[derive(Debug, Clone, Copy)]
struct Pair {
    distance: f64,
    seq: u64,
    target: usize,
    comparator: usize,
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Pair {}
impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pair {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the smallest distance first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .distance
            .total_cmp(&self.distance)
            .then(other.seq.cmp(&self.seq))
    }
}

/// The greedy matcher of `Match.cpp` on scores sorted ascending: matched-set id per position
/// (−1: unmatched). See the module documentation.
fn greedy_match(score: &[f64], target: &[bool], max_ratio: usize, caliper: f64) -> Vec<i64> {
    Matcher::new(score, target, caliper).run(max_ratio)
}

struct Matcher<'a> {
    score: &'a [f64],
    target: &'a [bool],
    caliper: f64,
    set_of: Vec<i64>,
    set_size: Vec<usize>,
    /// Nearest free comparator before / after each position (−1: none).
    back: Vec<isize>,
    forth: Vec<isize>,
    n_target: usize,
    n_comparator: usize,
    matched_comparators: usize,
    seq: u64,
}

impl<'a> Matcher<'a> {
    fn new(score: &'a [f64], target: &'a [bool], caliper: f64) -> Self {
        let n = score.len();
        let mut back = vec![-1isize; n];
        let mut forth = vec![-1isize; n];
        let mut prior = -1isize;
        for i in 0..n {
            back[i] = prior;
            if !target[i] {
                prior = i as isize;
            }
        }
        let mut next = -1isize;
        for i in (0..n).rev() {
            forth[i] = next;
            if !target[i] {
                next = i as isize;
            }
        }
        let n_target = target.iter().filter(|&&t| t).count();
        Matcher {
            score,
            target,
            caliper,
            set_of: vec![-1; n],
            set_size: Vec::new(),
            back,
            forth,
            n_target,
            n_comparator: n - n_target,
            matched_comparators: 0,
            seq: 0,
        }
    }

    fn distance(&self, a: usize, b: usize) -> f64 {
        let d = (self.score[a] - self.score[b]).abs();
        if d.is_nan() {
            f64::INFINITY
        } else {
            d
        }
    }

    fn pair(&mut self, target: usize, comparator: usize) -> Pair {
        self.seq += 1;
        Pair {
            distance: self.distance(target, comparator),
            seq: self.seq,
            target,
            comparator,
        }
    }

    fn initial_heap(&mut self) -> BinaryHeap<Pair> {
        let n = self.score.len();
        let mut heap = BinaryHeap::new();
        let mut last: Option<usize> = None;
        for i in 0..n {
            if self.target[i] {
                if let Some(c) = last {
                    let p = self.pair(i, c);
                    heap.push(p);
                }
            } else if self.set_of[i] == -1 {
                last = Some(i);
            }
        }
        last = None;
        for i in (0..n).rev() {
            if self.target[i] {
                if let Some(c) = last {
                    let p = self.pair(i, c);
                    heap.push(p);
                }
            } else if self.set_of[i] == -1 {
                last = Some(i);
            }
        }
        heap
    }

    /// Push the target subject's nearest free comparator (either side; the later one on a tie).
    fn push_new_comparator(&mut self, target: usize, heap: &mut BinaryHeap<Pair>) {
        let (b, f) = (self.back[target], self.forth[target]);
        let choice = match (b >= 0, f >= 0) {
            (false, false) => None,
            (true, false) => Some(b as usize),
            (false, true) => Some(f as usize),
            (true, true) => {
                if self.distance(target, b as usize) < self.distance(target, f as usize) {
                    Some(b as usize)
                } else {
                    Some(f as usize)
                }
            }
        };
        if let Some(c) = choice {
            let p = self.pair(target, c);
            heap.push(p);
        }
    }

    /// Comparator `index` is taken: neighbours now skip it.
    fn take(&mut self, index: usize) {
        let (next, prior) = (self.forth[index], self.back[index]);
        let end = if next == -1 {
            self.score.len() - 1
        } else {
            next as usize
        };
        for b in &mut self.back[index..=end] {
            *b = prior;
        }
        let begin = if prior == -1 { 0 } else { prior as usize };
        for f in &mut self.forth[begin..=index] {
            *f = next;
        }
        self.matched_comparators += 1;
    }

    fn round(&mut self, ratio: usize, heap: &mut BinaryHeap<Pair>) -> usize {
        let mut matched = 0usize;
        let Some(mut pair) = heap.pop() else {
            return 0;
        };
        while pair.distance < self.caliper
            && matched < self.n_target
            && self.matched_comparators < self.n_comparator
        {
            let st = self.set_of[pair.target];
            let sc = self.set_of[pair.comparator];
            if st == -1 && sc == -1 {
                let id = self.set_size.len() as i64;
                self.set_of[pair.target] = id;
                self.set_of[pair.comparator] = id;
                self.take(pair.comparator);
                self.set_size.push(1);
                matched += 1;
            } else if st != -1 && sc == -1 {
                if self.set_size[st as usize] < ratio {
                    self.set_of[pair.comparator] = st;
                    self.take(pair.comparator);
                    self.set_size[st as usize] += 1;
                    matched += 1;
                }
            } else if st == -1 || self.set_size[st as usize] < ratio {
                // The comparator was taken meanwhile: offer the next free one.
                self.push_new_comparator(pair.target, heap);
            }
            if self.matched_comparators >= self.n_comparator {
                break;
            }
            match heap.pop() {
                Some(p) => pair = p,
                None => break,
            }
        }
        matched
    }

    fn run(mut self, max_ratio: usize) -> Vec<i64> {
        for ratio in 1..=max_ratio {
            let mut heap = self.initial_heap();
            if heap.is_empty() {
                break;
            }
            let matched = self.round(ratio, &mut heap);
            if self.matched_comparators == self.n_comparator || matched == 0 {
                break;
            }
        }
        self.set_of
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rng::Rng;

    /// Slow, obviously correct reference of the same greedy rule: in round r, repeatedly match
    /// the globally closest (eligible target, free comparator) pair with distance < caliper,
    /// where a target subject is eligible while its set has fewer than r comparators.
    fn reference(score: &[f64], target: &[bool], max_ratio: usize, caliper: f64) -> Vec<i64> {
        let n = score.len();
        let mut set_of = vec![-1i64; n];
        let mut size: Vec<usize> = Vec::new();
        let n_comparator = target.iter().filter(|&&t| !t).count();
        let mut matched_c = 0;
        for r in 1..=max_ratio {
            let mut matched = 0;
            loop {
                let mut best: Option<(f64, usize, usize)> = None;
                for t in (0..n).filter(|&i| target[i]) {
                    if set_of[t] >= 0 && size[set_of[t] as usize] >= r {
                        continue;
                    }
                    for c in (0..n).filter(|&i| !target[i] && set_of[i] == -1) {
                        let d = (score[t] - score[c]).abs();
                        if d < caliper && best.is_none_or(|b| d < b.0) {
                            best = Some((d, t, c));
                        }
                    }
                }
                let Some((_, t, c)) = best else { break };
                if set_of[t] == -1 {
                    set_of[t] = size.len() as i64;
                    size.push(0);
                }
                set_of[c] = set_of[t];
                size[set_of[t] as usize] += 1;
                matched += 1;
                matched_c += 1;
            }
            if matched == 0 || matched_c == n_comparator {
                break;
            }
        }
        set_of
    }

    /// Canonical form of a matching: the sets as sorted member lists, sorted.
    fn sets(set_of: &[i64]) -> Vec<Vec<usize>> {
        let mut m: std::collections::BTreeMap<i64, Vec<usize>> = Default::default();
        for (i, &s) in set_of.iter().enumerate() {
            if s >= 0 {
                m.entry(s).or_default().push(i);
            }
        }
        let mut v: Vec<Vec<usize>> = m.into_values().collect();
        v.sort();
        v
    }

    #[test]
    fn hand_checked_one_to_one() {
        // CohortMethod's example: treatment 1 0 1 0 1, ps 0 .1 .3 .4 1, caliper 0 (none, so
        // distances on the score), max_ratio 1: |0 − 0.1| = 0.1 is (in floating point) below
        // |0.3 − 0.4|, so (0, 0.1) is set 0 and (0.3, 0.4) set 1; the target at 1 is unmatched.
        let t = [true, false, true, false, true];
        let ps = [0.0, 0.1, 0.3, 0.4, 1.0];
        let s = MatchSettings {
            caliper: 0.0,
            ..Default::default()
        };
        let m = match_on_ps(&t, &ps, None, &s).unwrap();
        assert_eq!(m.kept, vec![0, 1, 2, 3]);
        assert_eq!(m.stratum_id, vec![0, 0, 1, 1]);
        assert_eq!(m.caliper, None);
        assert_eq!((m.attrition.target, m.attrition.comparator), (2, 2));
    }

    #[test]
    fn caliper_on_the_score_scale_is_strict() {
        let t = [true, false, true, false];
        let ps = [0.5, 0.6, 0.2, 0.25];
        let s = MatchSettings {
            caliper: 0.1,
            caliper_scale: CaliperScale::PropensityScore,
            ..Default::default()
        };
        let m = match_on_ps(&t, &ps, None, &s).unwrap();
        // |0.2 − 0.25| = 0.05 < 0.1 matches; |0.5 − 0.6| = 0.1 (up to rounding) does not
        // match when it is not strictly below.
        assert!(m.kept.contains(&2) && m.kept.contains(&3));
        let d = (0.5f64 - 0.6).abs();
        assert_eq!(m.kept.contains(&0), d < 0.1);
    }

    #[test]
    fn variable_ratio_hand_checked() {
        // Scores: T 0.5; C 0.45, 0.52, 0.9. max_ratio 2, no caliper: round 1 takes 0.52,
        // round 2 takes 0.45.
        let t = [true, false, false, false];
        let ps = [0.5, 0.45, 0.52, 0.9];
        let s = MatchSettings {
            caliper: 0.0,
            max_ratio: 2,
            ..Default::default()
        };
        let m = match_on_ps(&t, &ps, None, &s).unwrap();
        assert_eq!(m.kept, vec![0, 1, 2]);
        assert_eq!(m.n_sets, 1);
        // max_ratio 0 (no maximum) takes all three.
        let all = MatchSettings { max_ratio: 0, ..s };
        assert_eq!(match_on_ps(&t, &ps, None, &all).unwrap().kept.len(), 4);
    }

    #[test]
    fn strata_and_reverse() {
        let t = [true, false, true, false];
        let ps = [0.5, 0.5, 0.5, 0.5];
        let strata = [1, 2, 2, 1];
        let m = match_on_ps(&t, &ps, Some(&strata), &MatchSettings::default()).unwrap();
        assert_eq!(m.n_sets, 2);
        // Stratum 1 (subjects 0, 3) gets set 0, stratum 2 (1, 2) set 1.
        assert_eq!(m.stratum_id, vec![0, 1, 1, 0]);
        let t = [true, true, true, false];
        let ps = [0.2, 0.4, 0.6, 0.41];
        let s = MatchSettings {
            allow_reverse_match: true,
            caliper: 0.0,
            max_ratio: 2,
            ..Default::default()
        };
        let m = match_on_ps(&t, &ps, None, &s).unwrap();
        assert!(m.reversed);
        assert_eq!(m.kept, vec![1, 2, 3]);
    }

    #[test]
    fn empty_and_single_arm_inputs() {
        let m = match_on_ps(&[], &[], None, &MatchSettings::default()).unwrap();
        assert!(m.kept.is_empty() && m.n_sets == 0);
        let m = match_on_ps(&[true, true], &[0.2, 0.4], None, &MatchSettings::default()).unwrap();
        assert!(m.kept.is_empty());
        let m = match_on_ps(&[false], &[0.2], Some(&[3]), &MatchSettings::default()).unwrap();
        assert!(m.kept.is_empty());
    }

    #[test]
    fn randomized_strata_never_cross() {
        let mut rng = Rng::new(99);
        for case in 0..100 {
            let n = 2 + rng.int_range(0, 50) as usize;
            let t: Vec<bool> = (0..n).map(|_| rng.bernoulli(0.4)).collect();
            let ps: Vec<f64> = (0..n).map(|_| 0.01 + 0.98 * rng.uniform()).collect();
            let strata: Vec<i64> = (0..n).map(|_| rng.int_range(0, 3) as i64 - 1).collect();
            let s = MatchSettings {
                max_ratio: case % 4,
                ..Default::default()
            };
            let m = match_on_ps(&t, &ps, Some(&strata), &s).unwrap();
            let mut stratum_of_set = std::collections::HashMap::new();
            for (&i, &id) in m.kept.iter().zip(&m.stratum_id) {
                assert_eq!(*stratum_of_set.entry(id).or_insert(strata[i]), strata[i]);
            }
            // Each stratum alone gives the same sets (ids aside).
            for g in -1..=1i64 {
                let idx: Vec<usize> = (0..n).filter(|&i| strata[i] == g).collect();
                let tg: Vec<bool> = idx.iter().map(|&i| t[i]).collect();
                let pg: Vec<f64> = idx.iter().map(|&i| ps[i]).collect();
                // Same caliper: the whole population's.
                let alone = {
                    let mut order: Vec<usize> = (0..idx.len()).collect();
                    order.sort_by(|&a, &b| pg[a].total_cmp(&pg[b]));
                    let score: Vec<f64> = order.iter().map(|&k| logit(pg[k])).collect();
                    let tt: Vec<bool> = order.iter().map(|&k| tg[k]).collect();
                    let ratio = if s.max_ratio == 0 {
                        UNLIMITED_RATIO
                    } else {
                        s.max_ratio
                    };
                    let r = greedy_match(&score, &tt, ratio, m.caliper.unwrap_or(NO_CALIPER));
                    let mut back = vec![-1i64; idx.len()];
                    for (pos, &k) in order.iter().enumerate() {
                        back[k] = r[pos];
                    }
                    back
                };
                let mut got = vec![-1i64; idx.len()];
                for (k, &i) in idx.iter().enumerate() {
                    if let Some(p) = m.kept.iter().position(|&x| x == i) {
                        got[k] = m.stratum_id[p];
                    }
                }
                assert_eq!(sets(&got), sets(&alone), "case {case}, stratum {g}");
            }
        }
    }

    #[test]
    fn settings() {
        let s: MatchSettings =
            serde_json::from_str(r#"{"caliper_scale": "standardized logit", "max_ratio": 4}"#)
                .unwrap();
        assert_eq!(s.caliper_scale, CaliperScale::StandardizedLogit);
        assert_eq!(s.max_ratio, 4);
        let s: MatchSettings =
            serde_json::from_str(r#"{"caliper_scale": "propensity_score"}"#).unwrap();
        assert_eq!(s.caliper_scale, CaliperScale::PropensityScore);
        assert!(serde_json::from_str::<MatchSettings>(r#"{"ratio": 4}"#).is_err());
        assert!(MatchSettings {
            caliper: -1.0,
            ..Default::default()
        }
        .check()
        .is_err());
        assert!(match_on_ps(&[true], &[0.5, 0.5], None, &MatchSettings::default()).is_err());
    }

    #[test]
    fn randomized_against_reference_and_invariants() {
        let mut rng = Rng::new(17);
        for case in 0..300 {
            let n = 2 + rng.int_range(0, 40) as usize;
            let share = 0.2 + 0.6 * rng.uniform();
            let t: Vec<bool> = (0..n).map(|_| rng.bernoulli(share)).collect();
            let ps: Vec<f64> = (0..n).map(|_| 0.01 + 0.98 * rng.uniform()).collect();
            let max_ratio = [0, 1, 2, 3, 5][case % 5];
            let scale = [
                CaliperScale::StandardizedLogit,
                CaliperScale::Standardized,
                CaliperScale::PropensityScore,
            ][case % 3];
            let s = MatchSettings {
                caliper: [0.2, 0.05, 0.0, 1.0][case % 4],
                caliper_scale: scale,
                max_ratio,
                allow_reverse_match: false,
            };
            let m = match_on_ps(&t, &ps, None, &s).unwrap();
            // Invariants: each set has one target and 1..=max_ratio comparators within the
            // caliper; no subject twice (kept is strictly increasing by construction).
            assert!(m.kept.windows(2).all(|w| w[0] < w[1]));
            let scale_of = |p: f64| {
                if scale == CaliperScale::StandardizedLogit && s.caliper > 0.0 {
                    (p / (1.0 - p)).ln()
                } else {
                    p
                }
            };
            let mut members: std::collections::BTreeMap<i64, Vec<usize>> = Default::default();
            for (&i, &id) in m.kept.iter().zip(&m.stratum_id) {
                members.entry(id).or_default().push(i);
            }
            assert_eq!(members.len(), m.n_sets);
            for ms in members.values() {
                let targets: Vec<usize> = ms.iter().copied().filter(|&i| t[i]).collect();
                assert_eq!(targets.len(), 1, "case {case}");
                let nc = ms.len() - 1;
                assert!(
                    nc >= 1 && (max_ratio == 0 || nc <= max_ratio),
                    "case {case}"
                );
                for &c in ms.iter().filter(|&&i| !t[i]) {
                    let d = (scale_of(ps[targets[0]]) - scale_of(ps[c])).abs();
                    assert!(m.caliper.is_none_or(|cal| d < cal), "case {case}");
                }
            }
            // Same sets as the slow reference (continuous scores: no ties).
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|&a, &b| ps[a].total_cmp(&ps[b]));
            let score: Vec<f64> = order.iter().map(|&i| scale_of(ps[i])).collect();
            let tt: Vec<bool> = order.iter().map(|&i| t[i]).collect();
            let r = reference(
                &score,
                &tt,
                if max_ratio == 0 {
                    UNLIMITED_RATIO
                } else {
                    max_ratio
                },
                m.caliper.unwrap_or(NO_CALIPER),
            );
            let mut back = vec![-1i64; n];
            for (pos, &i) in order.iter().enumerate() {
                back[i] = r[pos];
            }
            let mut got = vec![-1i64; n];
            for (&i, &id) in m.kept.iter().zip(&m.stratum_id) {
                got[i] = id;
            }
            assert_eq!(sets(&got), sets(&back), "case {case}");
            // Deterministic.
            assert_eq!(m, match_on_ps(&t, &ps, None, &s).unwrap());
        }
    }
}
