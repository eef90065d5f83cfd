//! Owns the lock-free measurements the runtime and the store keep about
//! themselves (a duration histogram), which the daemon's `/metrics` reads at
//! scrape time. Recording is a few relaxed atomic adds: no lock, no
//! allocation, so it may sit on any hot path. It decides nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The upper bounds, in seconds, of every [`DurationHistogram`]'s buckets
/// (a last, unbounded bucket follows): half a millisecond to five minutes.
pub const BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
    300.0,
];

/// Durations counted into the fixed [`BUCKETS`].
#[derive(Debug)]
pub struct DurationHistogram {
    /// One count per bucket (not cumulative); the last is `+Inf`.
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

/// A point-in-time copy of a [`DurationHistogram`].
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound in seconds, count in this bucket)`, not cumulative;
    /// the last bound is `f64::MAX` (`+Inf`).
    pub buckets: Vec<(f64, u64)>,
    /// Sum of the observations, seconds.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Default for DurationHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl DurationHistogram {
    /// An empty histogram.
    pub const fn new() -> Self {
        Self {
            counts: [const { AtomicU64::new(0) }; BUCKETS.len() + 1],
            sum_nanos: AtomicU64::new(0),
        }
    }

    /// Counts one duration.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|&bound| secs <= bound)
            .unwrap_or(BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The counts so far (a concurrent observation may be half in it).
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<(f64, u64)> = BUCKETS
            .iter()
            .copied()
            .chain(std::iter::once(f64::MAX))
            .zip(&self.counts)
            .map(|(bound, c)| (bound, c.load(Ordering::Relaxed)))
            .collect();
        HistogramSnapshot {
            count: buckets.iter().map(|(_, c)| c).sum(),
            sum: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            buckets,
        }
    }
}

/// How long the durable store's transactions took to commit, process-wide
/// (one observation per batch the store's writer thread commits).
pub static STORE_COMMITS: DurationHistogram = DurationHistogram::new();

/// How late delayed submissions were placed after their due time (one
/// observation per delayed submission placed).
pub static DELAYS_DUE: DurationHistogram = DurationHistogram::new();

/// How late schedules fired after their due times (one observation per
/// firing on time or catch-up; `host schedule run` is not late).
pub static SCHEDULE_LATENESS: DurationHistogram = DurationHistogram::new();

/// From a task's due time (a delayed submission's, a schedule firing's) to
/// the start of its first attempt (one observation per such task that
/// started).
pub static DUE_TO_START: DurationHistogram = DurationHistogram::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket() {
        let h = DurationHistogram::new();
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_secs(3600));
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.buckets[0], (0.0005, 1));
        assert_eq!(s.buckets[1], (0.001, 1));
        assert_eq!(s.buckets.last(), Some(&(f64::MAX, 1)));
        assert!((s.sum - 3600.0013).abs() < 1e-6, "{}", s.sum);
    }
}
