//! Owns the rules of time: what a cron expression in a zone means (its
//! next firing, daylight-saving transitions as cron users expect), what a
//! schedule does with firings it missed, and how times are read and
//! written (RFC 3339). Pure: no clock of its own (every function takes
//! the time it decides at), no I/O; the firing loops (one host's in
//! `backend::schedules`, a cluster's in `backend::time`) apply it.
//!
//! Expressions are standard 5-field cron (`minute hour day-of-month month
//! day-of-week`), 6-field with a leading seconds field, or one of
//! `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@hourly`
//! (croner's parser, Vixie-cron rules). Zones are IANA names (jiff's
//! bundled database, never the system's); the default is UTC.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, FixedOffset, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds};
use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde::{Deserialize, Serialize};

/// The longest a schedule's name may be, in bytes.
pub const MAX_NAME: usize = 128;

/// What a schedule does with firings that passed while the host was down or
/// the schedule was paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Missed {
    /// Fire none of them; go on from the next firing.
    Skip,
    /// Fire once for all of them (never a burst), then go on.
    #[default]
    Once,
}

impl Missed {
    /// The word of the flag and of `ls`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::Once => "once",
        }
    }
}

impl FromStr for Missed {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "skip" => Ok(Self::Skip),
            "once" => Ok(Self::Once),
            other => Err(format!("unknown --missed `{other}`: use skip or once")),
        }
    }
}

impl fmt::Display for Missed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a schedule fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FireKind {
    /// At its time (or as soon after as the host could).
    OnTime,
    /// Once for firings missed while the host was down or it was paused.
    CatchUp,
    /// On request (`host schedule run`).
    Run,
}

impl FireKind {
    /// The word of events and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OnTime => "on-time",
            Self::CatchUp => "catch-up",
            Self::Run => "run",
        }
    }
}

/// A cron expression in a zone, checked. It remembers its last answer of
/// [`CronZone::next_after`], so that many schedules of one expression
/// sharing it (a burst of them due at once) search once.
#[derive(Debug)]
pub struct CronZone {
    cron: Cron,
    tz: TimeZone,
    last: std::sync::Mutex<Option<(u64, Option<u64>)>>,
}

impl Clone for CronZone {
    fn clone(&self) -> Self {
        Self {
            cron: self.cron.clone(),
            tz: self.tz.clone(),
            last: std::sync::Mutex::new(None),
        }
    }
}

/// The names of the fields of a 5-field expression, in order.
const FIELDS: [(&str, &str); 5] = [
    ("minute", "0-59"),
    ("hour", "0-23"),
    ("day-of-month", "1-31, L, W"),
    ("month", "1-12 or JAN-DEC"),
    ("day-of-week", "0-7 or SUN-SAT, #, L"),
];

const NICKNAMES: [&str; 6] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@hourly",
];

fn parser() -> CronParser {
    CronParser::builder().seconds(Seconds::Optional).build()
}

impl CronZone {
    /// Parses `expr` in `tz` (an IANA name; `None`: UTC). The error names
    /// the field (or the zone) that is wrong and what it takes.
    pub fn parse(expr: &str, tz: Option<&str>) -> Result<Self, String> {
        let tz = match tz {
            None => TimeZone::UTC,
            Some(name) => jiff::tz::db().get(name).map_err(|_| {
                format!(
                    "unknown time zone `{name}`: use a name of the IANA time zone database, \
                     such as UTC, Europe/Berlin or America/New_York"
                )
            })?,
        };
        let text = expr.trim();
        if let Some(nick) = text.strip_prefix('@') {
            let known = NICKNAMES.iter().any(|n| n[1..].eq_ignore_ascii_case(nick));
            if !known {
                return Err(format!(
                    "unknown cron name `@{nick}`: use one of {}, or 5 fields (minute hour \
                     day-of-month month day-of-week)",
                    NICKNAMES.join(", ")
                ));
            }
        }
        let fields: Vec<&str> = text.split_whitespace().collect();
        if !text.starts_with('@') && !(5..=6).contains(&fields.len()) {
            return Err(format!(
                "the cron expression `{text}` has {} fields: use 5 (minute hour day-of-month \
                 month day-of-week), 6 with a leading seconds field, or a name such as @hourly",
                fields.len()
            ));
        }
        let cron = parser()
            .parse(text)
            .map_err(|e| explain(text, &fields, &e.to_string()))?;
        let zone = Self {
            cron,
            tz,
            last: std::sync::Mutex::new(None),
        };
        // An expression that never matches (February 30th) is refused
        // here, not found out at its first firing.
        let now = Utc::now().timestamp_millis().max(0) as u64;
        if zone.next_after(now).is_none() {
            return Err(format!(
                "the cron expression `{text}` never fires (no date matches all its fields)"
            ));
        }
        Ok(zone)
    }

