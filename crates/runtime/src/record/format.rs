//! Owns the record's format: what one attempt's record holds
//! ([`AttemptRecord`]: the attempt's world as it started, every answer
//! the host gave that could differ between two runs, in order, and how the
//! attempt ended) and the file that carries records ([`RecordFile`]: a
//! magic, a version, then postcard). Decoding trusts no length in the
//! input: it allocates only what the input really holds.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::digest::Digest;

/// The first bytes of a record file.
pub const MAGIC: &[u8; 8] = b"THRECORD";
/// The version of the format this host writes and reads.
pub const FORMAT_VERSION: u16 = 1;
/// The default of a record's byte budget (`--record-budget`): past it the
/// record stops taking calls and is marked truncated.
pub const DEFAULT_RECORD_BUDGET: usize = 1 << 20;

/// One attempt's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The world the attempt started in.
    pub start: RecordStart,
    /// The calls, each a postcard-encoded [`Call`], in order.
    #[serde(with = "serde_bytes")]
    pub calls: Vec<u8>,
    /// How many calls `calls` holds.
    pub call_count: u32,
    /// Whether the budget ran out: calls after `call_count` were not kept.
    pub truncated: bool,
    /// How the attempt ended.
    pub end: RecordEnd,
}

/// The world an attempt started in: everything the guest could read that
/// was fixed before it ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordStart {
    /// The component's digest.
    pub plugin: Digest,
    /// Where the component came from (a path or a deployed name), to find
    /// it again.
    pub source: String,
    /// Whether the component is a WASI command (else a task plugin).
    pub command: bool,
    /// The task's id.
    pub task_id: u64,
    /// The task's name.
    pub name: String,
    /// The task's slot.
    pub slot: String,
    /// The attempt's number, from 1.
    pub attempt: u32,
    /// The submission's params.
    pub params: Vec<(String, String)>,
    /// A command's arguments.
    pub args: Vec<String>,
    /// The input (empty when it was larger than the record's budget).
    #[serde(with = "serde_bytes")]
    pub input: Vec<u8>,
    /// Whether `input` is the input: false when it was larger than the
    /// record's budget, which then holds no call either.
    pub input_kept: bool,
    /// The environment variables that are not secrets.
    pub env: Vec<(String, String)>,
    /// The secrets, by name, with the digest of the value the attempt saw.
    pub secrets: Vec<RecordedSecret>,
    /// What `wasi:config/store` answered.
    pub config: Vec<(String, String)>,
    /// The shared key-value buckets granted.
    pub kv: Vec<String>,
    /// Whether the runtime had a key-value store.
    pub kv_store: bool,
    /// The guest paths of the directories granted (every file opened to
    /// read in them is a call, with its content; a replay gives the guest
    /// these, read-only, holding what it opened).
    pub dirs: Vec<String>,
    /// Whether outbound HTTP was granted: if so, every request is a call
    /// whose answer a replay gives (else every request was denied, and a
    /// replay denies it again).
    pub http: bool,
    /// The memory limit.
    pub max_memory: u64,
    /// The seed of the attempt's random numbers (secure and insecure, and
    /// `insecure-seed`): its random bytes are those this seed gives.
    pub seed: [u8; 32],
    /// When the attempt started, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
}

/// A secret as a record keeps it: its name and the digest of its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedSecret {
    /// The variable the guest read.
    pub var: String,
    /// The secret's name in its source.
    pub name: String,
    /// sha256 of the value.
    pub digest: [u8; 32],
}

/// How an attempt ended, and digests of what it said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordEnd {
    /// Its outcome.
    pub outcome: EndKind,
    /// The failure's reason, if any.
    pub reason: String,
    /// The [`fingerprint`] of the output (of nothing when it failed).
    pub output: u64,
    /// The fingerprint of the lines it printed and logged, in order, each
    /// with its stream.
    pub lines: u64,
    /// How many lines.
    pub line_count: u64,
    /// How long it ran, in milliseconds.
    pub duration_ms: u64,
}

/// An attempt's outcome as a record tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EndKind {
    /// It returned its output.
    Completed,
    /// It failed (retryable), by its own word or by a trap.
    Failed,
    /// It failed for good.
    Fatal,
    /// It stopped when asked.
    Canceled,
    /// It was stopped by force.
    Aborted,
}

impl std::fmt::Display for EndKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Fatal => "failed for good",
            Self::Canceled => "canceled",
            Self::Aborted => "aborted by force",
        })
    }
}

