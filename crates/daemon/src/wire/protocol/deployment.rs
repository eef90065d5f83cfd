//! The messages of named deployments: `host deploy`, `host deployments ls
//! | history | rm` and `host rollback`, and the rows they answer with.

use serde::{Deserialize, Serialize};

use taskhost_runtime::Digest;

/// Longest deployment name or version, in bytes.
pub const MAX_NAME: usize = 128;

/// A deployment's name: 1 to 128 ASCII letters, digits, `-`, `_` or `.`,
/// not starting with `.` (so that it never reads as a path).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > MAX_NAME
        || name.starts_with('.')
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(format!(
            "`{}` is not a deployment name: 1 to {MAX_NAME} ASCII letters, digits, `-`, `_` \
             or `.`, not starting with `.`",
            name.escape_debug()
        ));
    }
    Ok(())
}

/// A version: 1 to 128 printable ASCII characters without spaces or `@`,
/// not starting with `sha256:`.
pub fn check_version(version: &str) -> Result<(), String> {
    if version.is_empty()
        || version.len() > MAX_NAME
        || version.starts_with("sha256:")
        || !version.bytes().all(|b| b.is_ascii_graphic() && b != b'@')
    {
        return Err(format!(
            "`{}` is not a version: 1 to {MAX_NAME} printable ASCII characters without spaces \
             or `@` (such as 1.4.0), not starting with sha256:",
            version.escape_debug()
        ));
    }
    Ok(())
}

/// Which version of a name a reference picks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pick {
    /// The current one.
    Current,
    /// This version.
    Version(String),
    /// The version with this digest.
    Digest(Digest),
}

/// A submission's plugin by name: `NAME`, `NAME@VERSION` or
/// `NAME@sha256:HEX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The name as given (its namespace's key is the backend's business).
    pub name: String,
    /// Which version.
    pub pick: Pick,
}

impl Reference {
    /// Reads `NAME[@VERSION|@sha256:HEX]`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (name, pick) = match text.split_once('@') {
            None => (text, Pick::Current),
            Some((name, at)) if at.starts_with("sha256:") => {
                let digest = at.parse::<Digest>().map_err(|e| {
                    format!("`{text}`: `{at}` is not a digest ({e}); give NAME@sha256:<64 hex>")
                })?;
                (name, Pick::Digest(digest))
            }
            Some((name, version)) => {
                check_version(version)?;
                (name, Pick::Version(version.to_owned()))
            }
        };
        check_name(name)?;
        Ok(Self {
            name: name.to_owned(),
            pick,
        })
    }
}

/// A deployment verb.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeploymentVerb {
    /// Makes the uploaded plugin `digest` the current version of `name`
    /// (else its declared name) as `version` (else its declared version).
    Deploy {
        /// The uploaded plugin.
        digest: Digest,
        /// The name [default: the plugin's declared name].
        name: Option<String>,
        /// The version [default: the plugin's declared version].
        version: Option<String>,
    },
    /// Each name's current version.
    List,
    /// One name's deploys, rollbacks and removals, newest first.
    History(String),
    /// Makes an earlier version current again: `to`, else the one current
    /// before.
    Rollback {
        /// The deployment.
        name: String,
        /// The version [default: the one current before].
        to: Option<String>,
    },
    /// Removes a version no task or schedule uses, never the current one.
    Remove {
        /// The deployment.
        name: String,
        /// The version.
        version: String,
    },
}

/// What happened to a deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventWhat {
    /// A version deployed and made current.
    Deploy,
    /// An earlier version made current again.
    Rollback,
    /// A version removed.
    Remove,
}

impl EventWhat {
    /// The word `host deployments history` shows.
    pub fn word(self) -> &'static str {
        match self {
            Self::Deploy => "deploy",
            Self::Rollback => "rollback",
            Self::Remove => "remove",
        }
    }
}

/// One event of a deployment, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentEvent {
    /// The name (its namespace's key).
    pub name: String,
    /// The version.
    pub version: String,
    /// The version's plugin.
    pub digest: Digest,
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
    /// What happened.
    pub what: EventWhat,
}

/// A row of `host deployments ls` (a name's current version) or `history`
/// (one event).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentRow {
    /// The name (as the namespace's key until the server shows it).
    pub name: String,
    /// The version.
    pub version: String,
    /// The version's plugin.
    pub digest: Digest,
    /// When it became current (ls) or happened (history), ms since the
    /// Unix epoch.
    pub at_ms: u64,
    /// What made it current (ls), or what happened (history).
    pub what: EventWhat,
    /// How many versions the name keeps (ls; 0 in a history).
    pub versions: usize,
}

impl DeploymentRow {
    /// The row of an event.
    pub fn of(event: &DeploymentEvent, versions: usize) -> Self {
        Self {
            name: event.name.clone(),
            version: event.version.clone(),
            digest: event.digest,
            at_ms: event.at_ms,
            what: event.what,
            versions,
        }
    }
}
