//! Owns what an operator sets on slots: each rule names a slot exactly or
//! by a glob pattern (`*` any run of characters, `/` included; `?` one
//! character) and says how many owners the slots it matches may hold at
//! once (`capacity`), how many submissions may wait in each
//! (`max_queue`), and whether a submission first waits to see if a newer
//! one comes (`debounce`, at most `max_wait` from the first). A slot takes its settings from the rule that names it
//! exactly, else from the longest pattern that matches it (of two as long,
//! the first in byte order). What no rule sets is today's: one owner, the
//! host's `max_slot_queue`.
//!
//! ```
//! use taskhost_core::slot_settings::{SlotRules, SlotSettings};
//!
//! let mut rules = SlotRules::default();
//! rules.set("db/*", SlotSettings { capacity: Some(4), ..Default::default() }).unwrap();
//! rules.set("db/main", SlotSettings { capacity: Some(1), max_queue: Some(10), ..Default::default() }).unwrap();
//! assert_eq!(rules.for_slot("db/replica").capacity, Some(4));
//! assert_eq!(rules.for_slot("db/main").capacity, Some(1));
//! assert_eq!(rules.for_slot("cache").capacity, None);
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The most owners one slot may hold at once.
pub const MAX_CAPACITY: u32 = 100_000;

/// The longest debounce or `max_wait` (a day).
pub const MAX_DEBOUNCE: Duration = Duration::from_secs(24 * 3600);

/// The longest pattern a rule may have.
pub const MAX_PATTERN: usize = 512;

/// The most rules a host keeps.
pub const MAX_RULES: usize = 10_000;

/// What a rule sets on the slots it matches; a field left `None` keeps the
/// default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotSettings {
    /// Owners at once (1 to [`MAX_CAPACITY`]); the default is 1.
    #[serde(default)]
    pub capacity: Option<u32>,
    /// Submissions waiting in one slot, counting a replacement head; the
    /// default is the host's `max_slot_queue`.
    #[serde(default)]
    pub max_queue: Option<usize>,
    /// How long a submission waits before it is placed; a newer one for
    /// the same slot in that time supersedes it and waits again.
    #[serde(default)]
    pub debounce: Option<Duration>,
    /// How long after the first of a run of superseding submissions the
    /// newest is placed at the latest (with `debounce`).
    #[serde(default)]
    pub max_wait: Option<Duration>,
    /// How many attempts of the slot's tasks may start per period (a
    /// restart or a retry is a start too).
    #[serde(default)]
    pub rate: Option<Rate>,
    /// Starts the slot may make beyond the rate's pace (with `rate`): in
    /// any window of the period at most `starts + burst` [default: 0].
    #[serde(default)]
    pub burst: Option<u32>,
}

/// A rate of starts: `starts` per `per`, written `100/s`, `5/10s` or
/// `60/1m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    /// Starts per period (at least 1).
    pub starts: u32,
    /// The period.
    pub per: Duration,
}

impl std::str::FromStr for Rate {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("a rate is STARTS/PERIOD, such as 100/s or 5/10s, not `{text}`");
        let (starts, per) = text.split_once('/').ok_or_else(bad)?;
        let starts: u32 = starts.trim().parse().map_err(|_| bad())?;
        let per = per.trim();
        // `100/s`: one of the unit.
        let per = if per.starts_with(|c: char| c.is_ascii_alphabetic()) {
            format!("1{per}")
        } else {
            per.to_owned()
        };
        let per = crate::units::parse_duration(&per).map_err(|_| bad())?;
        let rate = Rate { starts, per };
        rate.check()?;
        Ok(rate)
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}",
            self.starts,
            crate::units::format_duration(self.per)
        )
    }
}

impl Rate {
    fn check(&self) -> Result<(), String> {
        if self.starts == 0 {
            return Err("a rate must allow at least 1 start per period".into());
        }
        if self.per.is_zero() || self.per > MAX_DEBOUNCE {
            return Err(format!(
                "a rate's period must be more than zero and at most {MAX_DEBOUNCE:?}"
            ));
        }
        Ok(())
    }
}