/// One host call: what the guest asked, and what the host answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    /// The question, which a replay must see again.
    pub ask: Ask,
    /// The answer it gets.
    pub answer: Answer,
}

/// What a guest asked of the host, in a form a replay compares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ask {
    /// `wasi:clocks/wall-clock.now`.
    WallNow,
    /// `wasi:clocks/wall-clock.resolution`.
    WallResolution,
    /// `wasi:clocks/monotonic-clock.now`.
    MonotonicNow,
    /// `wasi:clocks/monotonic-clock.resolution`.
    MonotonicResolution,
    /// `taskhost:plugin/host.is-cancelled`.
    IsCancelled,
    /// `taskhost:plugin/host.sleep`.
    Sleep {
        /// Milliseconds asked.
        ms: u64,
    },
    /// `taskhost:plugin/children.spawn`.
    Spawn {
        /// The child's key.
        key: String,
        /// The [`fingerprint`] of the whole spec.
        spec: u64,
    },
    /// `taskhost:plugin/children.wait`.
    Wait {
        /// The child's id.
        child: u64,
    },
    /// A key-value read.
    KvGet {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
    },
    /// A key-value write.
    KvWrite {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
        /// What is written: `set` with the value's sha256, `delete`, or
        /// `increment` by a delta.
        write: WriteAsk,
    },
    /// A page of a bucket's keys.
    KvKeys {
        /// The bucket.
        bucket: String,
        /// The cursor.
        cursor: u64,
    },
    /// `wasi:http/outgoing-handler.handle`: an outbound request.
    Http {
        /// The method.
        method: String,
        /// `scheme://authority/path?query` (a user or password before the
        /// host is left out of it and digested with the headers).
        uri: String,
        /// sha256 over the headers, in order (and the user or password).
        headers: [u8; 32],
        /// sha256 of the request body the host read (of nothing for a
        /// request that got no response: its body is not read again).
        body: [u8; 32],
    },
    /// `wasi:filesystem/types.[method]descriptor.open-at` of a file or
    /// directory to read, under a granted directory.
    Open {
        /// The granted directory, as the guest sees it.
        dir: String,
        /// The path in it, `/`-separated, without `.` or `..`.
        path: String,
    },
    /// `wasi:filesystem/types.[method]directory-entry-stream.read-directory-entry`
    /// of a directory under a granted directory.
    Entry {
        /// The granted directory, as the guest sees it.
        dir: String,
        /// The listed directory's path in it.
        path: String,
    },
}

/// A key-value write as a replay compares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WriteAsk {
    /// Set to a value with this [`fingerprint`].
    Set(u64),
    /// Remove.
    Delete,
    /// Add this.
    Increment(u64),
}

impl std::fmt::Display for Ask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::WallNow => f.write_str("wasi:clocks/wall-clock.now()"),
            Self::WallResolution => f.write_str("wasi:clocks/wall-clock.resolution()"),
            Self::MonotonicNow => f.write_str("wasi:clocks/monotonic-clock.now()"),
            Self::MonotonicResolution => f.write_str("wasi:clocks/monotonic-clock.resolution()"),
            Self::IsCancelled => f.write_str("taskhost:plugin/host.is-cancelled()"),
            Self::Sleep { ms } => write!(f, "taskhost:plugin/host.sleep(ms: {ms})"),
            Self::Spawn { key, .. } => {
                write!(f, "taskhost:plugin/children.spawn(key: {key:?})")
            }
            Self::Wait { child } => write!(f, "taskhost:plugin/children.wait(id: {child})"),
            Self::KvGet { bucket, key } => {
                write!(f, "wasi:keyvalue get(bucket: {bucket}, key: {key:?})")
            }
            Self::KvWrite { bucket, key, write } => match write {
                WriteAsk::Set(value) => write!(
                    f,
                    "wasi:keyvalue set(bucket: {bucket}, key: {key:?}, value fingerprint: \
                     {value:016x})"
                ),
                WriteAsk::Delete => {
                    write!(f, "wasi:keyvalue delete(bucket: {bucket}, key: {key:?})")
                }
                WriteAsk::Increment(by) => write!(
                    f,
                    "wasi:keyvalue increment(bucket: {bucket}, key: {key:?}, delta: {by})"
                ),
            },
            Self::KvKeys { bucket, cursor } => {
                write!(
                    f,
                    "wasi:keyvalue list-keys(bucket: {bucket}, cursor: {cursor})"
                )
            }
            Self::Http {
                method,
                uri,
                headers,
                body,
            } => write!(
                f,
                "wasi:http/outgoing-handler.handle({method} {uri}, headers sha256: {}, body \
                 sha256: {})",
                Digest(*headers).hex(),
                Digest(*body).hex()
            ),
            Self::Open { dir, path } => write!(
                f,
                "wasi:filesystem open-at(dir: {dir}, path: {path:?}, to read)"
            ),
            Self::Entry { dir, path } => write!(
                f,
                "wasi:filesystem read-directory-entry(dir: {dir}, path: {path:?})"
            ),
        }
    }
}

