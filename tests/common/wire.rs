//! A client of the daemon's wire protocol for tests that need many requests
//! in flight (thousands of submissions, streams, waits): one connection, a
//! reader task that routes replies to their request by id. Include it with
//! `#[path = "common/wire.rs"] mod wire;` next to `mod common;`.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use taskhost::daemon::protocol::{
    Envelope, Hello, MAGIC, PROTOCOL_VERSION, Reply, Request, SubmitRequest, UPLOAD_CHUNK, Welcome,
    read_frame, write_frame,
};
use taskhost::runtime::Digest;
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::mpsc;

type Routes = Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Reply>>>>;

/// One handshaken connection with many requests in flight.
pub struct Wire {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    routes: Routes,
    next: AtomicU32,
}

impl Wire {
    /// Connects and shakes hands; panics if the daemon does not answer.
    pub async fn connect(socket: &Path) -> Arc<Self> {
        let stream = UnixStream::connect(socket).await.expect("connect");
        let (mut reader, mut writer) = stream.into_split();
        write_frame(
            &mut writer,
            &Hello {
                magic: MAGIC,
                version: PROTOCOL_VERSION,
            },
        )
        .await
        .expect("send hello");
        let welcome: Welcome = read_frame(&mut reader).await.expect("a welcome");
        assert_eq!(welcome.version, PROTOCOL_VERSION);
        let routes: Routes = Arc::default();
        let routing = Arc::clone(&routes);
        tokio::spawn(async move {
            while let Ok(reply) = read_frame::<Envelope<Reply>>(&mut reader).await {
                let streaming = matches!(
                    reply.body,
                    Reply::Event(_) | Reply::Dropped(_) | Reply::Log(_)
                );
                let mut routes = routing.lock().unwrap();
                let Some(route) = routes.get(&reply.id) else {
                    continue;
                };
                let _ = route.send(reply.body);
                if !streaming {
                    routes.remove(&reply.id);
                }
            }
            // The connection is gone: every open request ends.
            routing.lock().unwrap().clear();
        });
        Arc::new(Self {
            writer: tokio::sync::Mutex::new(writer),
            routes,
            next: AtomicU32::new(1),
        })
    }

    /// Sends a request; its replies (one, or a stream up to `End`) arrive on
    /// the receiver, which closes if the connection ends.
    pub async fn start(&self, body: Request) -> mpsc::UnboundedReceiver<Reply> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        self.routes.lock().unwrap().insert(id, tx);
        let mut writer = self.writer.lock().await;
        write_frame(&mut *writer, &Envelope { id, body })
            .await
            .expect("send a request");
        rx
    }

    /// Sends a request and returns its first reply (`None`: the connection
    /// ended first).
    pub async fn try_call(&self, body: Request) -> Option<Reply> {
        self.start(body).await.recv().await
    }

    /// Sends a request and returns its first reply.
    pub async fn call(&self, body: Request) -> Reply {
        self.try_call(body)
            .await
            .expect("the daemon closed the connection before replying")
    }

    /// Uploads a plugin (in chunks) unless the daemon has it; returns its
    /// digest, or the daemon's error message.
    pub async fn upload(&self, bytes: &[u8]) -> Result<[u8; 32], String> {
        let digest = Digest::of(bytes).0;
        if self.call(Request::HasPlugin(digest)).await == Reply::HasPlugin(true) {
            return Ok(digest);
        }
        let chunks: Vec<&[u8]> = if bytes.is_empty() {
            vec![&[][..]]
        } else {
            bytes.chunks(UPLOAD_CHUNK).collect()
        };
        let mut offset = 0u64;
        for (i, chunk) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            let reply = self
                .call(Request::Upload {
                    digest,
                    offset,
                    data: chunk.to_vec(),
                    last,
                })
                .await;
            offset += chunk.len() as u64;
            match reply {
                Reply::Uploaded { .. } => {}
                Reply::Error { message, .. } => return Err(message),
                other => panic!("unexpected reply to an upload: {other:?}"),
            }
        }
        Ok(digest)
    }

    /// Uploads a plugin file from `plugins/`.
    pub async fn upload_plugin(&self, name: &str) -> [u8; 32] {
        let bytes = std::fs::read(plugin_artifacts::path(name)).expect("read the plugin");
        self.upload(&bytes).await.expect("the plugin uploads")
    }
}

/// A submission of `digest` with every option unset.
pub fn submission(digest: [u8; 32]) -> SubmitRequest {
    SubmitRequest {
        digest,
        name: None,
        slot: None,
        policy: None,
        params: Vec::new(),
        input: Vec::new(),
        restart: None,
        every_ms: None,
        max_retries: None,
        backoff: None,
        timeout_ms: None,
        max_memory: None,
        dirs: Vec::new(),
        env: Vec::new(),
    }
}

/// `K=V` params from pairs.
pub fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}
