//! Owns one client connection: the handshake, reading requests and handing
//! them to `dispatch` one at a time in the order they were sent (so upload
//! chunks, and a Submit followed by a Wait, are handled in order; only the
//! long waits and streams go on in the background), and the writer that puts
//! the replies on the wire, batching the ones that are ready together into
//! one write. A reply that cannot be encoded reaches the client as an error
//! naming why; nothing is dropped silently. Any framing error ends this
//! connection only.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use taskhost_core::outcome::TaskOutcome;
use taskhost_core::supervisor::TaskReport;

use crate::server::dispatch;
use crate::server::scope::Scope;
use crate::state::Daemon;
use crate::wire::protocol::{
    Envelope, ErrorKind, FrameError, Hello, MAGIC, OUTPUT_CHUNK, PROTOCOL_VERSION, Reply, Request,
    Welcome, encode, read_frame, write_frame,
};

/// Requests one connection may have in flight before the daemon stops
/// reading from it.
const MAX_IN_FLIGHT: usize = 64;
/// Replies buffered per connection before request handlers wait.
const REPLY_BUFFER: usize = 256;
/// Bytes of replies put on the wire in one write at most.
const WRITE_BATCH: usize = 256 * 1024;
/// How long a client has to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves one client of the Unix socket (its owner: every request).
pub(crate) async fn serve(daemon: Arc<Daemon>, stream: UnixStream) -> Result<(), FrameError> {
    let (reader, writer) = stream.into_split();
    serve_io(daemon, reader, writer, Scope::Admin).await
}

/// Serves one client on any byte stream: handshake, then requests until it
/// leaves, each refused unless `scope` allows it.
pub(crate) async fn serve_io(
    daemon: Arc<Daemon>,
    mut reader: impl AsyncRead + Unpin,
    mut writer: impl AsyncWrite + Unpin + Send + 'static,
    scope: Scope,
) -> Result<(), FrameError> {
    let hello: Hello = tokio::time::timeout(HELLO_TIMEOUT, read_frame(&mut reader))
        .await
        .map_err(|_| FrameError::Malformed("no hello within 5s".into()))??;
    if hello.magic != MAGIC {
        return Err(FrameError::Malformed("not a taskhost client".into()));
    }
    write_frame(
        &mut writer,
        &Welcome {
            version: PROTOCOL_VERSION,
            daemon: env!("CARGO_PKG_VERSION").to_owned(),
        },
    )
    .await?;
    if hello.version != PROTOCOL_VERSION {
        return Err(FrameError::Malformed(format!(
            "protocol version {} is not {PROTOCOL_VERSION}",
            hello.version
        )));
    }

    let (tx, rx) = mpsc::channel::<Envelope<Reply>>(REPLY_BUFFER);
    let writer_task = tokio::spawn(write_replies(writer, rx));
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let gone = CancellationToken::new();
    let mut session = dispatch::Session::default();
    let result = loop {
        let request: Envelope<Request> = match read_frame(&mut reader).await {
            Ok(request) => request,
            Err(FrameError::Closed) => break Ok(()),
            Err(err) => break Err(err),
        };
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            break Ok(());
        };
        let reply = Replier {
            id: request.id,
            tx: tx.clone(),
            gone: gone.clone(),
            _permit: permit,
        };
        let needed = Scope::needed(&request.body);
        if needed > scope {
            reply
                .error(ErrorKind::Forbidden, scope.refusal(needed))
                .await;
            continue;
        }
        dispatch::handle(&daemon, request.body, reply, &mut session).await;
    };
    // The client is gone: end its waits and streams (they only served it),
    // so a vanished waiter does not hold this connection until its task ends.
    gone.cancel();
    drop(tx);
    let _ = writer_task.await;
    result
}

/// Puts replies on the wire; the replies that are ready together go out in
/// one write, so a pipelining client gets many per system call.
async fn write_replies(
    mut writer: impl AsyncWrite + Unpin,
    mut rx: mpsc::Receiver<Envelope<Reply>>,
) {
    let mut batch = Vec::new();
    while let Some(reply) = rx.recv().await {
        batch.clear();
        let mut next = Some(reply);
        while let Some(reply) = next {
            append(&mut batch, &reply);
            next = if batch.len() < WRITE_BATCH {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        if writer.write_all(&batch).await.is_err() || writer.flush().await.is_err() {
            break;
        }
    }
}

/// Appends one reply's frame; a reply that cannot be encoded becomes an
/// error reply to the same request.
fn append(batch: &mut Vec<u8>, reply: &Envelope<Reply>) {
    match encode(reply) {
        Ok(frame) => batch.extend_from_slice(&frame),
        Err(err) => {
            tracing::warn!(request = reply.id, "a reply could not be encoded: {err}");
            let error = Envelope {
                id: reply.id,
                body: Reply::Error {
                    kind: ErrorKind::Internal,
                    message: format!("the daemon could not send its reply: {err}"),
                },
            };
            if let Ok(frame) = encode(&error) {
                batch.extend_from_slice(&frame);
            }
        }
    }
}

/// Sends the replies of one request. Holds one of the connection's
/// in-flight permits until it is dropped.
pub(crate) struct Replier {
    id: u32,
    tx: mpsc::Sender<Envelope<Reply>>,
    /// Cancelled when the client has closed the connection.
    gone: CancellationToken,
    _permit: OwnedSemaphorePermit,
}

impl Replier {
    /// Awaits `work` unless the client leaves first (then `None`).
    pub(crate) async fn until_gone<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            out = work => Some(out),
            () = self.gone.cancelled() => None,
        }
    }

    /// False once the client is gone.
    pub(crate) async fn send(&self, body: Reply) -> bool {
        self.tx.send(Envelope { id: self.id, body }).await.is_ok()
    }

    pub(crate) async fn error(&self, kind: ErrorKind, message: impl Into<String>) {
        self.send(Reply::Error {
            kind,
            message: message.into(),
        })
        .await;
    }

    /// Sends a report (as `wrap` makes it a reply); an output too large for
    /// one frame goes first in [`Reply::OutputPart`]s.
    pub(crate) async fn report(
        &self,
        report: &TaskReport,
        wrap: impl FnOnce(TaskReport) -> Reply,
    ) -> bool {
        let mut report = report.clone();
        if let TaskOutcome::Completed { output } = &mut report.outcome
            && output.len() > OUTPUT_CHUNK
        {
            for part in output.chunks(OUTPUT_CHUNK) {
                if !self.send(Reply::OutputPart(part.to_vec())).await {
                    return false;
                }
            }
            output.clear();
        }
        self.send(wrap(report)).await
    }
}
