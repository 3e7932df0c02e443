//! Compact per-row storage of a design's row ids, strata, times and outcomes.
//!
//! An SCCS design has many more rows than nonzeros (≈ 17 rows and 13 nonzeros per case), so
//! its row data, not its CSC columns, set its memory. Each kind of per-row data is kept in the
//! smallest form that returns every value exactly:
//!
//! | type | forms | typical SCCS input |
//! |---|---|---|
//! | [`RowIds`] | a range `first, first + 1, …`; or one i64 per row | a range: 0 B/row |
//! | [`Strata`] | runs of rows of one stratum; or one u32 per row | one run per case |
//! | [`Values`] | u8, u16, u32, f32 or f64 per row, the first that holds every value bit for bit | time u16, y u8 |
//!
//! Reads go through `get(i)`, `iter()`, or a borrowed-or-copied slice (`as_f64`, `as_u32`,
//! `as_i64`); all arithmetic stays in f64.

use std::borrow::Cow;

/// Numbers stored in the narrowest type that returns each of them exactly (see the module
/// docs). Widening re-encodes the values pushed so far.
#[derive(Debug, Clone)]
pub enum Values {
    /// Integers 0..=255.
    U8(Vec<u8>),
    /// Integers 0..=65535.
    U16(Vec<u16>),
    /// Integers 0..=2³²−1.
    U32(Vec<u32>),
    /// Values exact in f32.
    F32(Vec<f32>),
    /// Anything else.
    F64(Vec<f64>),
}

impl Default for Values {
    fn default() -> Self {
        Values::U8(Vec::new())
    }
}

/// The storage forms of [`Values`], narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Form {
    U8,
    U16,
    U32,
    F32,
    F64,
}

/// 2⁵²: every f64 in [2⁵², 2⁵³) is an integer, one apart.
const TWO_52: f64 = 4_503_599_627_370_496.0;

/// `x` as an integer when `x` is an integer in [0, 2⁵²): x + 2⁵² is then exact and its
/// mantissa bits are x. Any other `x` gives a value that is wrong but that
/// [`holds_integer`] rejects. Branch-free float arithmetic, so loops over it vectorize
/// (`x as u32` saturates and checks NaN per value).
#[inline(always)]
fn integer_bits(x: f64) -> u64 {
    (x + TWO_52).to_bits().wrapping_sub(TWO_52.to_bits())
}

/// Whether `x` is an integer in [0, max] with the bits of that integer as f64 (so not −0.0)
/// — `f64::from(x as uN).to_bits() == x.to_bits()` for `max = uN::MAX` (`max < 2⁵²`), without
/// a conversion per value. For `x` in [0, 2⁵²), x + 2⁵² rounds `x` to an integer that
/// subtracting 2⁵² returns exactly, so the round trip keeps the bits only for integers (and
/// turns −0.0 into +0.0); [`integer_bits`] is then `x`. Every other `x` (negative, ≥ 2⁵²,
/// NaN, infinite) leaves `integer_bits` above `max`, or fails the round trip.
#[inline(always)]
fn holds_integer(x: f64, max: u64) -> bool {
    ((x + TWO_52) - TWO_52).to_bits() == x.to_bits() && integer_bits(x) <= max
}

impl Form {
    /// Whether `v` is returned exactly (bit for bit) by this form.
    #[inline]
    fn holds(self, v: f64) -> bool {
        match self {
            Form::U8 => holds_integer(v, u64::from(u8::MAX)),
            Form::U16 => holds_integer(v, u64::from(u16::MAX)),
            Form::U32 => holds_integer(v, u64::from(u32::MAX)),
            Form::F32 => f64::from(v as f32).to_bits() == v.to_bits(),
            Form::F64 => true,
        }
    }
    /// The narrowest form that holds every value of `current` and `v`.
    fn widened(current: Form, v: f64) -> Form {
        [Form::U16, Form::U32, Form::F32, Form::F64]
            .into_iter()
            .find(|f| f.contains(current) && f.holds(v))
            .unwrap_or(Form::F64)
    }

