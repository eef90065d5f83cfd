//! Owns the client side of the daemon's protocol: connecting (optionally
//! waiting for a daemon that is still starting), the handshake, request ids,
//! routing replies to their request (many requests in flight on one
//! connection), reassembling outputs sent in parts, plugin upload by digest,
//! and typed errors. The CLI, the tests and the benchmarks all talk to the
//! daemon through it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), taskhost_daemon::ClientError> {
//! use taskhost_daemon::{Client, protocol::SubmitRequest};
//!
//! let client = Client::connect(&taskhost_daemon::socket::resolve(None)).await?;
//! let plugin = std::fs::read("target/plugins/hello.wasm").unwrap();
//! let digest = client.ensure_plugin(&plugin).await?;
//! let mut request = SubmitRequest::new(digest);
//! request.input = b"hi".to_vec();
//! let submitted = client.submit(request).await?;
//! let report = client.wait(submitted.id.into()).await?;
//! println!("{:?}", report.outcome);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use taskhost_core::controller::SlotView;
use taskhost_core::supervisor::{TaskRef, TaskReport};
use taskhost_runtime::Digest;

use crate::wire::protocol::{
    BatchItem, Enter, Envelope, ErrorKind, FrameError, Hello, KvRow, KvTarget, KvVerb, MAGIC,
    NamespaceRow, NamespaceVerb, PROTOCOL_VERSION, PluginRow, Reassembly, Reply, Request,
    ScheduleRow, ScheduleVerb, SlotRuleRow, SlotRuleVerb, SubmitRequest, Submitted, TaskPage,
    TaskRow, UPLOAD_CHUNK, Welcome, encode, read_frame, write_frame,
};

/// Replies buffered per request before the connection's reader waits for
/// the caller to take them.
const ROUTE_BUFFER: usize = 1024;

/// Why a request did not get its answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nobody listens on the socket.
    #[error(
        "no daemon answers at `{}` ({source}); start one with `host serve --detach` (or point --socket / TASKHOST_SOCKET at a running one)",
        socket.display()
    )]
    NoDaemon {
        /// The socket tried.
        socket: PathBuf,
        /// Why the connection failed.
        source: std::io::Error,
    },
    /// The socket, or the process answering on it, is not this user's own:
    /// nothing was sent.
    #[error("refusing to talk to `{}`: {why}", socket.display())]
    Untrusted {
        /// The socket.
        socket: PathBuf,
        /// What is wrong, and the fix.
        why: String,
    },
    /// The daemon speaks another protocol version.
    #[error(
        "the daemon at `{}` speaks protocol {daemon_protocol} (taskhost {daemon_version}), this client speaks {PROTOCOL_VERSION}; use matching versions",
        socket.display()
    )]
    VersionMismatch {
        /// The socket.
        socket: PathBuf,
        /// The daemon's protocol version.
        daemon_protocol: u32,
        /// The daemon's build version.
        daemon_version: String,
    },
    /// The daemon broke the protocol, or the connection failed.
    #[error("the daemon at `{}` broke the protocol: {message}", socket.display())]
    Protocol {
        /// The socket.
        socket: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The connection closed before the answer arrived (the daemon stopped).
    #[error("the daemon at `{}` closed the connection", socket.display())]
    Closed {
        /// The socket.
        socket: PathBuf,
    },
    /// A remote daemon could not be reached or refused us (the URL, TLS,
    /// the token): nothing was sent.
    #[error("cannot use the daemon at `{url}`: {why}")]
    Remote {
        /// The URL tried.
        url: String,
        /// What went wrong, and the fix.
        why: String,
    },
    /// The daemon answered with an error.
    #[error("{message}")]
    Daemon {
        /// What kind of failure.
        kind: ErrorKind,
        /// The daemon's message.
        message: String,
    },
}

type Routes = Arc<Mutex<HashMap<u32, mpsc::Sender<Reply>>>>;

/// [`socket::check_for_client`](crate::wire::socket::check_for_client) as a
/// client error.
fn check_socket_dir(socket: &Path) -> Result<(), ClientError> {
    crate::wire::socket::check_for_client(socket).map_err(|why| ClientError::Untrusted {
        socket: socket.to_owned(),
        why,
    })
}

