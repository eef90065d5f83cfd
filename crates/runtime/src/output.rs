//! Owns what happens to everything a guest says: its stdout and stderr
//! (captured per attempt, split into lines, bounded) and its structured log
//! and progress calls. All of it goes to the attempt's [`GuestSink`], tagged by
//! the sink's owner; none of it is ever written raw to the host's own output.
//! It also keeps the few recent lines that explain a trap (a panic message, the
//! tail of stderr) for the failure reason.

#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use crate::record::format::LineDigest;
use taskhost_core::logline::{LogLevel, Stream};

/// Longest line forwarded; longer lines are cut and marked.
pub const MAX_LINE_BYTES: usize = 8 * 1024;
/// Most guest output (stdout + stderr + log) forwarded per attempt; the rest
/// is dropped and counted, so a chatty guest cannot flood the host.
pub const MAX_OUTPUT_BYTES_PER_ATTEMPT: u64 = 16 << 20;
/// Stderr lines kept to explain a trap.
const STDERR_TAIL_LINES: usize = 6;

/// Receives what one attempt's guest says. Implementations must be cheap and
/// must not block: they are called from the guest's host calls.
pub trait GuestSink: Send + Sync {
    /// One complete line (without its newline) from the guest.
    fn line(&self, stream: Stream, text: &str);
    /// A `host.progress(done, total)` call.
    fn progress(&self, done: u64, total: u64);
}

/// A sink that discards everything (for validation calls and benchmarks).
#[derive(Debug, Default)]
pub struct NullSink;

impl GuestSink for NullSink {
    fn line(&self, _: Stream, _: &str) {}
    fn progress(&self, _: u64, _: u64) {}
}

/// Per-attempt state shared by the stdout/stderr streams and the log calls.
pub(crate) struct Capture {
    sink: Arc<dyn GuestSink>,
    state: Mutex<CaptureState>,
}

#[derive(Default)]
struct CaptureState {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    forwarded: u64,
    dropped: u64,
    stderr_tail: VecDeque<String>,
    panic: Option<String>,
    /// The digest of every line forwarded, when the attempt is recorded or
    /// replayed.
    lines: Option<LineDigest>,
}

impl Capture {
    pub(crate) fn new(sink: Arc<dyn GuestSink>) -> Arc<Self> {
        Arc::new(Self {
            sink,
            state: Mutex::new(CaptureState::default()),
        })
    }

    /// A capture that also digests every line it forwards, in order.
    pub(crate) fn digesting(sink: Arc<dyn GuestSink>) -> Arc<Self> {
        Arc::new(Self {
            sink,
            state: Mutex::new(CaptureState {
                lines: Some(LineDigest::default()),
                ..CaptureState::default()
            }),
        })
    }

    /// The digest of the lines forwarded so far, and their count (a
    /// capture that does not digest: zeros).
    pub(crate) fn lines(&self) -> (u64, u64) {
        self.lock()
            .lines
            .as_ref()
            .map_or((0, 0), LineDigest::finish)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CaptureState> {
        // A poisoned lock only means a sink panicked mid-line; the buffers
        // are still consistent byte vectors.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends raw stream bytes, forwarding every complete line.
    fn write(&self, stream: Stream, bytes: &[u8]) {
        let mut state = self.lock();
        let mut rest = bytes;
        while !rest.is_empty() {
            let buf = match stream {
                Stream::Stdout => &mut state.stdout,
                _ => &mut state.stderr,
            };
            match rest.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    buf.extend_from_slice(&rest[..i]);
                    rest = &rest[i + 1..];
                    let line = std::mem::take(buf);
                    self.emit(&mut state, stream, &line);
                }
                None => {
                    buf.extend_from_slice(rest);
                    rest = &[];
                    if buf.len() >= MAX_LINE_BYTES {
                        let line = std::mem::take(buf);
                        self.emit(&mut state, stream, &line);
                    }
                }
            }
        }
    }

    /// Forwards a `host.log` line.
    pub(crate) fn log(&self, level: LogLevel, message: &str) {
        let mut state = self.lock();
        if level == LogLevel::Error && message.starts_with("panicked at") && state.panic.is_none() {
            state.panic = Some(clip(message.as_bytes(), 1024));
        }
        self.emit(&mut state, Stream::Log(level), message.as_bytes());
    }

    pub(crate) fn progress(&self, done: u64, total: u64) {
        self.sink.progress(done, total);
    }

    /// Forwards whatever partial lines are left when the attempt ends.
    pub(crate) fn finish(&self) {
        let mut state = self.lock();
        for stream in [Stream::Stdout, Stream::Stderr] {
            let buf = match stream {
                Stream::Stdout => std::mem::take(&mut state.stdout),
                _ => std::mem::take(&mut state.stderr),
            };
            if !buf.is_empty() {
                self.emit(&mut state, stream, &buf);
            }
        }
        if state.dropped > 0 {
            let note = format!(
                "[taskhost] {} bytes of guest output were dropped: the limit is {} bytes per attempt",
                state.dropped, MAX_OUTPUT_BYTES_PER_ATTEMPT
            );
            Self::forward(&self.sink, &mut state, Stream::Stderr, &note);
        }
    }

    fn forward(sink: &Arc<dyn GuestSink>, state: &mut CaptureState, stream: Stream, text: &str) {
        if let Some(lines) = &mut state.lines {
            lines.line(stream.as_str(), text);
        }
        sink.line(stream, text);
    }