/// One slot's budget of starts (a generic cell rate algorithm): a start
/// is allowed when it keeps every window of the rate's period at most
/// `starts + burst` (`burst` starts may run ahead of the pace); else the
/// budget says when the next one is.
#[derive(Debug)]
pub struct StartBudget {
    /// What it was made of.
    made_of: (Rate, u32),
    /// The time one start takes of the period (rounded up).
    interval: Duration,
    /// How far ahead of the pace starts may run (`burst` intervals).
    slack: Duration,
    /// When the pace next allows a start with no slack left.
    next: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// The turn to start: a task that found the budget spent waits for it
    /// in line, so that one waiter at a time sleeps until the next start
    /// and the others are not woken for nothing.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// The tasks waiting in line (refused, not started yet).
    waiting: std::sync::atomic::AtomicUsize,
    /// No start before this (`hold`).
    held: std::sync::Mutex<Option<tokio::time::Instant>>,
}

/// A task's place in a budget's line: counted while it is held.
#[derive(Debug)]
pub struct InLine(Arc<StartBudget>);

impl Drop for InLine {
    fn drop(&mut self) {
        self.0
            .waiting
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl StartBudget {
    /// A full budget of `rate` with `burst`.
    pub fn new(rate: Rate, burst: u32) -> Self {
        let nanos = rate.per.as_nanos().div_ceil(u128::from(rate.starts.max(1)));
        let interval = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        Self {
            made_of: (rate, burst),
            interval,
            slack: interval.saturating_mul(burst),
            next: std::sync::Mutex::new(None),
            turn: Arc::default(),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            held: std::sync::Mutex::new(None),
        }
    }

    /// A budget of `rate` with `burst` that takes up where `old` stands:
    /// its next start is not sooner than `old`'s would have been, so a
    /// change of rate never starts a full burst at once.
    pub fn after(old: &StartBudget, rate: Rate, burst: u32) -> Self {
        let budget = Self::new(rate, burst);
        let next = *old
            .next
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // `old`'s next start with no slack left, as this one counts it.
        *budget
            .next
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            next.map(|t| t + budget.slack.saturating_sub(old.slack));
        if let Some(held) = old.held_at(tokio::time::Instant::now()) {
            budget.hold(held);
        }
        budget
    }

    /// Whether it was made of this rate and burst.
    pub fn is_of(&self, rate: Rate, burst: u32) -> bool {
        self.made_of == (rate, burst)
    }

    /// Whether a start now would find it full (as a new one).
    pub fn is_full(&self, now: tokio::time::Instant) -> bool {
        if self.held_at(now).is_some() {
            return false;
        }
        let next = self
            .next
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        next.is_none_or(|t| t <= now)
    }

    /// How many starts the budget would allow at `now`, one after another
    /// (`burst + 1` when full, 0 while a start must wait).
    pub fn available(&self, now: tokio::time::Instant) -> u32 {
        if self.held_at(now).is_some() {
            return 0;
        }
        let next = self
            .next
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let ahead = next.map_or(Duration::ZERO, |t| t.saturating_duration_since(now));
        let left = (now + self.slack).saturating_duration_since(now + ahead);
        if ahead > self.slack {
            return 0;
        }
        let interval = self.interval.as_nanos().max(1);
        u32::try_from(left.as_nanos() / interval + 1).unwrap_or(u32::MAX)
    }

    /// The most starts it allows one after another (`burst + 1`).
    pub fn most(&self) -> u32 {
        self.made_of.1.saturating_add(1)
    }

    /// Allows no start before `until` (then as the budget stands).
    pub fn hold(&self, until: tokio::time::Instant) {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *held = Some(held.map_or(until, |h| h.max(until)));
    }

    /// Until when it is held, if it still is at `now`.
    fn held_at(&self, now: tokio::time::Instant) -> Option<tokio::time::Instant> {
        let held = *self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.filter(|h| *h > now)
    }

    /// The rate it was made of.
    pub fn rate(&self) -> Rate {
        self.made_of.0
    }

    /// A place in line for a task the budget refused, until it starts or
    /// gives up (the place dropped).
    pub fn join_line(self: &Arc<Self>) -> InLine {
        self.waiting
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        InLine(Arc::clone(self))
    }

    /// Whether at least a period's worth of starts waits in line.
    pub fn is_crowded(&self) -> bool {
        self.waiting.load(std::sync::atomic::Ordering::Relaxed)
            >= self.made_of.0.starts.max(1) as usize
    }

    /// The turn to start, at once if no other task waits for it.
    pub fn try_turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        self.turn.clone().try_lock_owned().ok()
    }

    /// The turn to start, after the tasks that waited for it before.
    pub async fn turn(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.turn.clone().lock_owned().await
    }

    /// When the next start may be (`now` when the budget allows one).
    pub fn next_start(&self, now: tokio::time::Instant) -> tokio::time::Instant {
        if let Some(held) = self.held_at(now) {
            return held;
        }
        let next = self
            .next
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        next.map_or(now, |t| t.max(now + self.slack) - self.slack)
    }

    /// Takes one start at `now` if the budget allows it; else the time
    /// the next start may be.
    pub fn try_start(&self, now: tokio::time::Instant) -> Result<(), tokio::time::Instant> {
        if let Some(held) = self.held_at(now) {
            return Err(held);
        }
        let mut next = self
            .next
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = next.map_or(now, |t| t.max(now));
        if at <= now + self.slack {
            *next = Some(at + self.interval);
            Ok(())
        } else {
            Err(at - self.slack)
        }
    }
}

impl SlotSettings {
    /// The capacity as the rules use it.
    pub fn capacity(&self) -> usize {
        self.capacity.map_or(1, |c| c as usize)
    }