    /// The narrowest form that holds every value of `current` and of `v` — the same as
    /// widening value by value with [`Form::widened`], but scanned in blocks with the form
    /// fixed (no dispatch or branch per value).
    fn holding(current: Form, v: &[f64]) -> Form {
        /// Position of the first value `holds` rejects.
        #[inline(always)]
        fn first_not(v: &[f64], holds: impl Fn(f64) -> bool) -> Option<usize> {
            const BLOCK: usize = 256;
            v.chunks(BLOCK).enumerate().find_map(|(b, block)| {
                if block.iter().fold(true, |all, &x| all & holds(x)) {
                    None
                } else {
                    block.iter().position(|&x| !holds(x)).map(|k| b * BLOCK + k)
                }
            })
        }
        let mut form = current;
        let mut rest = v;
        loop {
            let bad = match form {
                Form::U8 => first_not(rest, |x| Form::U8.holds(x)),
                Form::U16 => first_not(rest, |x| Form::U16.holds(x)),
                Form::U32 => first_not(rest, |x| Form::U32.holds(x)),
                Form::F32 => first_not(rest, |x| Form::F32.holds(x)),
                Form::F64 => None,
            };
            match bad {
                None => return form,
                Some(k) => {
                    form = Form::widened(form, rest[k]);
                    rest = &rest[k + 1..];
                }
            }
        }
    }

    /// Whether every value of form `other` is held by this one.
    fn contains(self, other: Form) -> bool {
        match self {
            Form::F32 => other <= Form::U16 || other == Form::F32,
            _ => other <= self,
        }
    }
}

impl Values {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store with room for `n` values (kept when it widens).
    pub fn with_capacity(n: usize) -> Self {
        Values::U8(Vec::with_capacity(n))
    }

    /// Make room for `n` more values in the current form (kept when it widens).
    pub fn reserve(&mut self, n: usize) {
        with_values!(self, v => v.reserve_exact(n));
    }

    /// `v` stored in the narrowest form that holds every value exactly (one scan for the
    /// form — two when the values are not all integers but may fit f32 —, one for the copy).
    fn from_f64(v: Vec<f64>) -> Self {
        // Whether every value is an integer in u32's range (then the largest picks the form),
        // in blocks, so that non-integral data stops early.
        let mut integral = true;
        let mut max = 0u64;
        for block in v.chunks(1024) {
            for &x in block {
                integral &= Form::U32.holds(x);
                max = max.max(integer_bits(x));
            }
            if !integral {
                break;
            }
        }
        let form = if integral {
            if max <= u64::from(u8::MAX) {
                Form::U8
            } else if max <= u64::from(u16::MAX) {
                Form::U16
            } else {
                Form::U32
            }
        } else if v.iter().all(|&x| Form::F32.holds(x)) {
            Form::F32
        } else {
            Form::F64
        };
        // The integer forms hold integers in range: their bits are the values.
        match form {
            Form::U8 => Values::U8(v.iter().map(|&x| integer_bits(x) as u8).collect()),
            Form::U16 => Values::U16(v.iter().map(|&x| integer_bits(x) as u16).collect()),
            Form::U32 => Values::U32(v.iter().map(|&x| integer_bits(x) as u32).collect()),
            Form::F32 => Values::F32(v.iter().map(|&x| x as f32).collect()),
            Form::F64 => Values::F64(v),
        }
    }

    fn capacity(&self) -> usize {
        match self {
            Values::U8(v) => v.capacity(),
            Values::U16(v) => v.capacity(),
            Values::U32(v) => v.capacity(),
            Values::F32(v) => v.capacity(),
            Values::F64(v) => v.capacity(),
        }
    }