    /// What the guest said last that explains a failure: its panic message,
    /// else the tail of its stderr.
    pub(crate) fn explanation(&self) -> Option<String> {
        let state = self.lock();
        if let Some(panic) = &state.panic {
            return Some(panic.clone());
        }
        let tail: Vec<&str> = state.stderr_tail.iter().map(String::as_str).collect();
        (!tail.is_empty()).then(|| tail.join(" | "))
    }

    fn emit(&self, state: &mut CaptureState, stream: Stream, line: &[u8]) {
        let len = line.len() as u64 + 1;
        if state.forwarded + len > MAX_OUTPUT_BYTES_PER_ATTEMPT {
            state.dropped += len;
            return;
        }
        state.forwarded += len;
        let text = clip(line, MAX_LINE_BYTES);
        if stream == Stream::Stderr {
            if text.starts_with("panicked at") || text.contains("' panicked at ") {
                state.panic.get_or_insert_with(|| text.clone());
            }
            if state.stderr_tail.len() == STDERR_TAIL_LINES {
                state.stderr_tail.pop_front();
            }
            state.stderr_tail.push_back(clip(line, 256));
        }
        Self::forward(&self.sink, state, stream, &text);
    }
}

/// Lossy UTF-8 of at most `max` bytes, marked when cut.
fn clip(bytes: &[u8], max: usize) -> String {
    if bytes.len() <= max {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let mut text = String::from_utf8_lossy(&bytes[..max]).into_owned();
    text.push_str("…[cut]");
    text
}

/// A guest stdout or stderr that feeds a [`Capture`].
#[derive(Clone)]
pub(crate) struct CapturedStream {
    capture: Arc<Capture>,
    stream: Stream,
}

impl CapturedStream {
    pub(crate) fn new(capture: &Arc<Capture>, stream: Stream) -> Self {
        Self {
            capture: Arc::clone(capture),
            stream,
        }
    }
}

impl IsTerminal for CapturedStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

/// A WASI command's standard output: the task's output, kept whole up to
/// `limit` bytes. A write past it fails the guest's stream and is
/// remembered, so the attempt fails saying so instead of cutting the output.
#[derive(Clone)]
pub(crate) struct CommandStdout {
    limit: usize,
    state: Arc<Mutex<(Vec<u8>, bool)>>,
}

impl CommandStdout {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            state: Arc::default(),
        }
    }

    /// What was written, or `None` when a write went past the limit.
    pub(crate) fn take(&self) -> Option<Vec<u8>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (!state.1).then(|| std::mem::take(&mut state.0))
    }
}

impl IsTerminal for CommandStdout {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CommandStdout {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CommandStdout {
    async fn ready(&mut self) {}
}

impl OutputStream for CommandStdout {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.1 || state.0.len() + bytes.len() > self.limit {
            state.1 = true;
            state.0 = Vec::new();
            return Err(wasmtime_wasi::p2::StreamError::LastOperationFailed(
                wasmtime::format_err!("standard output is over its limit"),
            ));
        }
        state.0.extend_from_slice(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for CommandStdout {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let mut this = self.get_mut().clone();
        std::task::Poll::Ready(
            OutputStream::write(&mut this, Bytes::copy_from_slice(buf))
                .map(|()| buf.len())
                .map_err(|_| std::io::Error::other("standard output is over its limit")),
        )
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

impl StdoutStream for CapturedStream {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CapturedStream {
    async fn ready(&mut self) {}
}

impl OutputStream for CapturedStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.capture.write(self.stream, &bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for CapturedStream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.capture.write(self.stream, buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Lines(Mutex<Vec<(Stream, String)>>);

    impl GuestSink for Lines {
        fn line(&self, stream: Stream, text: &str) {
            self.0.lock().unwrap().push((stream, text.to_owned()));
        }
        fn progress(&self, _: u64, _: u64) {}
    }

    #[test]
    fn splits_lines_per_stream_and_flushes_the_rest() {
        let lines = Arc::new(Lines::default());
        let capture = Capture::new(lines.clone());
        capture.write(Stream::Stdout, b"a\nb");
        capture.write(Stream::Stderr, b"err\n");
        capture.write(Stream::Stdout, b"c\n\nd");
        capture.finish();
        let got = lines.0.lock().unwrap().clone();
        let want = [
            (Stream::Stdout, "a"),
            (Stream::Stderr, "err"),
            (Stream::Stdout, "bc"),
            (Stream::Stdout, ""),
            (Stream::Stdout, "d"),
        ];
        assert_eq!(got.len(), want.len());
        for ((gs, gt), (ws, wt)) in got.iter().zip(want) {
            assert_eq!((*gs, gt.as_str()), (ws, wt));
        }
        assert_eq!(capture.explanation().as_deref(), Some("err"));
    }

    #[test]
    fn output_is_bounded() {
        let lines = Arc::new(Lines::default());
        let capture = Capture::new(lines.clone());
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..40 {
            capture.write(Stream::Stdout, &chunk);
        }
        capture.finish();
        let got = lines.0.lock().unwrap();
        let forwarded: usize = got.iter().map(|(_, t)| t.len()).sum();
        assert!(forwarded <= (MAX_OUTPUT_BYTES_PER_ATTEMPT as usize) * 2);
        assert!(got.last().unwrap().1.contains("were dropped"));
        assert!(
            got.iter()
                .all(|(_, t)| t.len() <= MAX_LINE_BYTES + 10 || t.contains("dropped"))
        );
    }
}
