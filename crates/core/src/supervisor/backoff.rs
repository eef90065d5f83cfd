//! Owns the delay between attempts: `min(first * factor^i, max)`, then
//! jitter, then raised to `floor`, at least 1 ms when non-zero, capped at
//! `max`; and the one textual form of a backoff (`FIRST,MAX,FACTOR,JITTER`)
//! that the CLI and the config file share.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::units::parse_duration;

/// How the delay is randomised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Jitter {
    /// Exactly the computed delay.
    None,
    /// Uniform in `[0, d]`.
    Full,
    /// Uniform in `[d/2, d]`.
    #[default]
    Equal,
    /// Uniform in `[first, min(3d, max)]` (a randomised band).
    Decorrelated,
}

impl std::fmt::Display for Jitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Full => "full",
            Self::Equal => "equal",
            Self::Decorrelated => "decorrelated",
        })
    }
}

impl std::str::FromStr for Jitter {
    type Err = BackoffError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "none" => Ok(Self::None),
            "full" => Ok(Self::Full),
            "equal" => Ok(Self::Equal),
            "decorrelated" => Ok(Self::Decorrelated),
            other => Err(BackoffError::Syntax(format!(
                "invalid jitter `{other}`: use none, full, equal or decorrelated"
            ))),
        }
    }
}

/// The backoff between failed attempts. Its text form is
/// `FIRST,MAX,FACTOR,JITTER` (a prefix is enough; the rest keeps the
/// defaults) or `key=value` pairs:
///
/// ```
/// use std::time::Duration;
/// use taskhost_core::supervisor::{BackoffPolicy, Jitter};
///
/// let b: BackoffPolicy = "100ms,10s,3".parse().unwrap();
/// assert_eq!(b, BackoffPolicy::new(Duration::from_millis(100), Duration::from_secs(10), 3.0, Jitter::Equal).unwrap());
/// let b: BackoffPolicy = "jitter=none, first=1s".parse().unwrap();
/// assert_eq!(b.delay(0), Duration::from_secs(1));
/// assert!("1s,100ms".parse::<BackoffPolicy>().is_err()); // first above max
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawBackoff", into = "RawBackoff")]
pub struct BackoffPolicy {
    first: Duration,
    max: Duration,
    factor: f64,
    jitter: Jitter,
    floor: Duration,
}

/// The serde form of a [`BackoffPolicy`], validated on the way in.
#[derive(Serialize, Deserialize)]
struct RawBackoff {
    first: Duration,
    max: Duration,
    factor: f64,
    jitter: Jitter,
    floor: Duration,
}

impl TryFrom<RawBackoff> for BackoffPolicy {
    type Error = BackoffError;

    fn try_from(raw: RawBackoff) -> Result<Self, Self::Error> {
        Ok(Self::new(raw.first, raw.max, raw.factor, raw.jitter)?.with_floor(raw.floor))
    }
}

impl From<BackoffPolicy> for RawBackoff {
    fn from(b: BackoffPolicy) -> Self {
        Self {
            first: b.first,
            max: b.max,
            factor: b.factor,
            jitter: b.jitter,
            floor: b.floor,
        }
    }
}

impl std::str::FromStr for BackoffPolicy {
    type Err = BackoffError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let defaults = Self::default();
        let (mut first, mut max, mut factor, mut jitter) = (
            defaults.first,
            defaults.max,
            defaults.factor,
            defaults.jitter,
        );
        for (i, item) in text.split(',').map(str::trim).enumerate() {
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k.trim(), v.trim()),
                None => (
                    ["first", "max", "factor", "jitter"]
                        .get(i)
                        .copied()
                        .unwrap_or("?"),
                    item,
                ),
            };
            let duration =
                |v: &str| parse_duration(v).map_err(|e| BackoffError::Syntax(e.to_string()));
            match key {
                "first" => first = duration(value)?,
                "max" => max = duration(value)?,
                "factor" => {
                    factor = value.parse().map_err(|_| {
                        BackoffError::Syntax(format!(
                            "invalid backoff factor `{value}`: use a number >= 1"
                        ))
                    })?;
                }
                "jitter" => jitter = value.parse()?,
                _ => {
                    return Err(BackoffError::Syntax(format!(
                        "unknown backoff part `{item}`; use FIRST,MAX,FACTOR,JITTER such as 100ms,10s,2,equal"
                    )));
                }
            }
        }
        Self::new(first, max, factor, jitter)
    }
}

impl std::fmt::Display for BackoffPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{},{},{},{}",
            crate::units::format_duration(self.first),
            crate::units::format_duration(self.max),
            self.factor,
            self.jitter
        )
    }
}