    fn form(&self) -> Form {
        match self {
            Values::U8(_) => Form::U8,
            Values::U16(_) => Form::U16,
            Values::U32(_) => Form::U32,
            Values::F32(_) => Form::F32,
            Values::F64(_) => Form::F64,
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Values::U8(v) => v.len(),
            Values::U16(v) => v.len(),
            Values::U32(v) => v.len(),
            Values::F32(v) => v.len(),
            Values::F64(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value `i`.
    #[inline]
    pub fn get(&self, i: usize) -> f64 {
        match self {
            Values::U8(v) => f64::from(v[i]),
            Values::U16(v) => f64::from(v[i]),
            Values::U32(v) => f64::from(v[i]),
            Values::F32(v) => f64::from(v[i]),
            Values::F64(v) => v[i],
        }
    }

    /// Iterate the values.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = f64> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// The values as f64: borrowed when stored as f64, else copied.
    pub fn as_f64(&self) -> Cow<'_, [f64]> {
        match self {
            Values::F64(v) => Cow::Borrowed(v),
            _ => Cow::Owned(self.iter().collect()),
        }
    }

    /// The values as a `Vec<f64>`.
    pub fn to_vec(&self) -> Vec<f64> {
        self.as_f64().into_owned()
    }

    /// Bytes held by the values.
    pub fn bytes(&self) -> usize {
        let width = match self.form() {
            Form::U8 => 1,
            Form::U16 => 2,
            Form::U32 | Form::F32 => 4,
            Form::F64 => 8,
        };
        self.len() * width
    }

    /// Append `v`, widening the storage when its form does not hold `v` exactly.
    #[inline]
    pub fn push(&mut self, v: f64) {
        if !self.form().holds(v) {
            self.widen(v);
        }
        match self {
            Values::U8(s) => s.push(v as u8),
            Values::U16(s) => s.push(v as u16),
            Values::U32(s) => s.push(v as u32),
            Values::F32(s) => s.push(v as f32),
            Values::F64(s) => s.push(v),
        }
    }

    /// Append the values of `v` (the same storage as pushing them one by one: the form is
    /// widened once, then the slice copied in a typed loop).
    pub fn extend_from_slice(&mut self, v: &[f64]) {
        let current = self.form();
        let form = Form::holding(current, v);
        if form != current {
            self.widen_to(form, v.len());
        }
        match self {
            Values::U8(s) => s.extend(v.iter().map(|&x| integer_bits(x) as u8)),
            Values::U16(s) => s.extend(v.iter().map(|&x| integer_bits(x) as u16)),
            Values::U32(s) => s.extend(v.iter().map(|&x| integer_bits(x) as u32)),
            Values::F32(s) => s.extend(v.iter().map(|&x| x as f32)),
            Values::F64(s) => s.extend_from_slice(v),
        }
    }

    /// Re-encode in the narrowest form that holds the current values and `v`.
    #[cold]
    fn widen(&mut self, v: f64) {
        self.widen_to(Form::widened(self.form(), v), 0);
    }

    /// Re-encode in `form` (which holds the current values), with room for `more` values.
    fn widen_to(&mut self, form: Form, more: usize) {
        let n = self.len();
        // The room reserved, or for the growth the caller is pushing towards.
        let cap = self.capacity().max(n + n / 4 + 16).max(n + more);
        let old = std::mem::take(self);
        *self = match form {
            Form::U8 => unreachable!("never a widening"),
            Form::U16 => Values::U16(with_cap(cap, old.iter().map(|x| x as u16))),
            Form::U32 => Values::U32(with_cap(cap, old.iter().map(|x| x as u32))),
            Form::F32 => Values::F32(with_cap(cap, old.iter().map(|x| x as f32))),
            Form::F64 => Values::F64(with_cap(cap, old.iter())),
        };
    }

    /// Release unused capacity.
    pub fn shrink_to_fit(&mut self) {
        match self {
            Values::U8(v) => v.shrink_to_fit(),
            Values::U16(v) => v.shrink_to_fit(),
            Values::U32(v) => v.shrink_to_fit(),
            Values::F32(v) => v.shrink_to_fit(),
            Values::F64(v) => v.shrink_to_fit(),
        }
    }

    /// The values at positions `idx`.
    pub fn pick(&self, idx: &[u32]) -> Values {
        idx.iter().map(|&i| self.get(i as usize)).collect()
    }

    /// Position of the first value `v` with `pred(v)`: one scan of the stored slice, compiled
    /// for its storage type (no dispatch per value).
    pub fn position(&self, pred: impl Fn(f64) -> bool) -> Option<usize> {
        with_values!(self, s => s.iter().position(|&x| pred(f64::from(x))))
    }

    /// Values held in one of the stored element types, in that form.
    pub fn from_stored<T: Stored>(v: Vec<T>) -> Values {
        T::into_values(v)
    }

    /// `n` ones.
    pub fn ones(n: usize) -> Values {
        Values::U8(vec![1; n])
    }

    /// Whether the storage form itself makes every value an integer ≥ 0 (u8, u16, u32).
    pub fn is_unsigned_integer_form(&self) -> bool {
        matches!(self, Values::U8(_) | Values::U16(_) | Values::U32(_))
    }

    /// The values in `range` summed in f64 in order from 0 (`range.map(get).sum()`, one typed
    /// loop).
    pub fn sum_range(&self, range: std::ops::Range<usize>) -> f64 {
        with_values!(self, s => s[range].iter().fold(0.0, |acc, &x| acc + f64::from(x)))
    }
}

/// An element type [`Values`] stores (`u8`, `u16`, `u32`, `f32`, `f64`).
pub trait Stored: Copy + Default + Into<f64> {
    /// The values, in this type's form.
    fn into_values(v: Vec<Self>) -> Values;
}

macro_rules! stored {
    ($($t:ty => $form:ident),*) => {$(
        impl Stored for $t {
            fn into_values(v: Vec<Self>) -> Values {
                Values::$form(v)
            }
        }
    )*};
}
stored!(u8 => U8, u16 => U16, u32 => U32, f32 => F32, f64 => F64);

/// Evaluates `$body` with `$s` bound to the stored slice of the [`Values`] `$v`, once per
/// storage type: loops in `$body` are compiled for each type (read values with `f64::from`).
macro_rules! with_values {
    ($v:expr, $s:ident => $body:expr) => {
        match $v {
            Values::U8($s) => $body,
            Values::U16($s) => $body,
            Values::U32($s) => $body,
            Values::F32($s) => $body,
            Values::F64($s) => {
                // `f64::from` on f64 values: the body is shared with the other forms.
                #[allow(clippy::useless_conversion)]
                let r = $body;
                r
            }
        }
    };
}
pub(crate) use with_values;

fn with_cap<T>(cap: usize, it: impl Iterator<Item = T>) -> Vec<T> {
    let mut v = Vec::with_capacity(cap);
    v.extend(it);
    v
}

impl FromIterator<f64> for Values {
    fn from_iter<I: IntoIterator<Item = f64>>(iter: I) -> Self {
        let mut v = Values::new();
        for x in iter {
            v.push(x);
        }
        v.shrink_to_fit();
        v
    }
}

impl From<Vec<f64>> for Values {
    /// Stored narrowly when every value allows it (else the vector is kept as it is).
    fn from(v: Vec<f64>) -> Self {
        Values::from_f64(v)
    }
}

impl PartialEq for Values {
    /// Equal values, bit for bit, whatever the storage.
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len()
            && self
                .iter()
                .zip(other.iter())
                .all(|(a, b)| a.to_bits() == b.to_bits())
    }
}

impl PartialEq<Vec<f64>> for Values {
    fn eq(&self, other: &Vec<f64>) -> bool {
        self.len() == other.len()
            && self
                .iter()
                .zip(other)
                .all(|(a, b)| a.to_bits() == b.to_bits())
    }
}

/// Dense stratum index per row: runs of consecutive rows of one stratum (grouped input: one
/// run per stratum), or one u32 per row when runs would take more room.
#[derive(Debug, Clone)]
pub enum Strata {
    /// Row `run_start[r]` up to the next run's start belongs to stratum `run_stratum[r]`.
    Runs {
        /// First row of each run, increasing (the first is 0).
        run_start: Vec<u32>,
        /// Stratum of each run.
        run_stratum: Vec<u32>,
        /// Number of rows.
        len: usize,
    },
    /// One stratum index per row.
    PerRow(Vec<u32>),
}

impl Default for Strata {
    fn default() -> Self {
        Strata::Runs {
            run_start: Vec::new(),
            run_stratum: Vec::new(),
            len: 0,
        }
    }
}

impl Strata {
    /// `n` rows of stratum 0.
    pub fn single(n: usize) -> Self {
        if n == 0 {
            return Strata::default();
        }
        Strata::Runs {
            run_start: vec![0],
            run_stratum: vec![0],
            len: n,
        }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        match self {
            Strata::Runs { len, .. } => *len,
            Strata::PerRow(v) => v.len(),
        }
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The runs of consecutive rows of one stratum, in row order: (stratum, rows). Stored runs
    /// are returned as stored; per-row strata are grouped on the fly.
    pub fn runs(&self) -> Box<dyn Iterator<Item = (u32, std::ops::Range<usize>)> + '_> {
        match self {
            Strata::Runs {
                run_start,
                run_stratum,
                len,
            } => Box::new(run_stratum.iter().enumerate().map(move |(r, &s)| {
                let end = run_start.get(r + 1).map_or(*len, |&e| e as usize);
                (s, run_start[r] as usize..end)
            })),
            Strata::PerRow(v) => {
                let mut start = 0;
                Box::new(std::iter::from_fn(move || {
                    let &s = v.get(start)?;
                    let len = v[start..].iter().take_while(|&&x| x == s).count();
                    let range = start..start + len;
                    start += len;
                    Some((s, range))
                }))
            }
        }
    }

