//! The framing: the handshake's two messages, the envelope that carries
//! a request id, and frames (a 4-byte big-endian length, then a postcard
//! body of at most [`MAX_FRAME`] bytes). Decoding never trusts a length
//! prefix for allocation: a frame's buffer grows only as its bytes arrive,
//! and a prefix over the maximum ends the connection.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::MAX_FRAME;

/// The first message of a client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`MAGIC`](super::MAGIC).
    pub magic: [u8; 8],
    /// The client's [`PROTOCOL_VERSION`](super::PROTOCOL_VERSION).
    pub version: u32,
}

/// The daemon's answer to [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// The daemon's [`PROTOCOL_VERSION`](super::PROTOCOL_VERSION).
    pub version: u32,
    /// The daemon's build version, for `host version` and error messages.
    pub daemon: String,
}

/// A message with its request id (unique per connection; replies carry the
/// id of their request).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// The request id.
    pub id: u32,
    /// The payload.
    pub body: T,
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

    use super::super::Request;
    use taskhost_core::supervisor::TaskRef;

    #[tokio::test]
    async fn frames_round_trip() {
        let msg = Envelope {
            id: 7,
            body: Request::Wait(TaskRef::Name("x".into())),
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
}