/// What the host answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    /// A wall-clock time or resolution: seconds and nanoseconds.
    Time(u64, u32),
    /// A monotonic time or resolution, in nanoseconds.
    Nanos(u64),
    /// A yes or no (`is-cancelled`).
    Flag(bool),
    /// A sleep: whether a stop cut it short.
    Slept {
        /// Cut short.
        cancelled: bool,
    },
    /// A spawn: the child's id, or why not.
    Spawned(Result<u64, String>),
    /// A wait: the child's end, or why not.
    Waited(Result<ChildEnd, WaitFailure>),
    /// A read's value, or the store's error.
    Value(#[serde(with = "maybe_bytes")] Result<Option<Vec<u8>>, String>),
    /// A write's result (an increment's number), or the store's error.
    Written(Result<Option<u64>, String>),
    /// A page of keys and the next cursor, or the store's error.
    Keys(Result<(Vec<String>, Option<u64>), String>),
    /// An outbound request's response, or its error: the text of its
    /// `wasi:http` error code, then, after a line break, the line the
    /// host logged when it denied or refused the request, if it did.
    Response(Result<RecordedResponse, String>),
    /// An open to read: the file's whole content as it was opened (none:
    /// a directory), or the filesystem error code's name.
    Opened(#[serde(with = "maybe_bytes")] Result<Option<Vec<u8>>, String>),
    /// A directory's next entry (its type, by its position in the WIT
    /// enum, and its name; none: the end), or the error code's name.
    Entry(Result<Option<(u8, String)>, String>),
}

/// An outbound request's response as the guest got it, whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedResponse {
    /// The status code.
    pub status: u16,
    /// The headers, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The whole body (up to `error`, if reading it failed).
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    /// The trailers, if any came.
    pub trailers: Option<Vec<(String, Vec<u8>)>>,
    /// The error that ended reading the body early, as its text.
    pub error: Option<String>,
}

/// A child's end as its parent saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildEnd {
    /// `child-status`, by its position in the WIT enum.
    pub status: u8,
    /// Its output.
    #[serde(with = "serde_bytes")]
    pub output: Vec<u8>,
    /// Its reason.
    pub reason: String,
}

/// Why a wait gave no end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitFailure {
    /// The parent was asked to stop.
    Cancelled,
    /// No such child of this parent.
    UnknownChild,
}

/// A value or a file's content, or an error, with its bytes written as
/// bytes: postcard writes them as it writes a sequence of `u8` (a length,
/// then the bytes), in one copy instead of one call per byte.
mod maybe_bytes {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_bytes::{ByteBuf, Bytes};

    pub(super) fn serialize<S: Serializer>(
        value: &Result<Option<Vec<u8>>, String>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        value
            .as_ref()
            .map(|bytes| bytes.as_deref().map(Bytes::new))
            .serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Result<Option<Vec<u8>>, String>, D::Error> {
        let value = Result::<Option<ByteBuf>, String>::deserialize(deserializer)?;
        Ok(value.map(|bytes| bytes.map(ByteBuf::into_vec)))
    }
}

impl AttemptRecord {
    /// The calls, decoded.
    pub fn decode_calls(&self) -> Result<Vec<Call>, RecordError> {
        let mut calls = Vec::new();
        let mut rest = &self.calls[..];
        while !rest.is_empty() {
            let (call, tail) = postcard::take_from_bytes::<Call>(rest)
                .map_err(|e| RecordError::Corrupt(format!("call {}: {e}", calls.len() + 1)))?;
            calls.push(call);
            rest = tail;
        }
        if calls.len() as u64 != u64::from(self.call_count) {
            return Err(RecordError::Corrupt(format!(
                "it says {} calls and holds {}",
                self.call_count,
                calls.len()
            )));
        }
        Ok(calls)
    }