    /// Stratum of row `i` (a search over the runs when stored as runs; [`Strata::cursor`] for
    /// many rows in increasing order).
    #[inline]
    pub fn get(&self, i: usize) -> u32 {
        self.cursor().get(i)
    }

    /// A reader of the strata of rows visited in increasing order ([`StrataCursor::get`]):
    /// a search from the last row's run (galloping), not over every run.
    pub fn cursor(&self) -> StrataCursor<'_> {
        StrataCursor {
            strata: self,
            run: 0,
        }
    }

    /// Number of rows of each stratum `0..n` (strata from `n` on are not counted).
    pub fn sizes(&self, n: usize) -> Vec<u32> {
        let mut size = vec![0u32; n];
        for (s, rows) in self.runs() {
            if let Some(c) = size.get_mut(s as usize) {
                *c += rows.len() as u32;
            }
        }
        size
    }

    /// Iterate the strata of rows 0, 1, … (O(1) per row).
    pub fn iter(&self) -> Box<dyn Iterator<Item = u32> + '_> {
        match self {
            Strata::Runs {
                run_start,
                run_stratum,
                len,
            } => Box::new(run_stratum.iter().enumerate().flat_map(move |(r, &s)| {
                let end = run_start.get(r + 1).map_or(*len, |&e| e as usize);
                std::iter::repeat_n(s, end - run_start[r] as usize)
            })),
            Strata::PerRow(v) => Box::new(v.iter().copied()),
        }
    }

    /// The strata as a slice: borrowed when stored per row, else expanded.
    pub fn as_u32(&self) -> Cow<'_, [u32]> {
        match self {
            Strata::PerRow(v) => Cow::Borrowed(v),
            _ => Cow::Owned(self.iter().collect()),
        }
    }

    /// The strata as a `Vec<u32>`.
    pub fn to_vec(&self) -> Vec<u32> {
        self.as_u32().into_owned()
    }

    /// Append `n` rows of stratum `s` (as `n` calls of [`Strata::push`]).
    pub fn push_n(&mut self, s: u32, n: usize) {
        if n == 0 {
            return;
        }
        self.push(s);
        match self {
            Strata::Runs { len, .. } => *len += n - 1,
            Strata::PerRow(v) => v.extend(std::iter::repeat_n(s, n - 1)),
        }
    }

    /// Append a row of stratum `s`; switches to one u32 per row once the runs would take more
    /// room than that.
    #[inline]
    pub fn push(&mut self, s: u32) {
        match self {
            Strata::Runs {
                run_start,
                run_stratum,
                len,
            } => {
                if run_stratum.last() != Some(&s) {
                    if 2 * (run_stratum.len() + 1) > *len + 64 {
                        let mut v = self.to_vec();
                        v.push(s);
                        *self = Strata::PerRow(v);
                        return;
                    }
                    run_start.push(*len as u32);
                    run_stratum.push(s);
                }
                *len += 1;
            }
            Strata::PerRow(v) => v.push(s),
        }
    }

    /// Release unused capacity.
    pub fn shrink_to_fit(&mut self) {
        match self {
            Strata::Runs {
                run_start,
                run_stratum,
                ..
            } => {
                run_start.shrink_to_fit();
                run_stratum.shrink_to_fit();
            }
            Strata::PerRow(v) => v.shrink_to_fit(),
        }
    }

    /// The strata of rows `idx`.
    pub fn pick(&self, idx: &[u32]) -> Strata {
        match self {
            Strata::PerRow(v) => idx.iter().map(|&i| v[i as usize]).collect(),
            _ => idx.iter().map(|&i| self.get(i as usize)).collect(),
        }
    }
}

