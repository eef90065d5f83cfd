//! Owns the wire: the message types exchanged over the daemon's socket, the
//! version handshake, and the framing (a 4-byte big-endian length, then a
//! postcard body of at most [`MAX_FRAME`] bytes). Decoding never trusts a
//! length prefix for allocation: a frame's buffer grows only as its bytes
//! arrive, and a prefix over the maximum ends the connection.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::outcome::TaskOutcome;

/// The protocol version; both sides must agree.
pub const PROTOCOL_VERSION: u32 = 1;
/// The largest frame accepted in either direction.
pub const MAX_FRAME: usize = 4 << 20;
/// Plugin bytes per upload chunk (well under [`MAX_FRAME`]).
pub const UPLOAD_CHUNK: usize = 1 << 20;
/// The magic that opens a client's hello, so a stray client fails fast.
pub const MAGIC: [u8; 8] = *b"TASKHOST";

/// The first message of a client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`MAGIC`].
    pub magic: [u8; 8],
    /// The client's [`PROTOCOL_VERSION`].
    pub version: u32,
}

/// The daemon's answer to [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// The daemon's [`PROTOCOL_VERSION`].
    pub version: u32,
    /// The daemon's build version, for error messages.
    pub daemon: String,
}

/// A client request with its id (unique per connection; replies carry it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// The request id.
    pub id: u32,
    /// The payload.
    pub body: T,
}

/// A task by id or by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Target {
    /// By id.
    Id(u64),
    /// By name.
    Name(String),
}

impl Target {
    /// Parses a command-line `ID|NAME`: all digits is an id.
    pub fn parse(text: &str) -> Self {
        match text.parse() {
            Ok(id) => Self::Id(id),
            Err(_) => Self::Name(text.to_owned()),
        }
    }
}

/// One directory grant, with the host path already absolute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireDir {
    /// Host directory (absolute).
    pub host: String,
    /// Guest path.
    pub guest: String,
    /// Read-only.
    pub read_only: bool,
}

/// A submission as sent by `host submit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitRequest {
    /// The plugin's sha256 digest (uploaded before, or already known).
    pub digest: [u8; 32],
    /// Task name; default `<plugin>-<id>`.
    pub name: Option<String>,
    /// Explicit slot.
    pub slot: Option<String>,
    /// Admission policy: `queue`, `replace`, `drop-if-running`; default the
    /// plugin's.
    pub policy: Option<String>,
    /// Params.
    pub params: Vec<(String, String)>,
    /// Input bytes.
    pub input: Vec<u8>,
    /// `never`, `on-failure`, `always`.
    pub restart: Option<String>,
    /// Interval of `always`, ms.
    pub every_ms: Option<u64>,
    /// Retry budget.
    pub max_retries: Option<u32>,
    /// Backoff: first ms, max ms, factor, jitter name.
    pub backoff: Option<(u64, u64, f64, String)>,
    /// Per-attempt timeout, ms (0 = none).
    pub timeout_ms: Option<u64>,
    /// Memory limit, bytes.
    pub max_memory: Option<u64>,
    /// Directory grants.
    pub dirs: Vec<WireDir>,
    /// Environment grants.
    pub env: Vec<(String, String)>,
}

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Is this plugin digest already known to the daemon?
    HasPlugin([u8; 32]),
    /// One chunk of a plugin upload; `offset` must continue the upload of
    /// this digest on this connection; `last` completes it.
    Upload {
        /// The digest of the whole plugin.
        digest: [u8; 32],
        /// Where this chunk starts.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
        /// Whether this is the final chunk.
        last: bool,
    },
    /// Submit a task.
    Submit(Box<SubmitRequest>),
    /// Wait for a task's final outcome.
    Wait(Target),
    /// Stop a task (or remove queued work); with `wait`, wait for its end.
    Cancel {
        /// Which task.
        target: Target,
        /// Wait for the logical end.
        wait: bool,
    },
    /// List registered and queued tasks.
    List,
    /// The controller's slots.
    Slots,
    /// Recent events; with `follow`, then live ones until the client leaves.
    Events {
        /// Keep streaming.
        follow: bool,
    },
    /// A task's log lines; with `follow`, then live ones until it ends.
    Logs {
        /// Which task.
        target: Target,
        /// Keep streaming.
        follow: bool,
    },
    /// Shut the daemon down.
    Shutdown {
        /// Grace for running tasks, ms; `None`: the daemon's own grace.
        grace_ms: Option<u64>,
    },
}

/// A task's final report on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireReport {
    /// Id.
    pub id: u64,
    /// Name.
    pub name: String,
    /// Slot.
    pub slot: String,
    /// Outcome.
    pub outcome: TaskOutcome,
    /// Attempts started.
    pub attempts: u32,
    /// `attempt N: result (duration)` lines.
    pub history: Vec<String>,
}

/// A row of `host ps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireTask {
    /// Id.
    pub id: u64,
    /// Name.
    pub name: String,
    /// Slot.
    pub slot: String,
    /// `queued`, `waiting`, `running`, `backing-off`, `stopping`, `finishing`.
    pub state: String,
    /// Attempts started.
    pub attempts: u32,
}

/// A row of `host slots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireSlot {
    /// Key.
    pub key: String,
    /// `idle`, `admitting`, `running`, `terminating`.
    pub state: String,
    /// Owner id.
    pub owner: Option<u64>,
    /// Queue depth.
    pub queue_depth: u64,
    /// Time in state, ms.
    pub in_state_ms: u64,
}

