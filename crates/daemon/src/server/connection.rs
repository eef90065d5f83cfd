//! Owns one client connection: the handshake, reading requests and handing
//! them to `dispatch` one at a time in the order they were sent (so upload
//! chunks, and a Submit followed by a Wait, are handled in order; only the
//! long waits and streams go on in the background), and its outbox, which
//! puts the replies on the wire from the task that makes them, batching the
//! ones that are ready together into one write. A reply that cannot be
//! encoded reaches the client as an error naming why; nothing is dropped
//! silently. Any framing error ends this connection only.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::net::UnixStream;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use taskhost_core::outcome::TaskOutcome;
use taskhost_core::supervisor::TaskReport;

use crate::backend::daemon::Daemon;
use crate::server::dispatch;
use crate::server::scope::Credential;
use crate::service::namespace::View;
use crate::wire::protocol::{
    Envelope, ErrorKind, FrameError, Hello, MAGIC, OUTPUT_CHUNK, PROTOCOL_VERSION, Reply, Request,
    Welcome, encode, read_frame, write_frame,
};

/// Requests one connection may have in flight before the daemon stops
/// reading from it.
const MAX_IN_FLIGHT: usize = 64;
/// Bytes of replies queued per connection before request handlers wait.
const MAX_QUEUED: usize = 1024 * 1024;
/// Bytes of queue a connection keeps allocated once it is written out.
const KEEP_QUEUED: usize = 64 * 1024;
/// How long a client has to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves one client of the Unix socket (its owner: every request).
pub(crate) async fn serve(daemon: Arc<Daemon>, stream: UnixStream) -> Result<(), FrameError> {
    let (reader, writer) = stream.into_split();
    serve_io(daemon, reader, writer, Credential::operator()).await
}

/// Serves one client on any byte stream: handshake, then requests until it
/// leaves, each refused unless `credential` allows it.
pub(crate) async fn serve_io(
    daemon: Arc<Daemon>,
    reader: impl AsyncRead + Unpin,
    mut writer: impl AsyncWrite + Unpin + Send + 'static,
    credential: Credential,
) -> Result<(), FrameError> {
    // Buffered: a frame's length and body (and a pipelining client's next
    // frames) come in one read.
    let mut reader = BufReader::new(reader);
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

    let outbox = Arc::new(Outbox::new(writer));
    let writer_task = tokio::spawn(Outbox::write_out(Arc::clone(&outbox)));
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let gone = CancellationToken::new();
    let later = Later::default();
    let mut session = dispatch::Session::new(later.clone(), credential);
    let reading = async {
        loop {
            let request: Envelope<Request> = match read_frame(&mut reader).await {
                Ok(request) => request,
                Err(FrameError::Closed) => break Ok(()),
                Err(err) => break Err(err),
            };
            let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
                break Ok(());
            };
            let reply = Replier::new(request.id, &outbox, gone.clone(), permit, session.shown());
            if let Some(refusal) = session.credential.refusal(&request.body) {
                reply.error(ErrorKind::Forbidden, refusal).await;
                continue;
            }
            dispatch::handle(&daemon, request.body, reply, &mut session).await;
        }
    };
    let result = outbox.corked(reading, later).await;
    // The client is gone: end its waits and streams (they only served it),
    // so a vanished waiter does not hold this connection until its task ends.
    gone.cancel();
    outbox.leave();
    let _ = writer_task.await;
    result
}

/// A connection's way out. Replies are written by the task that sends them,
/// with no hop to another task (which would wake another worker), unless
/// the wire is full: then the connection's writer task waits on the wire
/// and writes everything queued in one write. While the reading loop runs,
/// the outbox is corked: the replies it makes (and any others) are queued
/// and go out together when it next waits, so a pipelining client gets
/// many per system call. Replies keep the order they were sent in, and a
/// frame is queued whole or not at all.
struct Outbox {
    out: Mutex<Out>,
    /// Told when queued bytes have gone out (or the wire broke).
    room: Notify,
}

struct Out {
    /// Dropped by the writer task when the connection ends.
    writer: Option<Pin<Box<dyn AsyncWrite + Send>>>,
    queued: Vec<u8>,
    /// How much of `queued` is already on the wire.
    written: usize,
    /// The writer owes a flush.
    unflushed: bool,
    /// The writer task waits on the wire (so only it may write).
    on_wire: bool,
    /// The writer task, parked until it is needed.
    parked: Option<Waker>,
    /// The reading loop is running: queue, write when it waits.
    corked: bool,
    /// Repliers that may still send, and the reading loop.
    senders: usize,
    /// The wire failed: nothing more can be sent.
    broken: bool,
}

