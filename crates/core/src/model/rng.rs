//! A small seeded PRNG (xoshiro256** seeded through splitmix64): benchmark generators, CV fold
//! assignment and bootstrap draws depend only on their seed, never on the thread count.

/// xoshiro256** seeded through splitmix64, with uniform, normal and exponential draws.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
    spare_normal: Option<f64>,
}

impl Rng {
    /// A generator seeded from `seed` (any value, including 0).
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
            spare_normal: None,
        }
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform on the open interval (0, 1).
    #[inline]
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform on (a, b).
    #[inline]
    pub fn uniform_range(&mut self, a: f64, b: f64) -> f64 {
        a + (b - a) * self.uniform()
    }

    /// Uniform integer in `lo..=hi`.
    #[inline]
    pub fn int_range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + ((self.uniform() * (hi - lo + 1) as f64) as u64).min(hi - lo)
    }

    /// Bernoulli(p).
    #[inline]
    pub fn bernoulli(&mut self, p: f64) -> bool {
        self.uniform() < p
    }

    /// Standard normal (Box–Muller; the second draw is kept for the next call).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare_normal.take() {
            return z;
        }
        let r = (-2.0 * self.uniform().ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * self.uniform();
        self.spare_normal = Some(r * theta.sin());
        r * theta.cos()
    }

    /// Exponential with the given rate.
    #[inline]
    pub fn exponential(&mut self, rate: f64) -> f64 {
        -self.uniform().ln() / rate
    }

    /// Poisson(mean) by inversion (for small means).
    pub fn poisson(&mut self, mean: f64) -> u64 {
        let mut k = 0u64;
        let mut p = (-mean).exp();
        let mut cdf = p;
        let u = self.uniform();
        while u > cdf && k < 10_000 {
            k += 1;
            p *= mean / k as f64;
            cdf += p;
        }
        k
    }
}
