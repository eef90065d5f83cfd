//! A submission (`Submit`, and what a schedule's firing or a rerun
//! submits): its request, when a delayed one may start, its checks, the
//! decoding of a request a store kept under an older protocol, and its
//! answer.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use taskhost_core::admission::AdmissionPolicy;
use taskhost_core::lifecycle::Placement;
use taskhost_core::supervisor::{BackoffPolicy, RestartPolicy, TaskId};
use taskhost_runtime::{Digest, DirGrant, HttpAllow, SecretRef};

use super::MAX_WIRE_DURATION;

/// A submission as sent by `host submit`. Unset fields take the plugin's or
/// the daemon's defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitRequest {
    /// The plugin's digest (uploaded before, or already known).
    pub plugin: Digest,
    /// Task name [default: `<plugin>-<id>`].
    pub name: Option<String>,
    /// Explicit slot [default: the plugin's resource filled from the params,
    /// else the task name].
    pub slot: Option<String>,
    /// Policy for a busy slot [default: the plugin's].
    pub policy: Option<AdmissionPolicy>,
    /// Params, in order.
    pub params: Vec<(String, String)>,
    /// Input bytes (at most [`MAX_SUBMIT_INPUT`](super::MAX_SUBMIT_INPUT)).
    #[serde(with = "serde_bytes")]
    pub input: Vec<u8>,
    /// Restart policy [default: never].
    pub restart: Option<RestartPolicy>,
    /// Retry budget [default: unlimited].
    pub max_retries: Option<u32>,
    /// Backoff between failed attempts [default: the supervisor's].
    pub backoff: Option<BackoffPolicy>,
    /// Per-attempt timeout; zero is none [default: none].
    pub timeout: Option<Duration>,
    /// Memory limit per linear memory, bytes [default: the daemon's].
    pub max_memory: Option<u64>,
    /// Directory grants, host paths absolute.
    pub dirs: Vec<DirGrant>,
    /// Environment grants.
    pub env: Vec<(String, String)>,
    /// Where the task's outbound HTTP requests may go (`--allow-http`);
    /// each must be within the daemon's own `allow_http`.
    pub allow_http: Vec<HttpAllow>,
    /// The client's idempotency key (`--idempotency-key`): the same key
    /// with the same request gives the task it first made, for the
    /// daemon's `idempotency_retention`.
    pub idempotency_key: Option<String>,
    /// Hold the task until then (`--delay`, `--at`): accepted at once,
    /// placed in its slot no earlier. The daemon keeps it as
    /// [`NotBefore::At`].
    pub not_before: Option<NotBefore>,
    /// Among attempts waiting for the concurrency limit, higher goes
    /// first (`--priority`) [default: 0].
    pub priority: i32,
    /// The schedule that fired it: set by the daemon, never by a client.
    /// New fields go last, each one a single zero byte when unset, so that
    /// requests stored before them still decode
    /// ([`SubmitRequest::decode_stored`]).
    pub schedule: Option<String>,
    /// Environment variables whose values are the daemon's secrets, by
    /// name (`--secret`, `--env-secret`): only the names are sent and
    /// kept; each attempt looks the values up when it starts.
    pub secrets: Vec<SecretRef>,
    /// What `wasi:config/store` answers the guest (`--config-var`), over
    /// the daemon's own `config_vars`.
    pub config: Vec<(String, String)>,
    /// Shared `wasi:keyvalue` buckets the guest may open besides its
    /// slot's (`--kv`); each must be in the daemon's `allow_kv`.
    pub kv: Vec<String>,
    /// The task that spawned this one (`taskhost:plugin/children`): set
    /// by the daemon, never by a client.
    pub parent: Option<u64>,
    /// The root of the tree of a spawned task (its parent's root, or its
    /// parent if that one has none): set by the daemon, never by a client.
    pub root: Option<u64>,
    /// How deep a spawned task is in its tree (a submitted task's children
    /// are at 1; 0 for a task nobody spawned): set by the daemon.
    pub depth: u32,
    /// The namespace it belongs to (`None`: the default one): set by the
    /// daemon from the connection, never by a client.
    pub namespace: Option<String>,
    /// A WASI command's arguments after its name (`--arg`, `-- ARGS`), in
    /// order; a task plugin takes none.
    pub args: Vec<String>,
    /// A named deployment to run instead of `plugin` (`host submit NAME`,
    /// `NAME@VERSION`, `NAME@sha256:…`): the daemon sets `plugin` to its
    /// digest at intake and this to `NAME@VERSION`, so the task keeps that
    /// version whatever is deployed later; a schedule's stays as given,
    /// so each firing takes the name's version of then.
    pub deployment: Option<String>,
    /// Keep no record of its attempts (`--no-record`), whatever the
    /// daemon's `record_budget`.
    pub no_record: bool,
}