    /// The zone's IANA name, as the database spells it.
    pub fn zone_name(&self) -> &str {
        self.tz.iana_name().unwrap_or("UTC")
    }

    /// The first firing strictly after `after_ms` (ms since the Unix
    /// epoch), or `None` if there is none within croner's search range.
    pub fn next_after(&self, after_ms: u64) -> Option<u64> {
        let second = after_ms / 1000;
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((asked, answer)) = *last
            && asked == second
        {
            return answer;
        }
        let answer = self.search_after(second);
        *last = Some((second, answer));
        answer
    }

    fn search_after(&self, second: u64) -> Option<u64> {
        let at = self.at_second(second)?;
        let next = self.cron.find_next_occurrence(&at, false).ok()?;
        u64::try_from(next.timestamp().as_millisecond()).ok()
    }

    /// The last firing at or before `at_ms`, if any since `since_ms`.
    fn last_at_or_before(&self, at_ms: u64, since_ms: u64) -> Option<u64> {
        let at = self.at_second(at_ms / 1000)?;
        let last = self.cron.find_previous_occurrence(&at, true).ok()?;
        let last = u64::try_from(last.timestamp().as_millisecond()).ok()?;
        (last >= since_ms).then_some(last)
    }

    /// `second` (since the Unix epoch) in this zone.
    fn at_second(&self, second: u64) -> Option<jiff::Zoned> {
        let at = Timestamp::from_second(i64::try_from(second).ok()?).ok()?;
        Some(at.to_zoned(self.tz.clone()))
    }

    /// A time as this zone shows it, RFC 3339 with the zone's offset.
    pub fn show(&self, ms: u64) -> String {
        let shown = i64::try_from(ms).ok().and_then(|ms| {
            let offset = self.tz.to_offset(Timestamp::from_millisecond(ms).ok()?);
            let offset = FixedOffset::east_opt(offset.seconds())?;
            Some(DateTime::<Utc>::from_timestamp_millis(ms)?.with_timezone(&offset))
        });
        match shown {
            Some(at) => at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            None => format_ms(ms),
        }
    }
}

/// Names the field of `fields` that makes `text` invalid, with what it
/// takes; each field is tried alone with every other one `*`.
fn explain(text: &str, fields: &[&str], error: &str) -> String {
    if text.starts_with('@') {
        return format!("invalid cron expression `{text}`: {error}");
    }
    let named: Vec<(&str, &str)> = if fields.len() == 6 {
        std::iter::once(("second", "0-59"))
            .chain(FIELDS.iter().copied())
            .collect()
    } else {
        FIELDS.to_vec()
    };
    for (i, (field, takes)) in named.iter().enumerate() {
        let probe: Vec<&str> = (0..fields.len())
            .map(|j| if j == i { fields[j] } else { "*" })
            .collect();
        if let Err(e) = parser().parse(&probe.join(" ")) {
            return format!(
                "invalid cron expression `{text}`: the {field} field `{}` is not valid ({}); \
                 it takes {takes}, with `*`, `,`, `-` and `/`",
                fields[i],
                e.to_string().trim_end_matches('.')
            );
        }
    }
    format!("invalid cron expression `{text}`: {error}")
}

