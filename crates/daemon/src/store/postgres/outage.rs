//! Owns how a node behaves while its database is away: it says so once
//! when it loses the database, then at most once every [`LOG_EVERY`] with
//! the count of failed tries while it stays away, and once when it is back
//! (every loop and every retried write reports here instead of logging on
//! its own, so an outage of any length costs a handful of lines); and the
//! pause between tries ([`pause`]: jittered, doubling, at most a second).
//! It decides nothing about leases or claims.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use taskhost_core::units::format_duration;

/// The most often a continuing outage is logged.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(10);

/// The first pause between tries.
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// The longest pause between tries.
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(1);

/// The pause before try `n` (0-based) of something that failed: doubling
/// from 50 ms, at most a second, each drawn from its upper half (so that
/// the loops of a node, and the nodes of a cluster, do not knock together).
pub(crate) fn pause(n: u32) -> Duration {
    let full = FIRST_PAUSE
        .saturating_mul(1u32.checked_shl(n.min(16)).unwrap_or(u32::MAX))
        .min(MAX_PAUSE);
    let half = full / 2;
    half + half.mul_f64(fastrand::f64())
}

/// The database's reachability as this node sees it.
#[derive(Debug, Default)]
pub(crate) struct Outage {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Set while the database is away: since when.
    since: Option<Instant>,
    /// Failed tries since then.
    tries: u64,
    /// Failed tries since the last line.
    unsaid: u64,
    /// When the last line about it was written.
    said: Option<Instant>,
}

impl Outage {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Something could not reach the database (`what` failed with `err`):
    /// the first failure of an outage is logged, later ones at most once
    /// every [`LOG_EVERY`], counted.
    pub(crate) fn failed(&self, what: &str, err: &dyn std::fmt::Display) {
        let now = Instant::now();
        let mut state = self.state();
        state.tries += 1;
        state.unsaid += 1;
        match state.since {
            None => {
                state.since = Some(now);
                state.said = Some(now);
                state.unsaid = 0;
                drop(state);
                tracing::warn!(
                    "PostgreSQL cannot be reached ({what}: {err}); retrying every second at \
                     most, and saying so every {}",
                    format_duration(LOG_EVERY)
                );
            }
            Some(since)
                if state
                    .said
                    .is_none_or(|t| now.duration_since(t) >= LOG_EVERY) =>
            {
                let (tries, unsaid) = (state.tries, state.unsaid);
                state.said = Some(now);
                state.unsaid = 0;
                drop(state);
                tracing::warn!(
                    "PostgreSQL still cannot be reached after {} ({tries} failed tries, \
                     {unsaid} since the last line; the last: {what}: {err})",
                    format_duration(now.duration_since(since))
                );
            }
            Some(_) => {}
        }
    }

    /// Something reached the database: an outage, if there was one, is
    /// over (logged once).
    pub(crate) fn reached(&self) {
        let mut state = self.state();
        let Some(since) = state.since.take() else {
            return;
        };
        let tries = std::mem::take(&mut state.tries);
        state.unsaid = 0;
        state.said = None;
        drop(state);
        tracing::info!(
            "PostgreSQL is reachable again, after {} and {tries} failed tries",
            format_duration(since.elapsed())
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_doubles_to_a_second_and_is_jittered_within_its_upper_half() {
        for n in 0..40 {
            let full = (FIRST_PAUSE * 2u32.pow(n.min(10))).min(MAX_PAUSE);
            let p = pause(n);
            assert!(p >= full / 2 && p <= full, "try {n}: {p:?} of {full:?}");
        }
        assert!(pause(30) <= MAX_PAUSE);
    }

    #[test]
    fn an_outage_is_down_until_something_reaches_the_database() {
        let outage = Outage::default();
        let down = |o: &Outage| o.state().since.is_some();
        assert!(!down(&outage));
        outage.failed("a test", &"refused");
        outage.failed("a test", &"refused");
        assert!(down(&outage));
        assert_eq!(outage.state().tries, 2);
        outage.reached();
        assert!(!down(&outage));
        assert_eq!(outage.state().tries, 0);
    }
}
