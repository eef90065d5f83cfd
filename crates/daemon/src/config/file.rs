//! Owns reading the TOML file into [`Settings`]: every key optional, an
//! unknown one an error; durations and sizes are strings, grants lists of
//! strings, each read into its value here. A file that is not TOML, or a
//! key of the wrong type, is told with the file's name and the place in
//! it; a value that does not read, with its key (`grace: …`).

use std::collections::BTreeMap;
use std::fmt::Display;
use std::path::Path;
use std::time::Duration;

use serde::de::{Deserialize, Deserializer};

use taskhost_core::units::{parse_duration, parse_size};
use taskhost_runtime::HttpAllow;

use super::{DirAllow, Settings};

/// What opens the message of a value that does not read, so that
/// [`Settings::from_file`] tells it with its key rather than as the file's
/// shape.
const VALUE: &str = "\u{0}value\u{0}";

impl Settings {
    /// The settings of a TOML file.
    pub fn from_file(path: &Path) -> Result<Settings, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config `{}`: {e}", path.display()))?;
        let invalid = |e: toml::de::Error| format!("invalid config `{}`: {e}", path.display());
        let document = toml::Deserializer::parse(&text).map_err(invalid)?;
        serde_path_to_error::deserialize(document).map_err(|e| {
            let key = e.path().to_string();
            let e = e.into_inner();
            match e.message().strip_prefix(VALUE) {
                Some(why) => format!("{key}: {why}"),
                None => invalid(e),
            }
        })
    }
}

/// The error of a value that does not read.
fn refuse<E: serde::de::Error>(why: impl Display) -> E {
    E::custom(format_args!("{VALUE}{why}"))
}

/// Each string of a list, read by `read`.
fn each<'de, D: Deserializer<'de>, T>(
    d: D,
    read: impl Fn(String) -> Result<T, String>,
) -> Result<Option<Vec<T>>, D::Error> {
    Vec::<String>::deserialize(d)?
        .into_iter()
        .map(|text| read(text).map_err(refuse))
        .collect::<Result<_, _>>()
        .map(Some)
}

/// A duration such as `"10s"`.
pub(super) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    parse_duration(&text).map(Some).map_err(refuse)
}

/// A slot rule of the `slots` table: `capacity`, `max_queue`, and
/// `debounce` and `max_wait` as durations such as `"2s"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotRule {
    #[serde(default)]
    capacity: Option<u32>,
    #[serde(default)]
    max_queue: Option<usize>,
    #[serde(default, deserialize_with = "duration")]
    debounce: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    max_wait: Option<Duration>,
    #[serde(default, deserialize_with = "rate")]
    rate: Option<taskhost_core::slot_settings::Rate>,
    #[serde(default)]
    burst: Option<u32>,
}

/// A rate such as `"100/s"`.
fn rate<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<taskhost_core::slot_settings::Rate>, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map(Some).map_err(refuse)
}

impl From<SlotRule> for taskhost_core::slot_settings::SlotSettings {
    fn from(rule: SlotRule) -> Self {
        Self {
            capacity: rule.capacity,
            max_queue: rule.max_queue,
            debounce: rule.debounce,
            max_wait: rule.max_wait,
            rate: rule.rate,
            burst: rule.burst,
        }
    }
}

/// A namespace of the `namespaces` table: its `weight`, its quotas by
/// their keys (`max_running`, `max_waiting`, `max_schedules`,
/// `max_submit_rate`, `max_descendants`; `memory_ceiling` and
/// `max_kv_bytes` as sizes such as `"256MiB"`), and the daemon's `secrets` it may name.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceEntry {
    #[serde(default)]
    pub(crate) weight: Option<u32>,
    #[serde(default)]
    pub(crate) max_running: Option<u64>,
    #[serde(default)]
    pub(crate) max_waiting: Option<u64>,
    #[serde(default)]
    pub(crate) max_schedules: Option<u64>,
    #[serde(default)]
    pub(crate) max_submit_rate: Option<u64>,
    #[serde(default)]
    pub(crate) max_descendants: Option<u64>,
    #[serde(default, deserialize_with = "size")]
    pub(crate) memory_ceiling: Option<u64>,
    #[serde(default, deserialize_with = "size")]
    pub(crate) max_kv_bytes: Option<u64>,
    #[serde(default)]
    pub(crate) secrets: Vec<String>,
}

impl NamespaceEntry {
    /// Whether its name and secrets' names are ones a namespace can have.
    pub(crate) fn check(&self, name: &str) -> Result<(), String> {
        check_namespace_name(name)?;
        for secret in &self.secrets {
            taskhost_runtime::check_secret_name(secret).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// The longest namespace name.
pub const MAX_NAMESPACE_NAME: usize = 63;

/// Whether `name` is a namespace's name: 1 to 63 lowercase letters, digits
/// and dashes, starting with a letter or a digit.
pub fn check_namespace_name(name: &str) -> Result<(), String> {
    let fine = !name.is_empty()
        && name.len() <= MAX_NAMESPACE_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-');
    if fine {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a namespace name: 1 to {MAX_NAMESPACE_NAME} lowercase letters, \
             digits and dashes, starting with a letter or a digit"
        ))
    }
}

/// A size such as `"64MiB"`.
pub(super) fn size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let text = String::deserialize(d)?;
    parse_size(&text).map(Some).map_err(refuse)
}

/// A size held in a `usize` (the most it holds, if it is larger).
pub(super) fn size_usize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    Ok(size(d)?.map(|bytes| usize::try_from(bytes).unwrap_or(usize::MAX)))
}

/// The listener's address (`http`).
pub(super) fn address<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<std::net::SocketAddr>, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map(Some).map_err(|e| {
        refuse(format_args!(
            "`{text}` is not an address like 127.0.0.1:9100: {e}"
        ))
    })
}

/// `allow_http`: `--allow-http` grants.
pub(super) fn allow_http<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<HttpAllow>>, D::Error> {
    each(d, |text| HttpAllow::parse(&text).map_err(|e| e.to_string()))
}

/// `allow_dirs`: directories, each `PATH` or `PATH:ro`.
pub(super) fn allow_dirs<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<DirAllow>>, D::Error> {
    each(d, |text| DirAllow::parse(&text))
}

/// `allow_env`: names, or prefixes ending in `*`.
pub(super) fn allow_env<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    each(d, |text| super::check_env_pattern(&text).map(|()| text))
}

/// `http_allow_hosts`: host names, each with an optional port.
pub(super) fn allow_hosts<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<String>>, D::Error> {
    each(d, |text| super::check_allow_host(&text).map(|()| text))
}

/// `allow_kv`: shared buckets' names.
pub(super) fn buckets<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    each(d, |text| {
        taskhost_runtime::kv::check_bucket_name(&text).map(|()| text)
    })
}

/// `secrets.env`: secrets' names.
pub(super) fn secret_names<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<String>>, D::Error> {
    each(d, |text| {
        taskhost_runtime::check_secret_name(&text)
            .map(|()| text)
            .map_err(|e| e.to_string())
    })
}

/// `config_vars`: a table of strings, in the order of its keys.
pub(super) fn table<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<(String, String)>>, D::Error> {
    Ok(Some(
        BTreeMap::<String, String>::deserialize(d)?
            .into_iter()
            .collect(),
    ))
}