/// What a schedule does now with the firings due since its last one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Fire once, for this due time, so.
    pub fire: Option<(u64, FireKind)>,
    /// Due times passed over without a firing of their own (counted up to
    /// [`COUNT_LIMIT`]).
    pub passed: u64,
    /// Its next firing from now.
    pub next_ms: Option<u64>,
}

/// Passed firings are counted up to this many.
pub const COUNT_LIMIT: u64 = 10_000;

/// Decides, at `now_ms`, for a schedule whose next firing was `next_ms`.
/// `missed`: the firings from `next_ms` to now passed while the host was
/// down or the schedule paused, and this policy applies to them; `None`:
/// the host ran all along and is only late, so it fires once (several
/// passed due times are one firing, never a burst).
pub fn decide(zone: &CronZone, next_ms: u64, now_ms: u64, missed: Option<Missed>) -> Decision {
    if next_ms > now_ms {
        return Decision {
            fire: None,
            passed: 0,
            next_ms: Some(next_ms),
        };
    }
    // The usual case, one due time: one search, whose answer is also the
    // next firing.
    let after = zone.next_after(next_ms);
    if after.is_none_or(|later| later > now_ms) {
        let (fire, passed) = match missed {
            None => (Some((next_ms, FireKind::OnTime)), 0),
            Some(Missed::Once) => (Some((next_ms, FireKind::CatchUp)), 0),
            Some(Missed::Skip) => (None, 1),
        };
        return Decision {
            fire,
            passed,
            next_ms: after,
        };
    }
    let latest = zone.last_at_or_before(now_ms, next_ms).unwrap_or(next_ms);
    let mut count = 2;
    let mut at = after.unwrap_or(next_ms);
    while count < COUNT_LIMIT {
        match zone.next_after(at) {
            Some(later) if later <= now_ms => {
                count += 1;
                at = later;
            }
            _ => break,
        }
    }
    let next = zone.next_after(now_ms);
    let (fire, passed) = match missed {
        None => (Some((latest, FireKind::OnTime)), count - 1),
        Some(Missed::Once) => (Some((latest, FireKind::CatchUp)), count - 1),
        Some(Missed::Skip) => (None, count),
    };
    Decision {
        fire,
        passed,
        next_ms: next,
    }
}

/// Checks a schedule's name: 1 to [`MAX_NAME`] bytes of letters, digits,
/// `-`, `_`, `.` and `/` (it names its firings, `<name>-<id>`).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        && !name.chars().all(|c| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid schedule name `{name}`: use 1 to {MAX_NAME} letters, digits, `-`, `_`, \
             `.` or `/`, not all digits"
        ))
    }
}

/// A time as RFC 3339 in UTC (seconds, with milliseconds when there are
/// any).
pub fn format_ms(ms: u64) -> String {
    match i64::try_from(ms)
        .ok()
        .and_then(DateTime::<Utc>::from_timestamp_millis)
    {
        Some(at) => at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        None => format!("{ms} ms after 1970"),
    }
}

