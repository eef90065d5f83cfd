//! Owns the registry of the listener's open connections and the choice of
//! the one to close when a new connection finds every place taken.
//!
//! A connection *serves* while a request with a valid token is under way:
//! from the moment the request passed the token check (`conn::serving`)
//! until its answer has been written out; an upgraded connection
//! (`/api/wire`) serves for good. A long poll, an event stream or an
//! upload is never closed to make room. Any other connection is *idle*:
//! from its accept (through its TLS handshake and a head sent slowly or not
//! at all), between requests (keep-alive), and while answering a request
//! without a valid token (401, the dashboard page: answered at once, so
//! only a client that does not read its answers keeps them under way). At
//! the cap the accept loop closes the connection idle the longest
//! ([`Registry::close_longest_idle`]): a flood of connections that send
//! nothing, or that pipeline requests without a token and read nothing,
//! costs each of them its place in turn, never a client's request.
//!
//! "Written out" is when the connection's writer reports a successful
//! flush after the answer's body ended (hyper flushes its buffer through
//! the stream, then flushes the stream), so closing an idle connection
//! never cuts an answer to a token's request short.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// The open connections of one listener.
#[derive(Debug, Default)]
pub(super) struct Registry {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The next connection's id.
    next_id: u64,
    /// The next idle turn; a lower turn has been idle longer.
    next_turn: u64,
    states: HashMap<u64, State, foldhash::fast::RandomState>,
    /// The idle connections by turn.
    idle: BTreeMap<u64, Idle>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Serving no request with a valid token since `turn`.
    Idle { turn: u64 },
    /// A request with a valid token is under way; its answer is not out
    /// yet.
    Serving,
    /// Upgraded to another protocol: never idle again.
    Upgraded,
    /// Chosen to make room: it is being closed.
    Closing,
}

/// An idle connection: its id, and how to close it.
#[derive(Debug)]
struct Idle {
    id: u64,
    close: CancellationToken,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a connection just accepted, idle; dropping the returned
    /// place (when its task ends) removes it.
    pub(super) fn admit(self: &Arc<Self>) -> Place {
        let close = CancellationToken::new();
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        let turn = inner.take_turn();
        inner.states.insert(id, State::Idle { turn });
        inner.idle.insert(
            turn,
            Idle {
                id,
                close: close.clone(),
            },
        );
        drop(inner);
        Place(Arc::new(Shared {
            registry: Arc::clone(self),
            id,
            close,
            answered: AtomicBool::new(false),
        }))
    }

    /// Closes the connection idle the longest, if any is idle: its place
    /// comes back as soon as its task sees it (at once). `false`: every
    /// open connection is serving.
    pub(super) fn close_longest_idle(&self) -> bool {
        let mut inner = self.lock();
        let Some((_, idle)) = inner.idle.pop_first() else {
            return false;
        };
        inner.states.insert(idle.id, State::Closing);
        drop(inner);
        idle.close.cancel();
        true
    }

    /// How many open connections are idle, and how many serve.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.idle.len(), inner.states.len() - inner.idle.len())
    }
}

impl Inner {
    fn take_turn(&mut self) -> u64 {
        let turn = self.next_turn;
        self.next_turn += 1;
        turn
    }

    /// Takes `id` out of the idle ones (when it is idle) and sets `to`;
    /// `false` when it is closing (or gone).
    fn set(&mut self, id: u64, to: State) -> bool {
        let Some(state) = self.states.get_mut(&id) else {
            return false;
        };
        match *state {
            State::Closing => return false,
            State::Idle { turn } => {
                self.idle.remove(&turn);
            }
            State::Serving | State::Upgraded => {}
        }
        *state = to;
        true
    }
}

/// What a connection's task, its service and its stream share.
#[derive(Debug)]
struct Shared {
    registry: Arc<Registry>,
    id: u64,
    /// Cancelled when the registry closes it to make room.
    close: CancellationToken,
    /// The current answer's body has ended: the next successful flush
    /// makes the connection idle.
    answered: AtomicBool,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let mut inner = self.registry.lock();
        if let Some(State::Idle { turn }) = inner.states.remove(&self.id) {
            inner.idle.remove(&turn);
        }
    }
}

/// One open connection's entry in the registry; cloned into its service
/// and its stream, removed when the last clone is dropped.
#[derive(Debug, Clone)]
pub(super) struct Place(Arc<Shared>);