    /// The record's size in bytes, encoded.
    pub fn encoded_len(&self) -> usize {
        postcard::to_allocvec(self).map_or(0, |v| v.len())
    }
}

/// The records of one or more attempts, as a file holds them.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RecordFile {
    /// The attempts, in order.
    pub attempts: Vec<AttemptRecord>,
}

/// Why a record cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Not a record at all.
    #[error("this is not a taskhost record (it does not start with `THRECORD`)")]
    NotARecord,
    /// A format this host does not read.
    #[error(
        "this record is of format version {0}, and this host reads version {FORMAT_VERSION}: \
         replay it with the host that wrote it"
    )]
    Version(u16),
    /// Damaged.
    #[error("the record is damaged: {0}")]
    Corrupt(String),
}

impl RecordFile {
    /// Attempt `n` of the file (none: its last); else the numbers of the
    /// attempts it holds, joined by `, ` (empty: none).
    pub fn take_attempt(self, n: Option<u32>) -> Result<AttemptRecord, String> {
        let held: Vec<String> = self
            .attempts
            .iter()
            .map(|a| a.start.attempt.to_string())
            .collect();
        let found = match n {
            Some(n) => self.attempts.into_iter().find(|a| a.start.attempt == n),
            None => self.attempts.into_iter().last(),
        };
        found.ok_or_else(|| held.join(", "))
    }

    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        // Encoding plain data into a Vec cannot fail.
        out.extend(postcard::to_allocvec(self).unwrap_or_default());
        out
    }

    /// Reads a file's bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let body = bytes
            .strip_prefix(&MAGIC[..])
            .ok_or(RecordError::NotARecord)?;
        let (version, body) = body
            .split_first_chunk::<2>()
            .ok_or_else(|| RecordError::Corrupt("it ends after its magic".into()))?;
        let version = u16::from_le_bytes(*version);
        if version != FORMAT_VERSION {
            return Err(RecordError::Version(version));
        }
        let (file, rest) = postcard::take_from_bytes::<Self>(body)
            .map_err(|e| RecordError::Corrupt(e.to_string()))?;
        if !rest.is_empty() {
            return Err(RecordError::Corrupt(format!(
                "{} bytes follow its end",
                rest.len()
            )));
        }
        Ok(file)
    }
}

/// sha256 of some bytes.
pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// A fast, stable 64-bit fingerprint of some bytes: what a replay
/// compares of outputs, lines, written values and specs (they need no
/// secrecy; a secret's value is digested with sha256). Eight bytes at a
/// time, then a final mix, the same on every host and version.
pub fn fingerprint(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let step = |h: u64, word: u64| (h.rotate_left(5) ^ word).wrapping_mul(K);
    let mut h = step(0x243f_6a88_85a3_08d3, bytes.len() as u64);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        h = step(h, u64::from_le_bytes(word));
    }
    let mut tail = [0u8; 8];
    tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    mix(step(h, u64::from_le_bytes(tail)))
}

/// splitmix64's finaliser: every bit of the input reaches every bit.
fn mix(mut h: u64) -> u64 {
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Fingerprints the lines an attempt says, in order, each with its stream.
#[derive(Default, Clone)]
pub(crate) struct LineDigest {
    state: u64,
    count: u64,
}

impl LineDigest {
    /// Adds one line.
    pub(crate) fn line(&mut self, stream: &str, text: &str) {
        let line = fingerprint(stream.as_bytes()) ^ fingerprint(text.as_bytes()).rotate_left(17);
        self.state = mix(self.state.rotate_left(23) ^ line);
        self.count += 1;
    }

    /// The fingerprint and the count.
    pub(crate) fn finish(&self) -> (u64, u64) {
        (self.state, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_vectors_encode_as_the_sequences_a_version_1_record_holds() {
        // Written with the derive's sequence of u8, read with bytes, and back.
        // `Answer::Value` is its seventh variant.
        #[derive(Serialize)]
        #[allow(dead_code)]
        enum Before {
            Time,
            Nanos,
            Flag,
            Slept,
            Spawned,
            Waited,
            Value(Result<Option<Vec<u8>>, String>),
        }
        for value in [
            Ok(Some(vec![7u8; 200])),
            Ok(Some(Vec::new())),
            Ok(None),
            Err("e".into()),
        ] {
            let before = postcard::to_allocvec(&Before::Value(value.clone())).unwrap();
            let now = postcard::to_allocvec(&Answer::Value(value.clone())).unwrap();
            assert_eq!(before, now);
            assert_eq!(
                postcard::from_bytes::<Answer>(&before).unwrap(),
                Answer::Value(value)
            );
        }
    }
}
