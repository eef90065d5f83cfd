//! Owns named deployments on one host: each name's versions (a version is
//! one digest, for good), which version is current, and the history of
//! deploys, rollbacks and removals that says so; what `host deploy`,
//! `host deployments` and `host rollback` change and read, and how a
//! submission's `NAME`, `NAME@VERSION` or `NAME@sha256:…` becomes a digest.
//! The state is the list of events: the store keeps each one before it is
//! answered and gives them back at start. **Must not** load plugins or
//! look at tasks: the backend checks what uses a version.

use std::collections::BTreeMap;

use taskhost_runtime::Digest;

use crate::service::error::ServiceError;
use crate::wire::protocol::{DeploymentEvent, DeploymentRow, EventWhat};
pub use crate::wire::protocol::{Pick, Reference};

/// Every name's events, in the order they happened.
#[derive(Debug, Default, Clone)]
pub struct Deployments {
    by_name: BTreeMap<String, Vec<DeploymentEvent>>,
}

/// What one name's events come to.
struct Replayed<'a> {
    /// Each version kept, with its digest.
    versions: BTreeMap<&'a str, Digest>,
    /// The current version, if any.
    current: Option<&'a DeploymentEvent>,
    /// The versions current in turn, oldest first (a version once per
    /// time it became current).
    currents: Vec<&'a DeploymentEvent>,
}

fn replay(events: &[DeploymentEvent]) -> Replayed<'_> {
    let mut versions = BTreeMap::new();
    let mut current = None;
    let mut currents = Vec::new();
    for event in events {
        match event.what {
            EventWhat::Deploy | EventWhat::Rollback => {
                versions.insert(event.version.as_str(), event.digest);
                current = Some(event);
                currents.push(event);
            }
            EventWhat::Remove => {
                versions.remove(event.version.as_str());
            }
        }
    }
    Replayed {
        versions,
        current,
        currents,
    }
}

fn unknown(name: &str) -> ServiceError {
    ServiceError::NotFound(format!(
        "no deployment named `{name}`; deploy one with `host deploy PLUGIN.wasm --name {name}`"
    ))
}

impl Deployments {
    /// The state the store's events (oldest first) make.
    pub fn from_events(events: Vec<DeploymentEvent>) -> Self {
        let mut deployments = Self::default();
        for event in events {
            deployments.apply(event);
        }
        deployments
    }

    /// Adds an event the store has kept.
    pub fn apply(&mut self, event: DeploymentEvent) {
        self.by_name
            .entry(event.name.clone())
            .or_default()
            .push(event);
    }

    fn events(&self, name: &str) -> Result<&[DeploymentEvent], ServiceError> {
        self.by_name
            .get(name)
            .map(Vec::as_slice)
            .filter(|e| !e.is_empty())
            .ok_or_else(|| unknown(name))
    }