/// A backoff that makes no sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackoffError {
    /// The text form could not be read.
    #[error("{0}")]
    Syntax(String),
    /// The factor is below 1 or not a finite number.
    #[error("backoff factor must be a finite number >= 1")]
    Factor,
    /// The first delay is larger than the maximum.
    #[error("the first backoff delay must not exceed the maximum")]
    FirstAboveMax,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            first: Duration::from_millis(200),
            max: Duration::from_secs(30),
            factor: 2.0,
            jitter: Jitter::Equal,
            floor: Duration::ZERO,
        }
    }
}

impl BackoffPolicy {
    /// A validated policy.
    pub fn new(
        first: Duration,
        max: Duration,
        factor: f64,
        jitter: Jitter,
    ) -> Result<Self, BackoffError> {
        if !factor.is_finite() || factor < 1.0 {
            return Err(BackoffError::Factor);
        }
        if first > max {
            return Err(BackoffError::FirstAboveMax);
        }
        Ok(Self {
            first,
            max,
            factor,
            jitter,
            floor: Duration::ZERO,
        })
    }

    /// The same delay every time, without jitter.
    pub fn constant(delay: Duration) -> Self {
        Self {
            first: delay,
            max: delay,
            factor: 1.0,
            jitter: Jitter::None,
            floor: Duration::ZERO,
        }
    }

    /// Raises every delay to at least `floor` (still capped at `max`).
    pub fn with_floor(mut self, floor: Duration) -> Self {
        self.floor = floor;
        self
    }

    /// The longest delay it gives.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The jitter in use.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The delay before retry `i` (0-based).
    pub fn delay(&self, retry: u32) -> Duration {
        self.delay_with(retry, fastrand::f64)
    }

    /// The delay before retry `i`, with `unit()` giving uniform numbers in
    /// `[0, 1)` (injectable for exact tests).
    pub fn delay_with(&self, retry: u32, mut unit: impl FnMut() -> f64) -> Duration {
        let first = self.first.as_secs_f64();
        let max = self.max.as_secs_f64();
        let grown = first * self.factor.powi(retry.min(1_000) as i32);
        let d = if grown.is_finite() {
            grown.min(max)
        } else {
            max
        };
        let jittered = match self.jitter {
            Jitter::None => d,
            Jitter::Full => d * unit(),
            Jitter::Equal => d / 2.0 + d / 2.0 * unit(),
            Jitter::Decorrelated => {
                let high = (3.0 * d).min(max);
                let low = first.min(high);
                low + (high - low) * unit()
            }
        };
        let mut delay = jittered.max(self.floor.as_secs_f64());
        // A non-zero policy never retries at once, even when the jitter
        // draws zero; only a zero policy (constant zero) means no pause.
        if d > 0.0 || delay > 0.0 {
            delay = delay.max(0.001);
        }
        Duration::from_secs_f64(delay.min(max.max(0.001)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn grows_by_factor_and_caps_at_max() {
        let b = BackoffPolicy::new(ms(100), ms(1000), 2.0, Jitter::None).unwrap();
        let got: Vec<_> = (0..6).map(|i| b.delay(i)).collect();
        assert_eq!(
            got,
            [ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000)]
        );
        assert_eq!(b.delay(u32::MAX), ms(1000));
    }

    #[test]
    fn jitter_ranges() {
        let b = |j| BackoffPolicy::new(ms(100), ms(1000), 2.0, j).unwrap();
        assert_eq!(
            b(Jitter::Full).delay_with(1, || 0.0),
            ms(1),
            "zero is raised to 1 ms"
        );
        assert_eq!(b(Jitter::Full).delay_with(1, || 0.5), ms(100));
        assert_eq!(b(Jitter::Equal).delay_with(1, || 0.0), ms(100));
        assert_eq!(
            b(Jitter::Equal).delay_with(1, || 0.999_999),
            Duration::from_secs_f64(0.1999999)
        );
        assert_eq!(b(Jitter::Decorrelated).delay_with(1, || 0.0), ms(100));
        assert_eq!(
            b(Jitter::Decorrelated)
                .delay_with(3, || 0.999_999_9)
                .as_millis(),
            999
        );
    }

    #[test]
    fn floor_and_validation() {
        let b = BackoffPolicy::new(ms(10), ms(100), 1.0, Jitter::Full)
            .unwrap()
            .with_floor(ms(50));
        assert_eq!(b.delay_with(0, || 0.0), ms(50));
        assert_eq!(
            BackoffPolicy::new(ms(10), ms(100), 0.5, Jitter::None),
            Err(BackoffError::Factor)
        );
        assert_eq!(
            BackoffPolicy::new(ms(10), ms(100), f64::NAN, Jitter::None),
            Err(BackoffError::Factor)
        );
        assert_eq!(
            BackoffPolicy::new(ms(200), ms(100), 2.0, Jitter::None),
            Err(BackoffError::FirstAboveMax)
        );
        assert_eq!(
            BackoffPolicy::constant(Duration::ZERO).delay(3),
            Duration::ZERO
        );
    }
}