/// See [`Strata::cursor`].
#[derive(Debug)]
pub struct StrataCursor<'a> {
    strata: &'a Strata,
    /// The run of the last row read.
    run: usize,
}

impl StrataCursor<'_> {
    /// Stratum of row `i`: cheap when rows come in increasing order (any order is correct).
    #[inline]
    pub fn get(&mut self, i: usize) -> u32 {
        match self.strata {
            Strata::PerRow(v) => v[i],
            Strata::Runs {
                run_start,
                run_stratum,
                len,
            } => {
                assert!(i < *len, "row {i} out of {len}");
                // The run of row i: the last r with run_start[r] ≤ i.
                let from = self.run.min(run_start.len() - 1);
                let from = if run_start[from] as usize <= i {
                    from
                } else {
                    0
                };
                let r = last_at_most(run_start, from, i as u32);
                self.run = r;
                run_stratum[r]
            }
        }
    }
}

/// The last index r ≥ `from` with `sorted[r] ≤ x`, for a nondecreasing `sorted` with
/// `sorted[from] ≤ x`: a galloping search from `from` (cheap when the answer is near it, as for
/// rows visited in increasing order).
#[inline]
pub(crate) fn last_at_most(sorted: &[u32], from: usize, x: u32) -> usize {
    let (mut lo, mut hi, mut step) = (from, from + 1, 1);
    while hi < sorted.len() && sorted[hi] <= x {
        lo = hi;
        hi += step;
        step *= 2;
    }
    let hi = hi.min(sorted.len());
    lo + sorted[lo..hi].partition_point(|&a| a <= x) - 1
}

impl FromIterator<u32> for Strata {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut s = Strata::default();
        for x in iter {
            s.push(x);
        }
        s.shrink_to_fit();
        s
    }
}