    /// Refuses a capacity of 0 or above [`MAX_CAPACITY`], a debounce of
    /// zero or above [`MAX_DEBOUNCE`], and a `max_wait` without a debounce
    /// or shorter than it, naming the fix.
    pub fn check(&self) -> Result<(), String> {
        match self.capacity {
            Some(0) => return Err("--capacity must be at least 1".to_owned()),
            Some(c) if c > MAX_CAPACITY => {
                return Err(format!(
                    "--capacity {c} is above the most a slot may hold ({MAX_CAPACITY})"
                ));
            }
            _ => {}
        }
        for (flag, value) in [("--debounce", self.debounce), ("--max-wait", self.max_wait)] {
            match value {
                Some(d) if d.is_zero() => return Err(format!("{flag} must be more than zero")),
                Some(d) if d > MAX_DEBOUNCE => {
                    return Err(format!("{flag} may be {MAX_DEBOUNCE:?} at the most"));
                }
                _ => {}
            }
        }
        if let Some(rate) = self.rate {
            rate.check()?;
        }
        match (self.rate, self.burst) {
            (None, Some(_)) => return Err("--burst goes with a rate: give --rate too".to_owned()),
            (_, Some(b)) if b > MAX_CAPACITY => {
                return Err(format!("--burst may be {MAX_CAPACITY} at the most"));
            }
            _ => {}
        }
        match (self.debounce, self.max_wait) {
            (None, Some(_)) => Err("--max-wait bounds a debounce: give --debounce too".to_owned()),
            (Some(d), Some(w)) if w < d => {
                Err("--max-wait must be at least --debounce (it bounds a run of them)".to_owned())
            }
            _ => Ok(()),
        }
    }
}

/// The operator's rules, by pattern.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotRules {
    exact: BTreeMap<String, SlotSettings>,
    /// Patterns with a wildcard, longest first.
    globs: Vec<(String, SlotSettings)>,
    /// Whether any rule debounces (submissions skip the lookup otherwise).
    debounces: bool,
}