/// When a delayed submission may enter its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NotBefore {
    /// This long after the daemon accepts it.
    After(Duration),
    /// At this time, ms since the Unix epoch.
    At(u64),
}

impl NotBefore {
    /// The time, ms since the Unix epoch, for a request accepted at
    /// `now_ms`.
    pub fn at(self, now_ms: u64) -> u64 {
        match self {
            Self::After(d) => now_ms.saturating_add(d.as_millis() as u64),
            Self::At(at) => at,
        }
    }
}

/// Fields added to [`SubmitRequest`] since protocol 4 (`allow_http`,
/// `idempotency_key`, `not_before`, `priority`, `schedule`, `secrets`,
/// `config`, `kv`, `parent`, `root`, `depth`, `namespace`, `args`,
/// `deployment`, `no_record`).
const ADDED_FIELDS: usize = 15;

/// Most arguments a WASI command's submission carries.
pub const MAX_ARGS: usize = 4096;
/// Most bytes of all a submission's command arguments together.
pub const MAX_ARGS_BYTES: usize = 256 << 10;

/// The longest idempotency key taken, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 256;

impl SubmitRequest {
    /// Decodes a request a store kept (postcard). Fields were only ever
    /// added at the end, each of which encodes unset as one zero byte (an
    /// empty list, `None`, 0): a request stored before some of them decodes
    /// with those zero bytes added, which gives exactly the values an
    /// older daemon meant (no `allow_http` for protocols 4 and 5, no
    /// idempotency key before 7, no delay, priority or schedule before 8, no
    /// secrets before 9, no config values before 10, no shared buckets
    /// before 11, no parent before 12, no root or depth before 13, no
    /// namespace before 17, no command arguments before 20, no deployment
    /// before 21, recorded before 23).
    pub fn decode_stored(bytes: &[u8]) -> Result<Self, postcard::Error> {
        decode_padded(bytes)
    }

    /// A submission of this plugin with every default.
    pub fn new(plugin: Digest) -> Self {
        Self {
            plugin,
            name: None,
            slot: None,
            policy: None,
            params: Vec::new(),
            input: Vec::new(),
            restart: None,
            max_retries: None,
            backoff: None,
            timeout: None,
            max_memory: None,
            dirs: Vec::new(),
            env: Vec::new(),
            allow_http: Vec::new(),
            idempotency_key: None,
            not_before: None,
            priority: 0,
            schedule: None,
            secrets: Vec::new(),
            config: Vec::new(),
            kv: Vec::new(),
            parent: None,
            root: None,
            depth: 0,
            namespace: None,
            args: Vec::new(),
            deployment: None,
            no_record: false,
        }
    }

    /// What an idempotency key is compared by: the SHA-256 of the request
    /// as the client sent it, the key left out.
    pub fn fingerprint(&self) -> [u8; 32] {
        use sha2::Digest as _;
        let mut plain = self.clone();
        plain.idempotency_key = None;
        let bytes = postcard::to_allocvec(&plain).unwrap_or_default();
        sha2::Sha256::digest(&bytes).into()
    }
}

/// Decodes a stored value whose last part is a [`SubmitRequest`] (see
/// [`SubmitRequest::decode_stored`]): as it is, else with the zero bytes of
/// the fields added since it was stored.
pub(super) fn decode_padded<T: for<'de> Deserialize<'de>>(
    bytes: &[u8],
) -> Result<T, postcard::Error> {
    let current = postcard::from_bytes::<T>(bytes);
    if current.is_ok() {
        return current;
    }
    let mut padded = bytes.to_vec();
    for added in 1..=ADDED_FIELDS {
        padded.resize(bytes.len() + added, 0);
        if let Ok(old) = postcard::from_bytes::<T>(&padded) {
            return Ok(old);
        }
    }
    current
}

