//! Owns child tasks as a guest reaches them through `taskhost:plugin/children`
//! (since 0.1.1): what a spawn asks for ([`ChildSpec`]), what its parent
//! brings ([`Parent`]: its id, name, plugin and grants, the ceiling of every
//! child), how an outcome comes back ([`ChildOutcome`]), and how a parent
//! waits: the wait (a host function, in `host_calls`) returns at once when
//! the parent is asked to stop, and parks the parent meanwhile
//! ([`Parking`]: its concurrency permit goes back, so that its children can
//! run under any limit). Submitting and
//! waiting is the embedder's ([`ChildTasks`]), and so is the permit: this
//! module knows no controller and no supervisor.

#![forbid(unsafe_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::bindings::taskhost::plugin::children;
use crate::digest::Digest;
use crate::facts::AttemptFacts;
use crate::sandbox::Sandbox;

/// The longest child key taken.
pub const MAX_CHILD_KEY: usize = 128;

/// A child a guest asks to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildSpec {
    /// Its key among its parent's children.
    pub key: String,
    /// Its plugin (`None`: the parent's, or the deployment's).
    pub plugin: Option<Digest>,
    /// A deployment, `NAME[@VERSION|@sha256:HEX]`, the daemon resolves to
    /// its plugin at intake.
    pub deployment: Option<String>,
    /// Its name (`None`: `<parent>.<key>`).
    pub name: Option<String>,
    /// Its slot (`None`: its plugin's resource, else its name).
    pub slot: Option<String>,
    /// Its params.
    pub params: Vec<(String, String)>,
    /// Its input.
    pub input: Vec<u8>,
}

/// The task whose attempt spawns: a child's grants are exactly these.
#[derive(Debug, Clone)]
pub struct Parent {
    /// Its id.
    pub task: u64,
    /// Its name.
    pub name: String,
    /// Its plugin.
    pub plugin: Digest,
    /// Its grants.
    pub sandbox: Arc<Sandbox>,
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildStatus {
    /// It completed.
    Completed,
    /// It failed (after its retries).
    Failed,
    /// It failed in a way retrying cannot fix.
    Fatal,
    /// It was canceled.
    Canceled,
    /// It was stopped by force.
    ForceAborted,
    /// It was never run.
    Rejected,
    /// The host lost it.
    Panicked,
}

/// A child's outcome, as its parent reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildOutcome {
    /// How it ended.
    pub status: ChildStatus,
    /// Its output when it completed.
    pub output: Vec<u8>,
    /// Why it did not complete.
    pub reason: String,
}

/// Why a wait has no outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitError {
    /// The id is not a child of this parent.
    UnknownChild,
}

/// A future of [`ChildTasks`].
pub type ChildFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Where children are submitted and waited for.
pub trait ChildTasks: Send + Sync + 'static {
    /// Starts a child of `parent` (or finds the one its key started) and
    /// gives its id, or why not (for the guest).
    fn spawn(&self, parent: &Parent, spec: ChildSpec) -> ChildFuture<Result<u64, String>>;
    /// Waits for `child`'s outcome, if it is a child of `parent`.
    fn wait(&self, parent: u64, child: u64) -> ChildFuture<Result<ChildOutcome, WaitError>>;
}

/// How an attempt gives its share of the host's concurrency back while its
/// guest waits for a child, and takes it again: the embedder's supervisor
/// holds it (`PluginTask` wires it to the supervisor's
/// `AttemptContext::park`).
pub trait Parking: Send + Sync {
    /// Gives the attempt's permit back; true if it held one.
    fn park(&self) -> bool;
    /// Takes a permit again after [`Parking::park`]; returns early, without
    /// one, once the attempt is asked to stop.
    fn unpark(&self) -> ChildFuture<()>;
}

/// Where child tasks go, shown by name only.
#[derive(Clone)]
pub(crate) struct ChildHandle(pub(crate) Arc<dyn ChildTasks>);

impl std::fmt::Debug for ChildHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChildTasks")
    }
}

/// What one attempt's guest may do with children: shares the attempt's
/// facts and grants; the [`Parent`] is made at a spawn.
#[derive(Clone)]
pub(crate) struct ChildAccess {
    pub(crate) backend: Arc<dyn ChildTasks>,
    /// Parks the attempt while it waits (none: it keeps its permit).
    pub(crate) parking: Option<Arc<dyn Parking>>,
    pub(crate) facts: Arc<AttemptFacts>,
    pub(crate) plugin: Digest,
    pub(crate) sandbox: Arc<Sandbox>,
}

impl ChildAccess {
    /// The spawning task, as its children's ceiling.
    pub(crate) fn parent(&self) -> Parent {
        Parent {
            task: self.facts.task_id,
            name: self.facts.name.clone(),
            plugin: self.plugin,
            sandbox: Arc::clone(&self.sandbox),
        }
    }
}

/// Checks a key: letters, digits, `-`, `_`, `.`, at most [`MAX_CHILD_KEY`].
pub fn check_key(key: &str) -> Result<(), String> {
    let fine = !key.is_empty()
        && key.len() <= MAX_CHILD_KEY
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if fine {
        Ok(())
    } else {
        Err(format!(
            "invalid child key `{key}`: use up to {MAX_CHILD_KEY} letters, digits, `-`, `_` or `.`"
        ))
    }
}

/// Turns the guest's spec into ours, or says what is wrong.
pub(crate) fn spec(spec: children::ChildSpec) -> Result<ChildSpec, String> {
    check_key(&spec.key)?;
    // A digest names a stored plugin; any other text a deployment, which
    // the daemon checks as it resolves it.
    let (plugin, deployment) = match spec.plugin {
        None => (None, None),
        Some(text) => match text.parse::<Digest>() {
            Ok(digest) => (Some(digest), None),
            Err(_) => (None, Some(text)),
        },
    };
    Ok(ChildSpec {
        key: spec.key,
        plugin,
        deployment,
        name: spec.name,
        slot: spec.slot,
        params: spec.params,
        input: spec.input,
    })
}

/// Our outcome as the guest's.
pub(crate) fn outcome(outcome: ChildOutcome) -> children::ChildOutcome {
    use children::ChildStatus as S;
    children::ChildOutcome {
        status: match outcome.status {
            ChildStatus::Completed => S::Completed,
            ChildStatus::Failed => S::Failed,
            ChildStatus::Fatal => S::Fatal,
            ChildStatus::Canceled => S::Canceled,
            ChildStatus::ForceAborted => S::ForceAborted,
            ChildStatus::Rejected => S::Rejected,
            ChildStatus::Panicked => S::Panicked,
        },
        output: outcome.output,
        reason: outcome.reason,
    }
}