impl From<Vec<u32>> for Strata {
    fn from(v: Vec<u32>) -> Self {
        let runs = 1 + v.windows(2).filter(|w| w[0] != w[1]).count();
        if 2 * runs > v.len() + 64 {
            Strata::PerRow(v)
        } else {
            v.into_iter().collect()
        }
    }
}

impl PartialEq for Strata {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl PartialEq<Vec<u32>> for Strata {
    fn eq(&self, other: &Vec<u32>) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter().copied())
    }
}

/// The caller's row ids: a range `first, first + 1, …` (consecutive input), or one i64 per row.
#[derive(Debug, Clone)]
pub enum RowIds {
    /// `len` consecutive ids from `first`.
    Range {
        /// The first id.
        first: i64,
        /// Number of rows.
        len: usize,
    },
    /// Any ids.
    Ids(Vec<i64>),
}

impl Default for RowIds {
    fn default() -> Self {
        RowIds::Range { first: 0, len: 0 }
    }
}

impl RowIds {
    /// Number of rows.
    pub fn len(&self) -> usize {
        match self {
            RowIds::Range { len, .. } => *len,
            RowIds::Ids(v) => v.len(),
        }
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Id of row `i`.
    #[inline]
    pub fn get(&self, i: usize) -> i64 {
        match self {
            RowIds::Range { first, len } => {
                assert!(i < *len, "row {i} out of {len}");
                first + i as i64
            }
            RowIds::Ids(v) => v[i],
        }
    }

    /// The last id.
    pub fn last(&self) -> Option<i64> {
        self.len().checked_sub(1).map(|i| self.get(i))
    }

    /// Iterate the ids.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = i64> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// The ids as a slice: borrowed when stored per row, else expanded.
    pub fn as_i64(&self) -> Cow<'_, [i64]> {
        match self {
            RowIds::Ids(v) => Cow::Borrowed(v),
            _ => Cow::Owned(self.iter().collect()),
        }
    }

    /// The ids as a `Vec<i64>`.
    pub fn to_vec(&self) -> Vec<i64> {
        self.as_i64().into_owned()
    }

    /// Append `id`; stored per row from the first id that does not continue the range.
    #[inline]
    pub fn push(&mut self, id: i64) {
        match self {
            RowIds::Range { first, len } => {
                if *len == 0 {
                    *first = id;
                    *len = 1;
                } else if first.checked_add(*len as i64) == Some(id) {
                    *len += 1;
                } else {
                    let mut v = Vec::with_capacity(*len + *len / 4 + 16);
                    // first + k for k < len (first + len itself can be past i64::MAX).
                    v.extend((0..*len).map(|k| *first + k as i64));
                    v.push(id);
                    *self = RowIds::Ids(v);
                }
            }
            RowIds::Ids(v) => v.push(id),
        }
    }

    /// Index of `id` when the ids are a range, or increasing (binary search); `None` when
    /// absent. Other orders need a map (the builder keeps one).
    pub fn find_sorted(&self, id: i64) -> Option<u32> {
        match self {
            RowIds::Range { first, len } => {
                let k = id.checked_sub(*first)?;
                (0..*len as i64).contains(&k).then_some(k as u32)
            }
            RowIds::Ids(v) => v.binary_search(&id).ok().map(|k| k as u32),
        }
    }

    /// The ids of rows `idx`.
    pub fn pick(&self, idx: &[u32]) -> RowIds {
        idx.iter().map(|&i| self.get(i as usize)).collect()
    }
}

impl FromIterator<i64> for RowIds {
    fn from_iter<I: IntoIterator<Item = i64>>(iter: I) -> Self {
        let mut r = RowIds::default();
        for x in iter {
            r.push(x);
        }
        if let RowIds::Ids(v) = &mut r {
            v.shrink_to_fit();
        }
        r
    }
}

impl From<Vec<i64>> for RowIds {
    fn from(v: Vec<i64>) -> Self {
        let consecutive = v.windows(2).all(|w| w[0].checked_add(1) == Some(w[1]));
        match (consecutive, v.first()) {
            (true, Some(&first)) => RowIds::Range {
                first,
                len: v.len(),
            },
            (true, None) => RowIds::default(),
            (false, _) => RowIds::Ids(v),
        }
    }
}