struct Inner {
    socket: PathBuf,
    daemon_version: String,
    daemon_pid: Option<u32>,
    writer: tokio::sync::Mutex<BufWriter<Box<dyn AsyncWrite + Send + Unpin>>>,
    routes: Routes,
    next_id: AtomicU32,
}

/// A connection to the daemon; cheap to clone, usable from many tasks at
/// once (requests are pipelined, replies routed by request id).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("socket", &self.inner.socket)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects and shakes hands.
    pub async fn connect(socket: &Path) -> Result<Self, ClientError> {
        check_socket_dir(socket)?;
        let stream = UnixStream::connect(socket)
            .await
            .map_err(|source| ClientError::NoDaemon {
                socket: socket.to_owned(),
                source,
            })?;
        Self::handshake(socket, stream).await
    }

    /// Like [`Client::connect`], but waits up to `patience` for a daemon
    /// that is starting (its socket missing or not accepting yet).
    pub async fn connect_waiting(socket: &Path, patience: Duration) -> Result<Self, ClientError> {
        let deadline = Instant::now() + patience;
        let mut pause = Duration::from_millis(5);
        loop {
            // Checked on every try: the directory may appear meanwhile.
            if socket.parent().is_none_or(Path::exists) {
                check_socket_dir(socket)?;
            }
            match UnixStream::connect(socket).await {
                Ok(stream) => return Self::handshake(socket, stream).await,
                Err(source) => {
                    let starting = matches!(
                        source.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                    );
                    if !starting || Instant::now() + pause > deadline {
                        return Err(ClientError::NoDaemon {
                            socket: socket.to_owned(),
                            source,
                        });
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
            }
        }
    }

    async fn handshake(socket: &Path, stream: UnixStream) -> Result<Self, ClientError> {
        let peer = stream.peer_cred().map_err(|e| ClientError::Untrusted {
            socket: socket.to_owned(),
            why: format!("cannot tell who answers ({e})"),
        })?;
        crate::wire::socket::check_peer(socket, peer.uid()).map_err(|why| {
            ClientError::Untrusted {
                socket: socket.to_owned(),
                why,
            }
        })?;
        let daemon_pid = peer.pid().and_then(|p| u32::try_from(p).ok());
        let (reader, writer) = stream.into_split();
        Self::establish(socket, reader, writer, daemon_pid).await
    }

    /// Says hello on a connected stream (a socket's, or one upgraded from
    /// HTTP) and starts routing its replies.
    pub(crate) async fn establish(
        socket: &Path,
        mut reader: impl AsyncRead + Unpin + Send + 'static,
        mut writer: impl AsyncWrite + Unpin + Send + 'static,
        daemon_pid: Option<u32>,
    ) -> Result<Self, ClientError> {
        let protocol = |e: FrameError| ClientError::Protocol {
            socket: socket.to_owned(),
            message: e.to_string(),
        };
        write_frame(
            &mut writer,
            &Hello {
                magic: MAGIC,
                version: PROTOCOL_VERSION,
            },
        )
        .await
        .map_err(protocol)?;
        let welcome: Welcome = read_frame(&mut reader).await.map_err(protocol)?;
        if welcome.version != PROTOCOL_VERSION {
            return Err(ClientError::VersionMismatch {
                socket: socket.to_owned(),
                daemon_protocol: welcome.version,
                daemon_version: welcome.daemon,
            });
        }
        let routes: Routes = Arc::default();
        let routing = Arc::clone(&routes);
        tokio::spawn(async move {
            while let Ok(reply) = read_frame::<Envelope<Reply>>(&mut reader).await {
                let route = routing
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&reply.id)
                    .cloned();
                // A reply nobody waits for any more is dropped.
                if let Some(route) = route
                    && route.send(reply.body).await.is_err()
                {
                    routing
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&reply.id);
                }
            }
            // The connection is gone: every open request ends.
            routing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
        });
        Ok(Self {
            inner: Arc::new(Inner {
                socket: socket.to_owned(),
                daemon_version: welcome.daemon,
                daemon_pid,
                writer: tokio::sync::Mutex::new(BufWriter::new(Box::new(writer))),
                routes,
                next_id: AtomicU32::new(1),
            }),
        })
    }

    /// The daemon's build version.
    pub fn daemon_version(&self) -> &str {
        &self.inner.daemon_version
    }

    /// The pid of the daemon process (`SO_PEERCRED`), when the kernel
    /// gives it.
    pub fn daemon_pid(&self) -> Option<u32> {
        self.inner.daemon_pid
    }

    /// The socket this client talks to.
    pub fn socket(&self) -> &Path {
        &self.inner.socket
    }

    /// Sends a request; its replies arrive on the returned stream.
    pub async fn request(&self, body: Request) -> Result<Replies, ClientError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(ROUTE_BUFFER);
        self.inner
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, tx);
        let frame = encode(&Envelope { id, body }).map_err(|e| ClientError::Protocol {
            socket: self.inner.socket.clone(),
            message: e.to_string(),
        })?;
        let mut writer = self.inner.writer.lock().await;
        let written = async {
            writer.write_all(&frame).await?;
            writer.flush().await
        }
        .await;
        if written.is_err() {
            return Err(ClientError::Closed {
                socket: self.inner.socket.clone(),
            });
        }
        Ok(Replies {
            id,
            rx,
            parts: Reassembly::default(),
            client: self.clone(),
        })
    }

    /// Sends a request and returns its first reply (an output sent in parts
    /// comes back whole).
    pub async fn call(&self, body: Request) -> Result<Reply, ClientError> {
        self.request(body).await?.next_reply().await
    }

    /// Makes sure the daemon has this plugin, uploading it if not.
    pub async fn ensure_plugin(&self, bytes: &[u8]) -> Result<Digest, ClientError> {
        let digest = Digest::of(bytes);
        if let Reply::HasPlugin(true) = self.call(Request::HasPlugin(digest)).await? {
            return Ok(digest);
        }
        let chunks: Vec<&[u8]> = if bytes.is_empty() {
            vec![bytes]
        } else {
            bytes.chunks(UPLOAD_CHUNK).collect()
        };
        // The chunks are pipelined: the daemon takes them in order.
        let mut pending = Vec::with_capacity(chunks.len());
        let mut offset = 0u64;
        for (i, chunk) in chunks.iter().enumerate() {
            pending.push(
                self.request(Request::Upload {
                    digest,
                    offset,
                    data: chunk.to_vec(),
                    last: i + 1 == chunks.len(),
                })
                .await?,
            );
            offset += chunk.len() as u64;
        }
        for mut replies in pending {
            replies.next_reply().await?;
        }
        Ok(digest)
    }

    /// Submits a task.
    pub async fn submit(&self, request: SubmitRequest) -> Result<Submitted, ClientError> {
        match self.call(Request::Submit(Box::new(request))).await? {
            Reply::Submitted(submitted) => Ok(submitted),
            other => Err(self.unexpected("a submission", &other)),
        }
    }

    /// Submits up to [`MAX_BATCH`](crate::protocol::MAX_BATCH) tasks in one
    /// call: one answer per request, in order, once the accepted ones are
    /// durable.
    pub async fn submit_batch(
        &self,
        requests: Vec<SubmitRequest>,
    ) -> Result<Vec<BatchItem>, ClientError> {
        match self.call(Request::SubmitBatch(requests)).await? {
            Reply::SubmittedBatch(items) => Ok(items),
            other => Err(self.unexpected("a batch", &other)),
        }
    }

    /// Submits a new task with the request of `target` (as it was placed).
    pub async fn rerun(&self, target: TaskRef) -> Result<Submitted, ClientError> {
        match self.call(Request::Rerun(target)).await? {
            Reply::Submitted(submitted) => Ok(submitted),
            other => Err(self.unexpected("a rerun", &other)),
        }
    }

    /// Waits for a task's final report.
    pub async fn wait(&self, target: TaskRef) -> Result<TaskReport, ClientError> {
        match self.call(Request::Wait(target)).await? {
            Reply::Report(report) => Ok(report),
            other => Err(self.unexpected("a wait", &other)),
        }
    }

    /// A page of the daemon's tasks, newest first ([`TaskPage`]).
    pub async fn page(&self, page: TaskPage) -> Result<Vec<TaskRow>, ClientError> {
        self.pages(Request::Page(page), "ps", |reply| match reply {
            Reply::Tasks(page) => Ok(page),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// The daemon's tasks (with `all`, recently finished ones too).
    pub async fn list(&self, all: bool) -> Result<Vec<TaskRow>, ClientError> {
        self.pages(Request::List { all }, "ps", |reply| match reply {
            Reply::Tasks(page) => Ok(page),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// The controller's slots.
    pub async fn slots(&self) -> Result<Vec<SlotView>, ClientError> {
        self.pages(Request::Slots, "slots", |reply| match reply {
            Reply::Slots(page) => Ok(page),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// The daemon's stored plugins, with the tasks that use them.
    pub async fn plugins(&self) -> Result<Vec<PluginRow>, ClientError> {
        self.pages(Request::Plugins, "plugins", |reply| match reply {
            Reply::Plugins(page) => Ok(page),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// Every slot rule, by pattern.
    pub async fn slot_rules(&self) -> Result<Vec<SlotRuleRow>, ClientError> {
        let list = Request::SlotRule(SlotRuleVerb::List);
        self.pages(list, "slot ls", |reply| match reply {
            Reply::SlotRules(page) => Ok(page),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// `host slot set` and `unset`: the rule as the verb left it (or the
    /// one it removed).
    pub async fn slot_rule(&self, verb: SlotRuleVerb) -> Result<SlotRuleRow, ClientError> {
        match self.call(Request::SlotRule(verb)).await? {
            Reply::SlotRule(row) => Ok(row),
            other => Err(self.unexpected("a slot verb", &other)),
        }
    }

    /// Acts in a namespace from now on (`--namespace`), or sees every one
    /// (`--all-namespaces`).
    pub async fn enter(&self, enter: Enter) -> Result<(), ClientError> {
        match self.call(Request::Enter(enter)).await? {
            Reply::Done => Ok(()),
            other => Err(self.unexpected("entering a namespace", &other)),
        }
    }

    /// `host deploy`, `host deployments ls|history|rm` and `host rollback`:
    /// the rows the verb answers (what it made current, or the list).
    pub async fn deployment(
        &self,
        verb: crate::wire::protocol::DeploymentVerb,
    ) -> Result<Vec<crate::wire::protocol::DeploymentRow>, ClientError> {
        match self.call(Request::Deployment(verb)).await? {
            Reply::Deployments(rows) => Ok(rows),
            other => Err(self.unexpected("a deployment verb", &other)),
        }
    }

    /// A stored plugin's bytes, chunk by chunk; checked against `digest`.
    pub async fn download(&self, digest: Digest) -> Result<Vec<u8>, ClientError> {
        let mut bytes = Vec::new();
        loop {
            let offset = bytes.len() as u64;
            match self.call(Request::Download { digest, offset }).await? {
                Reply::PluginChunk { total, data } => {
                    let done = data.is_empty() || offset + data.len() as u64 >= total;
                    bytes.extend_from_slice(&data);
                    if done {
                        break;
                    }
                }
                other => return Err(self.unexpected("a plugin download", &other)),
            }
        }
        if Digest::of(&bytes) != digest {
            return Err(ClientError::Protocol {
                socket: self.inner.socket.clone(),
                message: format!("it sent plugin {digest} with other bytes"),
            });
        }
        Ok(bytes)
    }

    /// Every namespace this connection reaches, with its use.
    pub async fn namespaces(&self) -> Result<Vec<NamespaceRow>, ClientError> {
        let list = Request::Namespace(NamespaceVerb::List);
        self.pages(list, "ns ls", |reply| match reply {
            Reply::Namespaces(page) => Ok(page),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// `host ns add`, `set` and `rm`: the namespace as the verb left it
    /// (or the one it removed).
    pub async fn namespace(&self, verb: NamespaceVerb) -> Result<NamespaceRow, ClientError> {
        match self.call(Request::Namespace(verb)).await? {
            Reply::Namespace(row) => Ok(row),
            other => Err(self.unexpected("a namespace verb", &other)),
        }
    }

    /// Every schedule, by name.
    pub async fn schedules(&self) -> Result<Vec<ScheduleRow>, ClientError> {
        let list = Request::Schedule(ScheduleVerb::List);
        self.pages(list, "schedule ls", |reply| match reply {
            Reply::Schedules(page) => Ok(page),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// `host kv ls`: every bucket (`None`), or the keys of one.
    pub async fn kv_list(&self, target: Option<KvTarget>) -> Result<Vec<KvRow>, ClientError> {
        let list = Request::Kv(KvVerb::List(target));
        self.pages(list, "kv ls", |reply| match reply {
            Reply::KvRows(page) => Ok(page),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// `host kv get` and `rm`: the key's value (before a removal).
    pub async fn kv_value(&self, verb: KvVerb) -> Result<Option<Vec<u8>>, ClientError> {
        match self.call(Request::Kv(verb)).await? {
            Reply::KvValue(value) => Ok(value),
            other => Err(self.unexpected("a kv verb", &other)),
        }
    }

    /// A schedule verb answered with the schedule (`add`, `rm`, `pause`,
    /// `resume`).
    pub async fn schedule(&self, verb: ScheduleVerb) -> Result<ScheduleRow, ClientError> {
        match self.call(Request::Schedule(verb)).await? {
            Reply::Schedule(row) => Ok(row),
            other => Err(self.unexpected("a schedule verb", &other)),
        }
    }

    /// Fires a schedule once now; answered as a submission.
    pub async fn run_schedule(&self, name: &str) -> Result<Submitted, ClientError> {
        let run = Request::Schedule(ScheduleVerb::Run(name.to_owned()));
        match self.call(run).await? {
            Reply::Submitted(submitted) => Ok(submitted),
            other => Err(self.unexpected("schedule run", &other)),
        }
    }

    /// Sends a request answered by pages (`page` takes one apart) ended by
    /// [`Reply::End`]; returns the rows of every page.
    async fn pages<T>(
        &self,
        body: Request,
        what: &str,
        page: impl Fn(Reply) -> Result<Vec<T>, Box<Reply>>,
    ) -> Result<Vec<T>, ClientError> {
        let mut replies = self.request(body).await?;
        let mut rows = Vec::new();
        loop {
            match replies.next_reply().await? {
                Reply::End => return Ok(rows),
                reply => match page(reply) {
                    Ok(part) => rows.extend(part),
                    Err(other) => return Err(self.unexpected(what, &other)),
                },
            }
        }
    }

    /// Removes the stored plugin whose digest starts with `prefix` (refused
    /// while an unfinished task uses it), or with `None` every plugin no
    /// task uses; returns what was removed.
    pub async fn remove_plugins(
        &self,
        prefix: Option<String>,
    ) -> Result<Vec<PluginRow>, ClientError> {
        match self.call(Request::RemovePlugins { prefix }).await? {
            Reply::PluginsRemoved(rows) => Ok(rows),
            other => Err(self.unexpected("plugins rm", &other)),
        }
    }

    fn unexpected(&self, what: &str, reply: &Reply) -> ClientError {
        ClientError::Protocol {
            socket: self.inner.socket.clone(),
            message: format!("the daemon answered {what} with {reply:?}"),
        }
    }
}

/// The replies to one request, in the order the daemon sent them. Keeps
/// the connection open while it lives.
pub struct Replies {
    id: u32,
    rx: mpsc::Receiver<Reply>,
    parts: Reassembly,
    client: Client,
}

impl std::fmt::Debug for Replies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replies")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Replies {
    /// The next reply: `None` when the connection closed. Outputs sent in
    /// parts are reassembled into their report.
    pub async fn next(&mut self) -> Option<Reply> {
        loop {
            let reply = self.rx.recv().await?;
            if let Some(reply) = self.parts.take(reply) {
                return Some(reply);
            }
        }
    }

    /// The next reply, with a daemon's error reply and a closed connection
    /// as errors.
    pub async fn next_reply(&mut self) -> Result<Reply, ClientError> {
        match self.next().await {
            Some(Reply::Error { kind, message }) => Err(ClientError::Daemon { kind, message }),
            Some(reply) => Ok(reply),
            None => Err(ClientError::Closed {
                socket: self.client.inner.socket.clone(),
            }),
        }
    }
}

impl Drop for Replies {
    fn drop(&mut self) {
        self.client
            .inner
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}