/// A duration within [`MAX_WIRE_DURATION`].
pub(super) fn duration(what: &str, d: Option<Duration>) -> Result<(), String> {
    match d {
        Some(d) if d > MAX_WIRE_DURATION => Err(format!(
            "{what} {d:?} is out of range: at most {} days",
            MAX_WIRE_DURATION.as_secs() / 86_400
        )),
        _ => Ok(()),
    }
}

/// Checks the durations and sizes of a submission (see [`Request::check`](super::Request::check)).
pub(super) fn check_submit(submit: &SubmitRequest) -> Result<(), String> {
    duration("the timeout", submit.timeout)?;
    match submit.not_before {
        Some(NotBefore::After(d)) => duration("the delay (--delay)", Some(d))?,
        Some(NotBefore::At(at)) => {
            let latest =
                crate::schedule::now_ms().saturating_add(MAX_WIRE_DURATION.as_millis() as u64);
            if at > latest {
                return Err(format!(
                    "--at {} is out of range: at most {} days from now",
                    crate::schedule::format_ms(at),
                    MAX_WIRE_DURATION.as_secs() / 86_400
                ));
            }
        }
        None => {}
    }
    if let Some(key) = &submit.idempotency_key
        && (key.is_empty()
            || key.chars().count() > MAX_IDEMPOTENCY_KEY
            || key.chars().any(char::is_control))
    {
        return Err(format!(
            "the idempotency key must be 1 to {MAX_IDEMPOTENCY_KEY} characters of printable text"
        ));
    }
    let arg_bytes: usize = submit.args.iter().map(String::len).sum();
    if submit.args.len() > MAX_ARGS || arg_bytes > MAX_ARGS_BYTES {
        return Err(format!(
            "the command's arguments are {} ({arg_bytes} bytes); a submission carries at most \
             {MAX_ARGS} arguments of {MAX_ARGS_BYTES} bytes together (give a larger list as \
             the input, or in a granted directory)",
            submit.args.len()
        ));
    }
    if let Some(RestartPolicy::Always { interval }) = submit.restart {
        duration("the interval (--every)", Some(interval))?;
    }
    duration(
        "the backoff",
        submit.backoff.as_ref().map(BackoffPolicy::max),
    )?;
    if let Some(bytes) = submit.max_memory
        && bytes < 64 << 10
    {
        return Err(format!(
            "the memory limit {bytes} bytes is out of range: at least 64KiB (one WebAssembly \
             page)"
        ));
    }
    Ok(())
}

/// The answer to a submission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submitted {
    /// Its id.
    pub id: TaskId,
    /// Its name.
    pub name: String,
    /// Its slot.
    pub slot: String,
    /// Where it went.
    pub placement: Placement,
    /// Made before: its idempotency key was given with the same request
    /// (`placement` is then what it was first).
    pub existing: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_requests_of_older_protocols_still_decode() {
        let mut request = SubmitRequest::new(Digest::of(b"plugin"));
        request.name = Some("nap".into());
        request.env = vec![("K".into(), "V".into())];
        request.timeout = Some(Duration::from_secs(3));
        request.allow_http = vec!["http://127.0.0.1:8080".parse().unwrap()];
        request.idempotency_key = Some("k-1".into());
        // Protocol 7 ended with the idempotency key: no delay, priority or
        // schedule (three zero bytes now).
        let mut v7 = postcard::to_allocvec(&request).unwrap();
        for _ in 0..3 {
            assert_eq!(v7.pop(), Some(0));
        }
        assert_eq!(SubmitRequest::decode_stored(&v7).unwrap(), request);
        // Protocol 6 had no idempotency key; 4 and 5 no `allow_http`.
        request.idempotency_key = None;
        let mut v6 = postcard::to_allocvec(&request).unwrap();
        v6.truncate(v6.len() - 4);
        assert_eq!(SubmitRequest::decode_stored(&v6).unwrap(), request);
        request.allow_http.clear();
        let mut v5 = postcard::to_allocvec(&request).unwrap();
        v5.truncate(v5.len() - 5);
        assert_eq!(SubmitRequest::decode_stored(&v5).unwrap(), request);
        request.not_before = Some(NotBefore::At(1_800_000_000_000));
        request.priority = -3;
        request.schedule = Some("nightly".into());
        let new = postcard::to_allocvec(&request).unwrap();
        assert_eq!(SubmitRequest::decode_stored(&new).unwrap(), request);
        assert!(SubmitRequest::decode_stored(&new[..10]).is_err());
    }
}