/// An event on the wire (the JSON form of the supervisor's event).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireEvent {
    /// Seq.
    pub seq: u64,
    /// Kind, such as `TaskFinished`.
    pub kind: String,
    /// Task id.
    pub task_id: Option<u64>,
    /// Task name.
    pub name: Option<String>,
    /// The event as one JSON object.
    pub json: String,
}

/// A task log line on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireLogLine {
    /// `stdout`, `stderr`, or a log level.
    pub stream: String,
    /// The line.
    pub text: String,
}

/// What the daemon answers. Streams end with [`Reply::End`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// Whether a digest is known.
    HasPlugin(bool),
    /// An upload chunk was taken; with the plugin's name once complete.
    Uploaded {
        /// The plugin name once the upload completed and validated.
        plugin: Option<String>,
    },
    /// A submission was taken in.
    Submitted {
        /// Its id.
        id: u64,
        /// Its name.
        name: String,
        /// Its slot.
        slot: String,
        /// Whether it is queued behind another owner.
        queued: bool,
        /// Set when it was rejected at intake (the slot was busy, a queue
        /// was full, ...): its final outcome.
        rejected: Option<TaskOutcome>,
    },
    /// A final report.
    Report(WireReport),
    /// The answer to Cancel: whether this call made the stop claim, and
    /// the report when asked to wait.
    Canceled {
        /// Claimed by this call.
        claimed: bool,
        /// The report, if waited for.
        report: Option<WireReport>,
    },
    /// `host ps`.
    Tasks(Vec<WireTask>),
    /// `host slots`.
    Slots(Vec<WireSlot>),
    /// One event of a stream.
    Event(WireEvent),
    /// Events were dropped from this stream.
    Dropped(u64),
    /// One log line of a stream.
    Log(WireLogLine),
    /// The end of a stream.
    End,
    /// The daemon is shutting down; how it went.
    ShutdownDone {
        /// Names of tasks that had to be force-aborted.
        stuck: Vec<String>,
    },
    /// The request failed.
    Error {
        /// What kind of failure (decides the client's exit code).
        kind: ErrorKind,
        /// One line for people.
        message: String,
    },
}

/// The kind of a failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// Bad input from the client (exit 2).
    Invalid,
    /// No such task.
    NotFound,
    /// The daemon is shutting down.
    ShuttingDown,
    /// Anything else.
    Internal,
}

/// A framing or decoding failure: the connection is finished.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection between frames.
    #[error("the connection closed")]
    Closed,
    /// A length prefix over the maximum.
    #[error("a frame of {0} bytes is over the limit of {MAX_FRAME} bytes")]
    TooLarge(u64),
    /// The body did not decode.
    #[error("a malformed frame: {0}")]
    Malformed(String),
    /// An I/O error (including a frame cut short).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Reads one frame and decodes it.
pub async fn read_frame<T: for<'de> Deserialize<'de>>(
    reader: &mut (impl AsyncRead + Unpin),
) -> Result<T, FrameError> {
    let mut len = [0u8; 4];
    match reader.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as u64;
    if len > MAX_FRAME as u64 {
        return Err(FrameError::TooLarge(len));
    }
    // Grow with the bytes that actually arrive, never by the prefix alone.
    let mut body = Vec::with_capacity((len as usize).min(64 * 1024));
    let read = reader.take(len).read_to_end(&mut body).await?;
    if (read as u64) < len {
        return Err(FrameError::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "a frame was cut short",
        )));
    }
    decode(&body)
}

/// Decodes one frame body.
pub fn decode<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, FrameError> {
    postcard::from_bytes(body).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Encodes one frame (length prefix + body).
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, FrameError> {
    let body = postcard::to_allocvec(value).map_err(|e| FrameError::Malformed(e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(body.len() as u64));
    }
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Writes one frame.
pub async fn write_frame<T: Serialize>(
    writer: &mut (impl AsyncWrite + Unpin),
    value: &T,
) -> Result<(), FrameError> {
    let frame = encode(value)?;
    writer.write_all(&frame).await?;
    writer.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip() {
        let msg = Envelope {
            id: 7,
            body: Request::Wait(Target::Name("x".into())),
        };
        let frame = encode(&msg).unwrap();
        let back: Envelope<Request> = read_frame(&mut frame.as_slice()).await.unwrap();
        assert_eq!(back, msg);
    }

    #[tokio::test]
    async fn hostile_frames_are_errors_not_allocations() {
        let huge = [0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            read_frame::<Request>(&mut huge.as_slice()).await,
            Err(FrameError::TooLarge(_))
        ));
        let cut = [0, 0, 0, 10, 1, 2];
        assert!(matches!(
            read_frame::<Request>(&mut cut.as_slice()).await,
            Err(FrameError::Io(_))
        ));
        let garbage = [0, 0, 0, 3, 0xff, 0xff, 0xff];
        assert!(matches!(
            read_frame::<Request>(&mut garbage.as_slice()).await,
            Err(FrameError::Malformed(_))
        ));
        assert!(matches!(
            read_frame::<Request>(&mut [].as_slice()).await,
            Err(FrameError::Closed)
        ));
    }

    #[test]
    fn targets_parse() {
        assert_eq!(Target::parse("42"), Target::Id(42));
        assert_eq!(Target::parse("deploy-1"), Target::Name("deploy-1".into()));
    }
}