/// Reads an RFC 3339 time (`2026-12-24T18:00:00Z`, `…+01:00`) as ms since
/// the Unix epoch.
pub fn parse_rfc3339(text: &str) -> Result<u64, String> {
    let at = DateTime::parse_from_rfc3339(text.trim()).map_err(|e| {
        format!(
            "`{text}` is not an RFC 3339 time ({e}); write it like 2026-12-24T18:00:00Z or \
             2026-12-24T19:00:00+01:00"
        )
    })?;
    u64::try_from(at.timestamp_millis()).map_err(|_| format!("`{text}` is before 1970"))
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> u64 {
        parse_rfc3339(text).unwrap()
    }

    fn next(zone: &CronZone, after: &str) -> String {
        zone.show(zone.next_after(ms(after)).unwrap())
    }

    #[test]
    fn five_and_six_fields_and_names_parse() {
        let every_minute = CronZone::parse("* * * * *", None).unwrap();
        assert_eq!(
            next(&every_minute, "2026-01-01T10:00:30Z"),
            "2026-01-01T10:01:00Z"
        );
        let every_second = CronZone::parse("* * * * * *", None).unwrap();
        assert_eq!(
            next(&every_second, "2026-01-01T10:00:30Z"),
            "2026-01-01T10:00:31Z"
        );
        let hourly = CronZone::parse("@hourly", None).unwrap();
        assert_eq!(
            next(&hourly, "2026-01-01T10:20:00Z"),
            "2026-01-01T11:00:00Z"
        );
        let weekdays = CronZone::parse("30 9 * * MON-FRI", Some("Europe/Berlin")).unwrap();
        // Saturday 3 January 2026: next is Monday 09:30 Berlin time.
        assert_eq!(
            next(&weekdays, "2026-01-03T12:00:00Z"),
            "2026-01-05T09:30:00+01:00"
        );
    }

    #[test]
    fn errors_name_the_field_or_the_zone() {
        let err = CronZone::parse("61 * * * *", None).unwrap_err();
        assert!(err.contains("the minute field `61`"), "{err}");
        let err = CronZone::parse("0 25 * * *", None).unwrap_err();
        assert!(err.contains("the hour field `25`"), "{err}");
        let err = CronZone::parse("0 0 * 13 *", None).unwrap_err();
        assert!(err.contains("the month field `13`"), "{err}");
        let err = CronZone::parse("0 0 0 * * FUNDAY", None).unwrap_err();
        assert!(err.contains("day-of-week field `FUNDAY`"), "{err}");
        let err = CronZone::parse("70 0 0 * * *", None).unwrap_err();
        assert!(err.contains("the second field `70`"), "{err}");
        let err = CronZone::parse("* * *", None).unwrap_err();
        assert!(err.contains("has 3 fields"), "{err}");
        let err = CronZone::parse("@fortnightly", None).unwrap_err();
        assert!(err.contains("unknown cron name `@fortnightly`"), "{err}");
        let err = CronZone::parse("0 0 30 2 *", None).unwrap_err();
        assert!(err.contains("never fires"), "{err}");
        let err = CronZone::parse("* * * * *", Some("Mars/Olympus")).unwrap_err();
        assert!(err.contains("unknown time zone `Mars/Olympus`"), "{err}");
    }

    /// Zones are looked up without regard to case and shown as the
    /// database spells them; the database's links (old names) resolve too.
    #[test]
    fn zone_names_are_the_databases() {
        let zone = |name| CronZone::parse("* * * * *", name).unwrap();
        assert_eq!(zone(None).zone_name(), "UTC");
        assert_eq!(zone(Some("europe/BERLIN")).zone_name(), "Europe/Berlin");
        let eastern = zone(Some("US/Eastern"));
        assert_eq!(
            eastern.show(ms("2026-07-01T12:00:00Z")),
            "2026-07-01T08:00:00-04:00"
        );
        assert_eq!(
            zone(Some("UTC")).show(ms("2026-07-01T12:00:00Z")),
            "2026-07-01T12:00:00Z"
        );
    }

    /// Spring forward in Berlin (29 March 2026, 02:00 → 03:00): a daily
    /// 02:30 job, whose time does not exist that day, fires at the first
    /// instant after the gap (03:00 local), once; an every-15-minutes job
    /// has no firings in the missing hour.
    #[test]
    fn spring_forward_gap() {
        let daily = CronZone::parse("30 2 * * *", Some("Europe/Berlin")).unwrap();
        assert_eq!(
            next(&daily, "2026-03-28T12:00:00Z"),
            "2026-03-29T03:00:00+02:00"
        );
        assert_eq!(
            next(&daily, "2026-03-29T01:00:00Z"),
            "2026-03-30T02:30:00+02:00"
        );
        let quarter = CronZone::parse("*/15 * * * *", Some("Europe/Berlin")).unwrap();
        let mut at = ms("2026-03-29T00:40:00Z"); // 01:40 local
        let mut seen = Vec::new();
        for _ in 0..3 {
            at = quarter.next_after(at).unwrap();
            seen.push(quarter.show(at));
        }
        assert_eq!(
            seen,
            [
                "2026-03-29T01:45:00+01:00",
                "2026-03-29T03:00:00+02:00",
                "2026-03-29T03:15:00+02:00"
            ]
        );
    }

    /// Fall back in New York (1 November 2026, 02:00 → 01:00): a daily
    /// 01:30 job fires once, at the first 01:30; an hourly-at-:30 job fires
    /// at both 01:30s, an hour apart.
    #[test]
    fn fall_back_overlap() {
        let daily = CronZone::parse("30 1 * * *", Some("America/New_York")).unwrap();
        let first = daily.next_after(ms("2026-11-01T04:00:00Z")).unwrap();
        assert_eq!(daily.show(first), "2026-11-01T01:30:00-04:00");
        assert_eq!(
            daily.show(daily.next_after(first).unwrap()),
            "2026-11-02T01:30:00-05:00"
        );
        let hourly = CronZone::parse("30 * * * *", Some("America/New_York")).unwrap();
        let first = hourly.next_after(ms("2026-11-01T05:00:00Z")).unwrap();
        assert_eq!(hourly.show(first), "2026-11-01T01:30:00-04:00");
        let second = hourly.next_after(first).unwrap();
        assert_eq!(hourly.show(second), "2026-11-01T01:30:00-05:00");
        assert_eq!(second - first, 3_600_000);
    }

    #[test]
    fn missed_firings_fire_once_or_not_at_all() {
        let zone = CronZone::parse("* * * * * *", None).unwrap();
        let due = ms("2026-01-01T10:00:00Z");
        let now = due + 9_500; // ten firings passed
        let on_time = decide(&zone, due, due + 3, None);
        assert_eq!(on_time.fire, Some((due, FireKind::OnTime)));
        assert_eq!(on_time.next_ms, Some(due + 1_000));
        let late = decide(&zone, due, now, None);
        assert_eq!(late.fire, Some((due + 9_000, FireKind::OnTime)));
        assert_eq!(late.passed, 9);
        let once = decide(&zone, due, now, Some(Missed::Once));
        assert_eq!(once.fire, Some((due + 9_000, FireKind::CatchUp)));
        assert_eq!(once.next_ms, Some(due + 10_000));
        let skip = decide(&zone, due, now, Some(Missed::Skip));
        assert_eq!(skip.fire, None);
        assert_eq!(skip.passed, 10);
        assert_eq!(skip.next_ms, Some(due + 10_000));
        let early = decide(&zone, due, due - 1, Some(Missed::Once));
        assert_eq!(early.fire, None);
        assert_eq!(early.next_ms, Some(due));
    }

    #[test]
    fn names_and_times() {
        assert!(check_name("nightly-backup").is_ok());
        assert!(check_name("team/report.v2").is_ok());
        assert!(check_name("42").is_err());
        assert!(check_name("has space").is_err());
        assert!(check_name("").is_err());
        assert_eq!(
            format_ms(ms("2026-12-24T18:00:00Z")),
            "2026-12-24T18:00:00Z"
        );
        assert_eq!(ms("2026-12-24T19:00:00+01:00"), ms("2026-12-24T18:00:00Z"));
        assert!(parse_rfc3339("tomorrow").unwrap_err().contains("RFC 3339"));
    }
}