impl PartialEq for RowIds {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<const N: usize> PartialEq<[i64; N]> for RowIds {
    fn eq(&self, other: &[i64; N]) -> bool {
        self.len() == N && self.iter().eq(other.iter().copied())
    }
}

impl PartialEq<Vec<i64>> for RowIds {
    fn eq(&self, other: &Vec<i64>) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_keep_every_bit() {
        let cases: Vec<Vec<f64>> = vec![
            vec![0.0, 1.0, 255.0],
            vec![3.0, 300.0, 7.0],
            vec![1.0, 70000.0],
            vec![1.0, 0.5, 300.0],
            vec![70000.0, 0.5],
            vec![-0.0, 1.0],
            vec![1.0, 0.1, f64::NAN, f64::INFINITY, -2.0],
            vec![4294967295.0, 4294967296.0],
        ];
        let forms = [
            Form::U8,
            Form::U16,
            Form::U32,
            Form::F32,
            Form::F64,
            Form::F32,
            Form::F64,
            Form::F64,
        ];
        for (v, form) in cases.iter().zip(forms) {
            let mut pushed = Values::new();
            for &x in v {
                pushed.push(x);
            }
            assert_eq!(pushed.form(), form, "{v:?}");
            let bits: Vec<u64> = pushed.iter().map(f64::to_bits).collect();
            let want: Vec<u64> = v.iter().map(|x| x.to_bits()).collect();
            assert_eq!(bits, want);
            // Converted at once, the narrowest form that holds every value (pushes widen
            // along the way: [70000, 0.5] ends as f64 pushed, f32 converted).
            let whole = Values::from(v.clone());
            let narrowest = if v == &[70000.0, 0.5] {
                Form::F32
            } else {
                form
            };
            assert_eq!(whole.form(), narrowest, "{v:?}");
            assert_eq!(whole.iter().map(f64::to_bits).collect::<Vec<_>>(), want);
            // Slices appended (after a push) store what the pushes store.
            for cut in 0..v.len() {
                let mut extended = Values::new();
                extended.push(v[0]);
                extended.extend_from_slice(&v[1..=cut]);
                extended.extend_from_slice(&v[cut + 1..]);
                assert_eq!(extended.form(), form, "{v:?} cut {cut}");
                assert_eq!(extended.iter().map(f64::to_bits).collect::<Vec<_>>(), want);
            }
            // The typed reads agree with `get`.
            let bad = |x: f64| !(x >= 0.0 && x.fract() == 0.0);
            assert_eq!(
                pushed.position(bad),
                v.iter().position(|&x| bad(x)),
                "{v:?}"
            );
            let sum = |r: std::ops::Range<usize>| r.fold(0.0, |a, i| a + pushed.get(i));
            assert_eq!(
                pushed.sum_range(1..v.len()).to_bits(),
                sum(1..v.len()).to_bits()
            );
            // Stored values keep their form.
            let stored: Vec<u16> = v.iter().map(|&x| x as u16).collect();
            assert_eq!(Values::from_stored(stored).form(), Form::U16);
        }
    }

    /// A long slice appended stores what pushing its values one by one stores (form and bits),
    /// also when the values that widen the form lie past the first blocks of the scan, one
    /// after another.
    #[test]
    fn integer_test_and_bits_agree_with_the_form() {
        // The definition: a value is held by uN when the round trip through uN keeps its bits.
        let reference = |x: f64, max: u64| match max {
            255 => f64::from(x as u8).to_bits() == x.to_bits(),
            65_535 => f64::from(x as u16).to_bits() == x.to_bits(),
            _ => f64::from(x as u32).to_bits() == x.to_bits(),
        };
        let mut xs = vec![
            0.0,
            -0.0,
            0.5,
            -0.5,
            0.49999999999999994,
            1.0,
            -1.0,
            254.5,
            255.0,
            255.5,
            256.0,
            65_535.0,
            65_536.0,
            4_294_967_295.0,
            4_294_967_296.0,
            -4_294_967_295.0,
            TWO_52 - 1.0,
            TWO_52,
            TWO_52 + 1.0,
            2.0 * TWO_52,
            -TWO_52,
            -2.0 * TWO_52,
            f64::MIN_POSITIVE,
            -f64::MIN_POSITIVE,
            f64::from_bits(1),
            f64::MAX,
            f64::MIN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -f64::NAN,
            f64::EPSILON,
            1.0 + f64::EPSILON,
            1.0 - f64::EPSILON / 2.0,
        ];
        // Random bit patterns and random numbers around the ranges' edges.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let r = next();
            xs.push(f64::from_bits(r));
            let scale = [1.0, 300.0, 70_000.0, 5e9][(r % 4) as usize];
            let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
            xs.push((u * 2.0 - 0.1) * scale);
            xs.push(((u * 2.0 - 0.1) * scale).round());
        }
        for &x in &xs {
            for max in [255u64, 65_535, 4_294_967_295] {
                let held = holds_integer(x, max);
                assert_eq!(
                    held,
                    reference(x, max),
                    "{x:e} ({:#x}) in 0..={max}",
                    x.to_bits()
                );
                if held {
                    assert_eq!(integer_bits(x), x as u64, "{x}");
                }
            }
        }
    }