/// What one attempt to write without waiting came to.
enum Wrote {
    All,
    Some,
    Broke,
}

impl Out {
    fn waiting(&self) -> usize {
        self.queued.len() - self.written
    }

    fn unpark(&mut self) {
        if let Some(waker) = self.parked.take() {
            waker.wake();
        }
    }

    /// Queues `frame` and, unless corked, writes out.
    fn put(&mut self, frame: &[u8]) {
        self.queued.extend_from_slice(frame);
        self.unflushed = true;
        if !self.corked {
            self.push_out();
        }
    }

    /// Writes what is queued now, without waiting, unless the writer task
    /// waits on the wire (it takes it then). What the wire does not take at
    /// once is left to that task, which registers with the wire.
    fn push_out(&mut self) {
        if self.on_wire || !self.unflushed {
            return;
        }
        match self.write(&mut Context::from_waker(Waker::noop())) {
            Wrote::All => {}
            Wrote::Some => self.unpark(),
            Wrote::Broke => self.broke(),
        }
    }

    /// Writes and flushes what is queued as far as the wire takes it now;
    /// `cx` is told when it takes more.
    fn write(&mut self, cx: &mut Context<'_>) -> Wrote {
        let Some(writer) = self.writer.as_mut() else {
            return Wrote::Some;
        };
        while self.written < self.queued.len() {
            match writer.as_mut().poll_write(cx, &self.queued[self.written..]) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Wrote::Broke,
                Poll::Ready(Ok(n)) => self.written += n,
                Poll::Pending => return Wrote::Some,
            }
        }
        match writer.as_mut().poll_flush(cx) {
            Poll::Ready(Ok(())) => {
                self.unflushed = false;
                self.forget_written();
                Wrote::All
            }
            Poll::Ready(Err(_)) => Wrote::Broke,
            Poll::Pending => Wrote::Some,
        }
    }

    /// Drops the bytes that are on the wire once all of them are.
    fn forget_written(&mut self) {
        if self.written == self.queued.len() {
            self.queued.clear();
            self.queued.shrink_to(KEEP_QUEUED);
            self.written = 0;
        }
    }

    fn broke(&mut self) {
        self.broken = true;
        self.unpark();
    }
}

