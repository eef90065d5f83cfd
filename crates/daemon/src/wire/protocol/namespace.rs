//! The messages of namespaces: which namespace a connection acts in
//! ([`Enter`]), and `host ns`: each namespace's weight and quotas, with
//! what it uses of them.

use serde::{Deserialize, Serialize};

/// The name of the namespace that holds everything nobody put elsewhere.
pub const DEFAULT_NAMESPACE: &str = "default";

pub use crate::config::{MAX_NAMESPACE_NAME, check_namespace_name as check_name};

/// Which namespace a connection acts in from now on (`--namespace`,
/// `--all-namespaces`); answered with [`Reply::Done`](super::Reply::Done).
/// A token of one namespace may enter only its own; any other answers as
/// an unknown one does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enter {
    /// The namespace; `None`: the default one.
    pub namespace: Option<String>,
    /// See every namespace's tasks, slots and events (an operator's);
    /// what it submits goes to `namespace`.
    pub all: bool,
}

/// A namespace's quota (`host ns add|set --max-…`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Quota {
    /// Attempts running at once, holding a run permit (more wait for one);
    /// one host's.
    Running,
    /// Tasks accepted and not yet running (queued, delayed, waiting for a
    /// permit or a retry): a submission over it is refused.
    Waiting,
    /// Schedules.
    Schedules,
    /// Bytes in its guests' key-value buckets (slots' and shared): a write
    /// over it is refused to the guest.
    KvBytes,
    /// Submissions per second (a burst of one second's worth).
    SubmitRate,
    /// The memory limit of one attempt, bytes (its memory ceiling).
    Memory,
    /// Unfinished descendants of one spawn tree's root.
    Descendants,
}

impl Quota {
    /// Every quota, in the order `host ns ls` shows them.
    pub const ALL: [Quota; 7] = [
        Quota::Running,
        Quota::Waiting,
        Quota::Schedules,
        Quota::KvBytes,
        Quota::SubmitRate,
        Quota::Memory,
        Quota::Descendants,
    ];

    /// Every quota's key, in the order of [`Quota::ALL`].
    pub const KEYS: [&'static str; 7] = [
        "max-running",
        "max-waiting",
        "max-schedules",
        "max-kv-bytes",
        "max-submit-rate",
        "memory-ceiling",
        "max-descendants",
    ];

    /// Its name: the TOML key and, after `--`, the flag.
    pub fn key(self) -> &'static str {
        match self {
            Quota::Running => "max-running",
            Quota::Waiting => "max-waiting",
            Quota::Schedules => "max-schedules",
            Quota::KvBytes => "max-kv-bytes",
            Quota::SubmitRate => "max-submit-rate",
            Quota::Memory => "memory-ceiling",
            Quota::Descendants => "max-descendants",
        }
    }

    /// The quota a key names.
    pub fn parse(key: &str) -> Option<Quota> {
        Self::ALL
            .into_iter()
            .find(|q| q.key() == key || q.key().replace('-', "_") == key)
    }

    /// Whether its values are bytes (shown and parsed as sizes).
    pub fn is_bytes(self) -> bool {
        matches!(self, Quota::KvBytes | Quota::Memory)
    }
}

/// A namespace's weight and quotas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceSettings {
    /// Its share of the run permits when they are the bottleneck, against
    /// the others' weights (at least 1).
    pub weight: u32,
    /// Its quotas, each at most once; a quota not here is unlimited.
    pub quotas: Vec<(Quota, u64)>,
    /// The daemon's secrets its tasks may name (`--secret`), by name; the
    /// default namespace may name every one.
    #[serde(default)]
    pub secrets: Vec<String>,
}

impl Default for NamespaceSettings {
    fn default() -> Self {
        Self {
            weight: 1,
            quotas: Vec::new(),
            secrets: Vec::new(),
        }
    }
}

impl NamespaceSettings {
    /// The limit of `quota`, if it has one.
    pub fn limit(&self, quota: Quota) -> Option<u64> {
        self.quotas
            .iter()
            .find(|(q, _)| *q == quota)
            .map(|(_, limit)| *limit)
    }

    /// Applies a change: a weight, quotas set or made unlimited.
    pub fn apply(&mut self, change: &NamespaceChange) {
        if let Some(weight) = change.weight {
            self.weight = weight.max(1);
        }
        for (quota, limit) in &change.quotas {
            self.quotas.retain(|(q, _)| q != quota);
            if let Some(limit) = limit {
                self.quotas.push((*quota, *limit));
            }
        }
        self.quotas.sort();
        self.secrets.retain(|s| !change.deny_secrets.contains(s));
        for secret in &change.allow_secrets {
            if !self.secrets.contains(secret) {
                self.secrets.push(secret.clone());
            }
        }
        self.secrets.sort();
    }
}

/// What `host ns add|set` changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceChange {
    /// A new weight.
    pub weight: Option<u32>,
    /// Quotas to set (`Some`) or to make unlimited (`None`).
    pub quotas: Vec<(Quota, Option<u64>)>,
    /// The daemon's secrets its tasks may now name.
    pub allow_secrets: Vec<String>,
    /// The daemon's secrets its tasks may no longer name.
    pub deny_secrets: Vec<String>,
}

impl NamespaceChange {
    /// Refuses secret names that are not names.
    pub fn check(&self) -> Result<(), String> {
        for name in self.allow_secrets.iter().chain(&self.deny_secrets) {
            taskhost_runtime::check_secret_name(name).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// A verb of `host ns`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NamespaceVerb {
    /// Every namespace the connection may see, with its use: pages of
    /// [`Reply::Namespaces`](super::Reply::Namespaces), then
    /// [`Reply::End`](super::Reply::End).
    List,
    /// Add a namespace; answered with [`Reply::Namespace`](super::Reply::Namespace).
    Add(String, NamespaceChange),
    /// Change a namespace's weight or quotas; answered as `Add`.
    Set(String, NamespaceChange),
    /// Remove a namespace that holds no unfinished task and no schedule;
    /// answered with the namespace as it was.
    Remove(String),
}

/// One namespace as `host ns ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceRow {
    /// Its name ([`DEFAULT_NAMESPACE`] for the default one).
    pub name: String,
    /// Its weight and quotas.
    pub settings: NamespaceSettings,
    /// What it uses now of each quota that can be counted, in
    /// [`Quota::ALL`]'s order.
    pub usage: Vec<(Quota, u64)>,
}

impl From<crate::config::NamespaceEntry> for NamespaceSettings {
    fn from(entry: crate::config::NamespaceEntry) -> Self {
        let mut quotas: Vec<(Quota, u64)> = [
            (Quota::Running, entry.max_running),
            (Quota::Waiting, entry.max_waiting),
            (Quota::Schedules, entry.max_schedules),
            (Quota::SubmitRate, entry.max_submit_rate),
            (Quota::Descendants, entry.max_descendants),
            (Quota::KvBytes, entry.max_kv_bytes),
            (Quota::Memory, entry.memory_ceiling),
        ]
        .into_iter()
        .filter_map(|(q, limit)| limit.map(|l| (q, l)))
        .collect();
        quotas.sort();
        let mut secrets = entry.secrets;
        secrets.sort();
        secrets.dedup();
        Self {
            weight: entry.weight.unwrap_or(1).max(1),
            quotas,
            secrets,
        }
    }
}

#[cfg(test)]
mod keys_tests {
    use super::Quota;

    #[test]
    fn the_keys_are_every_quotas_key_in_order() {
        let keys: Vec<&str> = Quota::ALL.iter().map(|q| q.key()).collect();
        assert_eq!(keys, Quota::KEYS);
    }
}