    /// The version and digest `pick` names of deployment `name`.
    pub fn resolve(&self, name: &str, pick: &Pick) -> Result<(String, Digest), ServiceError> {
        let events = self.events(name)?;
        let replayed = replay(events);
        match pick {
            Pick::Current => replayed
                .current
                .map(|e| (e.version.clone(), e.digest))
                .ok_or_else(|| unknown(name)),
            Pick::Version(version) => replayed
                .versions
                .get(version.as_str())
                .map(|d| (version.clone(), *d))
                .ok_or_else(|| {
                    ServiceError::NotFound(format!(
                        "deployment `{name}` has no version {version}; its versions: {}",
                        replayed
                            .versions
                            .keys()
                            .copied()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                }),
            Pick::Digest(digest) => replayed
                .versions
                .iter()
                .find(|(_, d)| *d == digest)
                .map(|(v, d)| ((*v).to_owned(), *d))
                .ok_or_else(|| {
                    ServiceError::NotFound(format!(
                        "deployment `{name}` has no version with {digest}"
                    ))
                }),
        }
    }

    /// The event that deploys `digest` as `name@version` and makes it
    /// current, or `None` when it is current already. A version keeps its
    /// digest for good: the same version with other bytes is refused.
    pub fn deploy(
        &self,
        name: &str,
        version: &str,
        digest: Digest,
        at_ms: u64,
    ) -> Result<Option<DeploymentEvent>, ServiceError> {
        let events = self.by_name.get(name).map(Vec::as_slice).unwrap_or(&[]);
        let replayed = replay(events);
        if let Some(kept) = replayed.versions.get(version)
            && *kept != digest
        {
            return Err(ServiceError::Conflict(format!(
                "`{name}@{version}` is deployed with {kept}; a version's bytes never change: \
                 give this build a new version (`host deploy … --version V`)"
            )));
        }
        if replayed
            .current
            .is_some_and(|c| c.version == version && c.digest == digest)
        {
            return Ok(None);
        }
        Ok(Some(DeploymentEvent {
            name: name.to_owned(),
            version: version.to_owned(),
            digest,
            at_ms,
            what: EventWhat::Deploy,
        }))
    }

    /// The event that makes an earlier version current again: `to`, or
    /// else the version that was current before the current one.
    pub fn rollback(
        &self,
        name: &str,
        to: Option<&str>,
        at_ms: u64,
    ) -> Result<DeploymentEvent, ServiceError> {
        let events = self.events(name)?;
        let replayed = replay(events);
        let current = replayed.current.map(|e| e.version.as_str());
        let target = match to {
            Some(version) => {
                if !replayed.versions.contains_key(version) {
                    return Err(self
                        .resolve(name, &Pick::Version(version.into()))
                        .unwrap_err());
                }
                if current == Some(version) {
                    return Err(ServiceError::Conflict(format!(
                        "`{name}@{version}` is the current version already"
                    )));
                }
                version.to_owned()
            }
            None => replayed
                .currents
                .iter()
                .rev()
                .map(|e| e.version.as_str())
                .find(|v| Some(*v) != current && replayed.versions.contains_key(v))
                .ok_or_else(|| {
                    ServiceError::Conflict(format!(
                        "deployment `{name}` has no earlier version to roll back to"
                    ))
                })?
                .to_owned(),
        };
        let digest = replayed.versions[target.as_str()];
        Ok(DeploymentEvent {
            name: name.to_owned(),
            version: target,
            digest,
            at_ms,
            what: EventWhat::Rollback,
        })
    }

    /// The event that removes `name@version`: never the current one.
    pub fn remove(
        &self,
        name: &str,
        version: &str,
        at_ms: u64,
    ) -> Result<DeploymentEvent, ServiceError> {
        let (version, digest) = self.resolve(name, &Pick::Version(version.to_owned()))?;
        let events = self.events(name)?;
        if replay(events).current.is_some_and(|c| c.version == version) {
            return Err(ServiceError::Conflict(format!(
                "`{name}@{version}` is the current version: deploy or roll back to another \
                 first"
            )));
        }
        Ok(DeploymentEvent {
            name: name.to_owned(),
            version,
            digest,
            at_ms,
            what: EventWhat::Remove,
        })
    }

    /// The digest of every version kept of the names `owned` accepts (a
    /// deployed version holds its plugin as a schedule does).
    pub fn digests(&self, owned: impl Fn(&str) -> bool) -> Vec<Digest> {
        self.by_name
            .iter()
            .filter(|(name, _)| owned(name))
            .flat_map(|(_, events)| replay(events).versions.into_values())
            .collect()
    }

    /// Each name's current version, by name.
    pub fn list(&self) -> Vec<DeploymentRow> {
        self.by_name
            .values()
            .filter_map(|events| {
                let replayed = replay(events);
                let current = replayed.current?;
                Some(DeploymentRow::of(current, replayed.versions.len()))
            })
            .collect()
    }

    /// One name's events, newest first.
    pub fn history(&self, name: &str) -> Result<Vec<DeploymentRow>, ServiceError> {
        let events = self.events(name)?;
        Ok(events
            .iter()
            .rev()
            .map(|e| DeploymentRow::of(e, 0))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(n: u8) -> Digest {
        Digest([n; 32])
    }

    #[test]
    fn references_read_a_name_a_version_or_a_digest() {
        assert_eq!(Reference::parse("resize").unwrap().pick, Pick::Current);
        assert_eq!(
            Reference::parse("resize@1.4.0").unwrap().pick,
            Pick::Version("1.4.0".into())
        );
        let hex = "ab".repeat(32);
        assert_eq!(
            Reference::parse(&format!("resize@sha256:{hex}"))
                .unwrap()
                .pick,
            Pick::Digest(Digest([0xab; 32]))
        );
        assert!(Reference::parse("./resize.wasm").is_err());
        assert!(Reference::parse("resize@").is_err());
        assert!(Reference::parse("resize@sha256:zz").is_err());
        assert!(Reference::parse("a/b").is_err());
    }

    #[test]
    fn deploys_roll_back_and_keep_each_versions_bytes() {
        let mut d = Deployments::default();
        let first = d.deploy("r", "1.0", digest(1), 1).unwrap().unwrap();
        d.apply(first);
        assert!(d.deploy("r", "1.0", digest(1), 2).unwrap().is_none());
        assert!(matches!(
            d.deploy("r", "1.0", digest(9), 2),
            Err(ServiceError::Conflict(_))
        ));
        let second = d.deploy("r", "1.1", digest(2), 3).unwrap().unwrap();
        d.apply(second);
        assert_eq!(
            d.resolve("r", &Pick::Current).unwrap(),
            ("1.1".into(), digest(2))
        );
        assert!(matches!(
            d.remove("r", "1.1", 4),
            Err(ServiceError::Conflict(_))
        ));
        let back = d.rollback("r", None, 4).unwrap();
        assert_eq!(back.version, "1.0");
        d.apply(back);
        assert_eq!(d.resolve("r", &Pick::Current).unwrap().0, "1.0");
        // Rolling back again goes to 1.1, the one current before.
        assert_eq!(d.rollback("r", None, 5).unwrap().version, "1.1");
        let removed = d.remove("r", "1.1", 5).unwrap();
        d.apply(removed);
        assert!(d.rollback("r", None, 6).is_err(), "nothing earlier is kept");
        assert!(d.resolve("r", &Pick::Version("1.1".into())).is_err());
        assert_eq!(d.resolve("r", &Pick::Digest(digest(1))).unwrap().0, "1.0");
        assert_eq!(d.history("r").unwrap().len(), 4);
        assert_eq!(d.list().len(), 1);
        assert!(matches!(
            d.resolve("other", &Pick::Current),
            Err(ServiceError::NotFound(_))
        ));
    }
}