impl Place {
    /// Completes when the registry closes this connection to make room.
    pub(super) fn closed(&self) -> WaitForCancellationFuture<'_> {
        self.0.close.cancelled()
    }

    /// A request with a valid token is to be served: the connection serves
    /// until the returned guard says its answer has ended. `None` when it
    /// is being closed to make room (the request is not to be served).
    pub(super) fn serve(&self) -> Option<Serving> {
        self.0.answered.store(false, Ordering::Release);
        let mut inner = self.0.registry.lock();
        inner
            .set(self.0.id, State::Serving)
            .then(|| Serving(Some(Arc::clone(&self.0))))
    }

    /// Wraps the connection's stream, whose flushes end the serving.
    pub(super) fn watch<S>(&self, stream: S) -> Watched<S> {
        Watched {
            stream,
            place: self.clone(),
        }
    }

    /// The stream has flushed everything it was given.
    fn flushed(&self) {
        if !self.0.answered.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut inner = self.0.registry.lock();
        if inner.states.get(&self.0.id) == Some(&State::Serving) {
            let turn = inner.take_turn();
            inner.set(self.0.id, State::Idle { turn });
            inner.idle.insert(
                turn,
                Idle {
                    id: self.0.id,
                    close: self.0.close.clone(),
                },
            );
        }
    }
}

/// Held while a request is served: dropped with the answer's body (after
/// its last byte was handed to hyper), it lets the next flush make the
/// connection idle.
#[derive(Debug)]
pub(super) struct Serving(Option<Arc<Shared>>);

impl Serving {
    /// The connection is upgraded (`101`): it serves for good.
    pub(super) fn upgraded(mut self) {
        if let Some(shared) = self.0.take() {
            shared.registry.lock().set(shared.id, State::Upgraded);
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        if let Some(shared) = &self.0 {
            shared.answered.store(true, Ordering::Release);
        }
    }
}

/// A connection's stream, telling its place when a flush went through.
#[derive(Debug)]
pub(super) struct Watched<S> {
    stream: S,
    place: Place,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let flushed = Pin::new(&mut self.stream).poll_flush(cx);
        if let Poll::Ready(Ok(())) = flushed {
            self.place.flushed();
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flush(place: &Place) {
        place.flushed();
    }

    #[test]
    fn the_connection_idle_the_longest_is_closed_first() {
        let registry = Arc::new(Registry::default());
        let first = registry.admit();
        let second = registry.admit();
        let third = registry.admit();
        assert!(registry.close_longest_idle());
        assert!(first.0.close.is_cancelled());
        assert!(!second.0.close.is_cancelled());
        // A request on the closing one is not served.
        assert!(first.serve().is_none());
        // The second serves; the third is idle the longest now.
        let serving = second.serve().expect("idle");
        assert_eq!(registry.counts(), (1, 2));
        assert!(registry.close_longest_idle());
        assert!(third.0.close.is_cancelled());
        // Nothing idle is left: the serving one is never chosen.
        assert!(!registry.close_longest_idle());
        assert!(!second.0.close.is_cancelled());
        drop(serving);
        drop((first, third));
        assert_eq!(registry.counts(), (0, 1));
    }

    #[test]
    fn an_answer_makes_its_connection_idle_only_once_flushed() {
        let registry = Arc::new(Registry::default());
        let kept = registry.admit();
        let serving = kept.serve().expect("idle");
        // A flush during the answer changes nothing.
        flush(&kept);
        assert!(!registry.close_longest_idle());
        // The body ended, but its bytes are not out yet.
        drop(serving);
        assert!(!registry.close_longest_idle());
        // Out: idle again, newest of the idle.
        let fresh = registry.admit();
        flush(&kept);
        assert_eq!(registry.counts(), (2, 0));
        assert!(registry.close_longest_idle());
        assert!(fresh.0.close.is_cancelled());
        assert!(!kept.0.close.is_cancelled());
        assert!(registry.close_longest_idle());
        assert!(kept.0.close.is_cancelled());
    }

    #[test]
    fn an_upgraded_connection_and_a_dropped_one_are_never_chosen() {
        let registry = Arc::new(Registry::default());
        let wire = registry.admit();
        wire.serve().expect("idle").upgraded();
        flush(&wire);
        let gone = registry.admit();
        drop(gone);
        assert_eq!(registry.counts(), (0, 1));
        assert!(!registry.close_longest_idle());
        assert!(!wire.0.close.is_cancelled());
        drop(wire);
        assert_eq!(registry.counts(), (0, 0));
    }
}