impl SlotRules {
    /// Sets the rule for `pattern` (replacing one there was); refuses a
    /// pattern that is empty or too long, bad settings, and a rule past
    /// [`MAX_RULES`].
    pub fn set(&mut self, pattern: &str, settings: SlotSettings) -> Result<(), String> {
        check_pattern(scoped(pattern).1)?;
        settings.check()?;
        let known = self.exact.contains_key(pattern) || self.globs.iter().any(|g| g.0 == pattern);
        if !known && self.len() >= MAX_RULES {
            return Err(format!(
                "the host holds its limit of {MAX_RULES} slot rules; unset some first (`host slot unset PATTERN`)"
            ));
        }
        if is_glob(pattern) {
            self.globs.retain(|g| g.0 != pattern);
            self.globs.push((pattern.to_owned(), settings));
            self.globs
                .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        } else {
            self.exact.insert(pattern.to_owned(), settings);
        }
        self.count_debounces();
        Ok(())
    }

    fn count_debounces(&mut self) {
        let mut all = self.exact.values().chain(self.globs.iter().map(|g| &g.1));
        self.debounces = all.any(|s| s.debounce.is_some());
    }

    /// Whether any rule debounces.
    pub fn debounces(&self) -> bool {
        self.debounces
    }

    /// Removes the rule for `pattern`; false if there was none.
    pub fn unset(&mut self, pattern: &str) -> bool {
        let before = self.len();
        self.exact.remove(pattern);
        self.globs.retain(|g| g.0 != pattern);
        self.count_debounces();
        self.len() != before
    }

    /// The settings of slot `key`.
    pub fn for_slot(&self, key: &str) -> SlotSettings {
        if let Some(settings) = self.exact.get(key) {
            return *settings;
        }
        self.globs
            .iter()
            .find(|(pattern, _)| {
                let ((scope, pattern), (key_scope, key)) = (scoped(pattern), scoped(key));
                scope == key_scope && matches(pattern.as_bytes(), key.as_bytes())
            })
            .map(|(_, settings)| *settings)
            .unwrap_or_default()
    }

    /// Every rule, by pattern.
    pub fn rules(&self) -> Vec<(String, SlotSettings)> {
        let mut all: Vec<_> = self
            .exact
            .iter()
            .map(|(p, s)| (p.clone(), *s))
            .chain(self.globs.iter().cloned())
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.exact.len() + self.globs.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Refuses an empty pattern, one over [`MAX_PATTERN`] bytes, and one with
/// control characters.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("a slot pattern must not be empty (name a slot, or use `*` for all)".into());
    }
    let length = pattern.chars().count();
    if length > MAX_PATTERN {
        return Err(format!(
            "a slot pattern may be {MAX_PATTERN} characters at the most (this one is {length})"
        ));
    }
    if pattern.chars().any(char::is_control) {
        return Err("a slot pattern must not contain control characters".into());
    }
    Ok(())
}

/// The separator between a slot's scope (an embedder's namespace) and its
/// name: a pattern matches only the slots of its own scope, its wildcards
/// the names in it.
pub const SCOPE_SEPARATOR: char = '\u{1f}';

/// A slot's or a pattern's scope and the rest.
fn scoped(text: &str) -> (Option<&str>, &str) {
    match text.split_once(SCOPE_SEPARATOR) {
        Some((scope, rest)) => (Some(scope), rest),
        None => (None, text),
    }
}

/// Whether `text` matches the glob `pattern` (`*` any run, `?` one
/// character), as a slot rule's pattern matches a slot's name.
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    matches(pattern.as_bytes(), text.as_bytes())
}

fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?'])
}