    #[test]
    fn appended_slices_widen_like_pushes_across_blocks() {
        let specials = [300.0, 70000.0, 0.5, 1e300, -1.0, f64::NAN, -0.0, 5e9];
        for (a, &first) in specials.iter().enumerate() {
            for &at in &[0usize, 255, 256, 700, 999] {
                let mut v: Vec<f64> = (0..1000).map(|k| (k % 7) as f64).collect();
                v[at] = first;
                // A second, wider value later on.
                let second = specials[(a + 3) % specials.len()];
                v[(at + 300).min(999)] = second;
                for start in [Values::new(), Values::from(vec![2.0, 40000.0])] {
                    let mut pushed = start.clone();
                    v.iter().for_each(|&x| pushed.push(x));
                    let mut appended = start.clone();
                    appended.extend_from_slice(&v[..at.min(500)]);
                    appended.extend_from_slice(&v[at.min(500)..]);
                    assert_eq!(appended.form(), pushed.form(), "{first} at {at}, {second}");
                    let bits = |x: &Values| x.iter().map(f64::to_bits).collect::<Vec<_>>();
                    assert_eq!(bits(&appended), bits(&pushed), "{first} at {at}");
                }
            }
        }
    }

    /// The form of a converted vector is the first of u8, u16, u32, f32 that holds every value,
    /// also when the deciding value lies past the first blocks of the scan.
    #[test]
    fn conversion_picks_the_narrowest_form_across_blocks() {
        let first_holding = |v: &[f64]| {
            [Form::U8, Form::U16, Form::U32, Form::F32]
                .into_iter()
                .find(|f| v.iter().all(|&x| f.holds(x)))
                .unwrap_or(Form::F64)
        };
        for (at, x) in [
            (2500, 0.5),
            (2500, 300.0),
            (1023, 70000.0),
            (1024, 4294967295.0),
            (2999, -0.0),
            (0, 0.1),
            (1500, f64::NAN),
        ] {
            let mut v: Vec<f64> = (0..3000).map(|i| f64::from(i % 200)).collect();
            v[at] = x;
            let want = first_holding(&v);
            let got = Values::from(v.clone());
            assert_eq!(got.form(), want, "{x} at {at}");
            let bits: Vec<u64> = got.iter().map(f64::to_bits).collect();
            assert_eq!(bits, v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn strata_cursor_reads_any_order() {
        let grouped = vec![0u32, 0, 0, 1, 1, 2, 0, 0, 3, 3, 3, 3, 1, 2, 2];
        let runs: Strata = grouped.iter().copied().collect();
        assert!(matches!(runs, Strata::Runs { .. }));
        let per_row = Strata::PerRow(grouped.clone());
        for s in [&runs, &per_row] {
            let mut c = s.cursor();
            let order: Vec<usize> = (0..grouped.len()).chain([3, 14, 0, 7, 7, 12, 1]).collect();
            for i in order {
                assert_eq!(c.get(i), grouped[i], "row {i}");
            }
            assert_eq!(s.sizes(4), vec![5, 3, 3, 4]);
            assert_eq!(s.sizes(2), vec![5, 3]);
        }
    }

    #[test]
    fn strata_runs_and_rows() {
        let grouped = vec![0u32, 0, 0, 1, 1, 2, 0, 0];
        let mut s = Strata::default();
        for &x in &grouped {
            s.push(x);
        }
        assert!(matches!(s, Strata::Runs { .. }));
        assert_eq!(s, grouped);
        assert_eq!((0..8).map(|i| s.get(i)).collect::<Vec<_>>(), grouped);
        assert_eq!(s.pick(&[7, 3, 5]), vec![0, 1, 2]);
        let alternating: Vec<u32> = (0..200).map(|i| i % 2).collect();
        let s: Strata = alternating.iter().copied().collect();
        assert!(matches!(s, Strata::PerRow(_)));
        assert_eq!(s, alternating);
        assert_eq!(Strata::single(3), vec![0, 0, 0]);
    }

    #[test]
    fn row_ids_range_then_any() {
        let mut r = RowIds::default();
        for id in [5, 6, 7] {
            r.push(id);
        }
        assert!(matches!(r, RowIds::Range { first: 5, len: 3 }));
        assert_eq!(r.find_sorted(6), Some(1));
        assert_eq!(r.find_sorted(8), None);
        r.push(20);
        assert_eq!(r, [5, 6, 7, 20]);
        assert_eq!(r.find_sorted(20), Some(3));
        assert_eq!(RowIds::from(vec![3, 2]).to_vec(), vec![3, 2]);
    }
}