impl Outbox {
    fn new(writer: impl AsyncWrite + Send + 'static) -> Outbox {
        Outbox {
            out: Mutex::new(Out {
                writer: Some(Box::pin(writer)),
                queued: Vec::new(),
                written: 0,
                unflushed: false,
                on_wire: false,
                parked: None,
                corked: false,
                senders: 1,
                broken: false,
            }),
            room: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Out> {
        self.out.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues (and unless corked, writes) one frame; waits while too much
    /// is queued. False once the wire has failed.
    async fn send(&self, frame: &[u8]) -> bool {
        loop {
            let room = self.room.notified();
            let mut room = std::pin::pin!(room);
            room.as_mut().enable();
            {
                let mut out = self.lock();
                if out.broken {
                    return false;
                }
                if out.waiting() < MAX_QUEUED {
                    out.put(frame);
                    return !out.broken;
                }
                // Corked by the loop that is waiting here: let it out.
                out.push_out();
            }
            room.await;
        }
    }

    /// Polls the reading loop, and the replies it left for `later`,
    /// corked; writes what they queued when they wait. Ends when the loop
    /// has ended and every later reply is sent.
    async fn corked<T>(&self, reading: impl Future<Output = T>, later: Later) -> T {
        let mut reading = std::pin::pin!(reading);
        let mut ended = None;
        let mut waiting = FuturesUnordered::new();
        std::future::poll_fn(|cx| {
            self.lock().corked = true;
            if ended.is_none()
                && let Poll::Ready(out) = reading.as_mut().poll(cx)
            {
                ended = Some(out);
            }
            waiting.extend(later.take());
            while let Poll::Ready(Some(())) = waiting.poll_next_unpin(cx) {}
            let mut out = self.lock();
            out.corked = false;
            out.push_out();
            if out.waiting() < MAX_QUEUED {
                self.room.notify_waiters();
            }
            match ended.take() {
                Some(result) if waiting.is_empty() => Poll::Ready(result),
                result => {
                    ended = result;
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// One sender fewer; the writer task ends when none is left and all is
    /// written.
    fn leave(&self) {
        let mut out = self.lock();
        out.senders -= 1;
        if out.senders == 0 {
            out.unpark();
        }
    }

    /// The writer task: when woken, puts what is queued on the wire,
    /// waiting on it as needed, until the wire fails or every sender has
    /// left and all is written.
    async fn write_out(outbox: Arc<Outbox>) {
        std::future::poll_fn(|cx| {
            let mut out = outbox.lock();
            let out = &mut *out;
            out.on_wire = false;
            if out.writer.is_none() {
                return Poll::Ready(());
            }
            let wrote = if out.broken {
                Wrote::Broke
            } else {
                out.write(cx)
            };
            match wrote {
                Wrote::Broke => {
                    out.broken = true;
                    out.writer = None;
                    outbox.room.notify_waiters();
                    Poll::Ready(())
                }
                Wrote::Some => {
                    out.on_wire = true;
                    if out.waiting() < MAX_QUEUED {
                        outbox.room.notify_waiters();
                    }
                    Poll::Pending
                }
                Wrote::All => {
                    outbox.room.notify_waiters();
                    if out.senders == 0 {
                        out.writer = None;
                        return Poll::Ready(());
                    }
                    out.parked = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await;
    }
}

/// Replies that follow a commit (a durable submission's acknowledgement).
/// The connection's reading loop polls them, not a task each: the replies
/// one commit releases go out together, from one task woken once. Only the
/// reading loop pushes (it is polled right after).
#[derive(Clone, Default)]
pub(crate) struct Later(Arc<Mutex<Vec<BoxFuture<'static, ()>>>>);

impl Later {
    pub(crate) fn push(&self, reply: impl Future<Output = ()> + Send + 'static) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::pin(reply));
    }

    fn take(&self) -> Vec<BoxFuture<'static, ()>> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Encodes one reply's frame; a reply that cannot be encoded becomes an
/// error reply to the same request.
fn frame_of(reply: &Envelope<Reply>) -> Vec<u8> {
    match encode(reply) {
        Ok(frame) => frame,
        Err(err) => {
            tracing::warn!(request = reply.id, "a reply could not be encoded: {err}");
            let error = Envelope {
                id: reply.id,
                body: Reply::Error {
                    kind: ErrorKind::Internal,
                    message: format!("the daemon could not send its reply: {err}"),
                },
            };
            encode(&error).unwrap_or_default()
        }
    }
}

/// Sends the replies of one request. Holds one of the connection's
/// in-flight permits until it is dropped.
pub(crate) struct Replier {
    id: u32,
    outbox: Arc<Outbox>,
    /// Cancelled when the client has closed the connection.
    gone: CancellationToken,
    _permit: OwnedSemaphorePermit,
    /// The connection's namespace, when it is not the default one's
    /// single view: every reply is shown as it sees it.
    view: Option<Arc<View>>,
}

impl Drop for Replier {
    fn drop(&mut self) {
        self.outbox.leave();
    }
}

impl Replier {
    fn new(
        id: u32,
        outbox: &Arc<Outbox>,
        gone: CancellationToken,
        permit: OwnedSemaphorePermit,
        view: Option<Arc<View>>,
    ) -> Replier {
        outbox.lock().senders += 1;
        Replier {
            id,
            outbox: Arc::clone(outbox),
            gone,
            _permit: permit,
            view,
        }
    }

    /// Awaits `work` unless the client leaves first (then `None`).
    pub(crate) async fn until_gone<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            out = work => Some(out),
            () = self.gone.cancelled() => None,
        }
    }

    /// False once the client is gone.
    pub(crate) async fn send(&self, body: Reply) -> bool {
        let body = match &self.view {
            Some(view) => crate::server::view::reply(view, body),
            None => body,
        };
        let frame = frame_of(&Envelope { id: self.id, body });
        self.outbox.send(&frame).await
    }

    /// Sends a service's error (or the wire's kind and message).
    pub(crate) async fn failed(&self, error: impl Into<(ErrorKind, String)>) {
        let (kind, message) = error.into();
        self.error(kind, message).await;
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
