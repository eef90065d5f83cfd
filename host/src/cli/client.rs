//! Owns the client side of the daemon connection: finding the socket,
//! the handshake, request ids, plugin upload by digest, and the one-line
//! "no daemon" error (exit 5).

use std::path::{Path, PathBuf};

use taskhost::daemon::protocol::{
    Envelope, FrameError, Hello, MAGIC, PROTOCOL_VERSION, Reply, Request, UPLOAD_CHUNK, Welcome,
    read_frame, write_frame,
};
use taskhost::daemon::socket;
use taskhost::runtime::Digest;
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use super::ExitError;

/// Exit code when the daemon cannot be reached or misbehaves.
pub const EXIT_DAEMON: u8 = 5;

/// A connection to the daemon.
pub struct Client {
    reader: OwnedReadHalf,
    writer: OwnedWriteHalf,
    next_id: u32,
    socket: PathBuf,
}

fn protocol_error(socket: &Path, err: impl std::fmt::Display) -> anyhow::Error {
    ExitError::error(
        EXIT_DAEMON,
        format!(
            "the daemon at `{}` broke the protocol: {err}",
            socket.display()
        ),
    )
}

impl Client {
    /// Connects and shakes hands; exit 5 with a hint when nobody answers.
    pub async fn connect(flag: Option<&Path>) -> anyhow::Result<Self> {
        let socket = socket::resolve(flag);
        let stream = UnixStream::connect(&socket).await.map_err(|e| {
            ExitError::error(
                EXIT_DAEMON,
                format!(
                    "no daemon answers at `{}` ({e}); start one with `host serve` (or point --socket / TASKHOST_SOCKET at a running one)",
                    socket.display()
                ),
            )
        })?;
        let (mut reader, mut writer) = stream.into_split();
        write_frame(
            &mut writer,
            &Hello {
                magic: MAGIC,
                version: PROTOCOL_VERSION,
            },
        )
        .await
        .map_err(|e| protocol_error(&socket, e))?;
        let welcome: Welcome = read_frame(&mut reader)
            .await
            .map_err(|e| protocol_error(&socket, e))?;
        if welcome.version != PROTOCOL_VERSION {
            return Err(ExitError::error(
                EXIT_DAEMON,
                format!(
                    "the daemon at `{}` speaks protocol {} (taskhost {}), this client speaks {PROTOCOL_VERSION}; use matching versions",
                    socket.display(),
                    welcome.version,
                    welcome.daemon
                ),
            ));
        }
        Ok(Self {
            reader,
            writer,
            next_id: 1,
            socket,
        })
    }

    /// Sends a request; returns its id.
    pub async fn send(&mut self, body: Request) -> anyhow::Result<u32> {
        let id = self.next_id;
        self.next_id += 1;
        write_frame(&mut self.writer, &Envelope { id, body })
            .await
            .map_err(|e| protocol_error(&self.socket, e))?;
        Ok(id)
    }

    /// The next reply of any request.
    pub async fn recv(&mut self) -> anyhow::Result<Envelope<Reply>> {
        match read_frame(&mut self.reader).await {
            Ok(reply) => Ok(reply),
            Err(FrameError::Closed) => Err(ExitError::error(
                EXIT_DAEMON,
                format!(
                    "the daemon at `{}` closed the connection",
                    self.socket.display()
                ),
            )),
            Err(err) => Err(protocol_error(&self.socket, err)),
        }
    }

    /// Sends a request and returns its (first) reply, turning a daemon
    /// error into the matching exit code.
    pub async fn call(&mut self, body: Request) -> anyhow::Result<Reply> {
        let id = self.send(body).await?;
        loop {
            let reply = self.recv().await?;
            if reply.id == id {
                return check(reply.body);
            }
        }
    }

    /// Makes sure the daemon has this plugin, uploading it if not.
    pub async fn ensure_plugin(&mut self, bytes: &[u8]) -> anyhow::Result<Digest> {
        let digest = Digest::of(bytes);
        if let Reply::HasPlugin(true) = self.call(Request::HasPlugin(digest.0)).await? {
            return Ok(digest);
        }
        let chunks: Vec<&[u8]> = if bytes.is_empty() {
            vec![bytes]
        } else {
            bytes.chunks(UPLOAD_CHUNK).collect()
        };
        let mut offset = 0u64;
        for (i, chunk) in chunks.iter().enumerate() {
            self.call(Request::Upload {
                digest: digest.0,
                offset,
                data: chunk.to_vec(),
                last: i + 1 == chunks.len(),
            })
            .await?;
            offset += chunk.len() as u64;
        }
        Ok(digest)
    }
}

/// A daemon-side error becomes an exit code: invalid input 2, not found 2,
/// shutting down 3, anything else 5.
pub fn check(reply: Reply) -> anyhow::Result<Reply> {
    use taskhost::daemon::protocol::ErrorKind;
    match reply {
        Reply::Error { kind, message } => {
            let code = match kind {
                ErrorKind::Invalid | ErrorKind::NotFound => super::EXIT_USAGE,
                ErrorKind::ShuttingDown => 3,
                ErrorKind::Internal => EXIT_DAEMON,
            };
            Err(ExitError::error(code, message))
        }
        other => Ok(other),
    }
}