/// Whether `text` matches `pattern` (`*` any run, `?` one character): the
/// usual two-pointer walk, back to the last star on a mismatch, so linear
/// in practice and never worse than their product.
fn matches(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(b'?') => {
                // One character, not one byte.
                p += 1;
                t += utf8_len(text[t]);
            }
            Some(c) if *c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    let next = st + utf8_len(text[st]);
                    star = Some((sp, next));
                    p = sp + 1;
                    t = next;
                }
                None => return false,
            },
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|c| *c == b'*')
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xF0..=0xFF => 4,
        0xE0..=0xEF => 3,
        0xC0..=0xDF => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(n: u32) -> SlotSettings {
        SlotSettings {
            capacity: Some(n),
            ..SlotSettings::default()
        }
    }

    #[test]
    fn a_budget_counts_the_starts_it_allows_now() {
        let rate = Rate {
            starts: 10,
            per: Duration::from_secs(1),
        };
        let budget = StartBudget::new(rate, 2);
        let now = tokio::time::Instant::now();
        assert_eq!((budget.available(now), budget.most()), (3, 3));
        for left in [2, 1, 0] {
            budget.try_start(now).unwrap();
            assert_eq!(budget.available(now), left);
        }
        assert!(budget.try_start(now).is_err());
        // One interval later, one more.
        assert_eq!(budget.available(now + Duration::from_millis(100)), 1);
    }

    #[test]
    fn a_pattern_matches_only_the_slots_of_its_own_scope() {
        let mut rules = SlotRules::default();
        let two = SlotSettings {
            capacity: Some(2),
            ..SlotSettings::default()
        };
        rules.set("*", two).unwrap();
        let three = SlotSettings {
            capacity: Some(3),
            ..SlotSettings::default()
        };
        rules.set("a\u{1f}db/*", three).unwrap();
        assert_eq!(rules.for_slot("db/x").capacity, Some(2));
        assert_eq!(rules.for_slot("a\u{1f}db/x").capacity, Some(3));
        assert_eq!(
            rules.for_slot("a\u{1f}other").capacity,
            None,
            "`*` stays in its scope"
        );
        assert_eq!(rules.for_slot("b\u{1f}db/x").capacity, None);
        assert!(rules.set("a\u{1f}b\u{1f}c", two).is_err(), "one scope only");
    }

    #[test]
    fn globs_match_runs_and_single_characters() {
        for (pattern, text, want) in [
            ("*", "", true),
            ("*", "db/main", true),
            ("db/*", "db/main", true),
            ("db/*", "db", false),
            ("db/*", "db/a/b", true),
            ("*/main", "db/main", true),
            ("d?/x", "db/x", true),
            ("d?/x", "dbb/x", false),
            ("?", "é", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("**", "anything", true),
        ] {
            assert_eq!(
                matches(pattern.as_bytes(), text.as_bytes()),
                want,
                "{pattern} ~ {text}"
            );
        }
    }

    #[test]
    fn the_exact_name_wins_then_the_longest_pattern() {
        let mut rules = SlotRules::default();
        rules.set("*", cap(2)).unwrap();
        rules.set("db/*", cap(3)).unwrap();
        rules.set("db/main", cap(5)).unwrap();
        assert_eq!(rules.for_slot("db/main").capacity, Some(5));
        assert_eq!(rules.for_slot("db/other").capacity, Some(3));
        assert_eq!(rules.for_slot("web").capacity, Some(2));
        assert!(rules.unset("db/*"));
        assert!(!rules.unset("db/*"));
        assert_eq!(rules.for_slot("db/other").capacity, Some(2));
        rules.set("*", cap(7)).unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules.for_slot("web").capacity, Some(7));
    }

    #[test]
    fn bad_patterns_and_capacities_are_refused_with_their_fix() {
        let mut rules = SlotRules::default();
        assert!(
            rules
                .set("", cap(1))
                .unwrap_err()
                .contains("must not be empty")
        );
        assert!(rules.set("x", cap(0)).unwrap_err().contains("at least 1"));
        assert!(
            rules
                .set("x", cap(MAX_CAPACITY + 1))
                .unwrap_err()
                .contains("above the most")
        );
        assert!(rules.set(&"x".repeat(MAX_PATTERN + 1), cap(1)).is_err());
        assert!(rules.is_empty());
    }
}
