//! Helpers shared by the supervisor tests: body builders, a runtime with the
//! shared compilation cache, an event recorder that tests synchronise on, and
//! a guard that turns a hang into a failure with a message.

#![allow(dead_code)]

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use taskhost::runtime::{Plugin, Runtime, RuntimeConfig, Sandbox};
use taskhost::supervisor::{
    Event, EventKind, EventStream, NativeContext, PluginBody, Received, Supervisor,
    SupervisorConfig, TaskBody, TaskError, native,
};

/// Milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Fails the test with `what` if `fut` does not finish within `limit`. On a
/// paused clock this only fires when everything is blocked, that is, on a
/// hang.
pub async fn within<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: not done within {limit:?}"),
    }
}

/// The most a plugin test waits for anything before it calls it a hang.
pub const WASM_LIMIT: Duration = Duration::from_secs(30);
/// The same for native tests (virtual time on a paused clock).
pub const NATIVE_LIMIT: Duration = Duration::from_secs(600);

/// A supervisor with default limits and `grace`.
pub fn supervisor_with_grace(grace: Duration) -> Supervisor {
    Supervisor::new(SupervisorConfig {
        grace,
        ..SupervisorConfig::default()
    })
}

/// A native body.
pub fn body<F, Fut>(f: F) -> TaskBody
where
    F: Fn(NativeContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<u8>, TaskError>> + Send + 'static,
{
    TaskBody::Native(native(f))
}

/// A native body that returns `output` at once.
pub fn returns(output: &'static [u8]) -> TaskBody {
    body(move |_| async move { Ok(output.to_vec()) })
}

/// A cooperative native body that runs until it is asked to stop, then
/// returns canceled.
pub fn until_canceled() -> TaskBody {
    body(|ctx| async move {
        ctx.cancel.cancelled().await;
        Err(TaskError::Canceled)
    })
}

/// A native body that ignores stop requests and never returns.
pub fn stubborn() -> TaskBody {
    body(|_| std::future::pending())
}

/// A native body that sleeps `d` (on the Tokio clock), then returns `ok`.
pub fn sleeps(d: Duration) -> TaskBody {
    body(move |_| async move {
        tokio::time::sleep(d).await;
        Ok(b"ok".to_vec())
    })
}

/// One runtime per test, with the compilation cache shared by all tests.
pub fn runtime() -> Arc<Runtime> {
    let config = RuntimeConfig {
        cache_dir: Some(Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasmtime-cache")),
        ..RuntimeConfig::default()
    };
    Arc::new(Runtime::new(&config).expect("the runtime starts"))
}

/// A plugin built from `plugins/`.
pub async fn load(runtime: &Runtime, name: &str) -> Arc<Plugin> {
    runtime
        .load_file(&plugin_artifacts::path(name))
        .await
        .unwrap_or_else(|e| panic!("plugin {name} loads: {e}"))
}

/// A plugin body with these params and input, default sandbox, no sink.
pub fn plugin_body(
    runtime: &Arc<Runtime>,
    plugin: &Arc<Plugin>,
    params: &[(&str, &str)],
    input: &[u8],
) -> TaskBody {
    TaskBody::Plugin(PluginBody {
        runtime: Arc::clone(runtime),
        plugin: Arc::clone(plugin),
        input: Arc::from(input),
        params: params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        sandbox: Arc::new(Sandbox::default()),
        sink: None,
    })
}

/// Guest output kinds, left out when sequences are compared.
pub fn is_guest_output(kind: EventKind) -> bool {
    matches!(kind, EventKind::GuestLog | EventKind::Progress)
}

/// Records every event of one lane and lets a test wait for the one it
/// needs. A lane that reports dropped events fails the test: exact
/// sequences need every event (the default bus holds 4096 per lane).
pub struct Recorder {
    stream: EventStream,
    limit: Duration,
    /// Every event seen so far, in seq order.
    pub seen: Vec<Arc<Event>>,
}

impl Recorder {
    /// Subscribes now: call before adding the tasks of interest.
    pub fn new(sup: &Supervisor, limit: Duration) -> Self {
        Self {
            stream: sup.subscribe(),
            limit,
            seen: Vec::new(),
        }
    }

    /// Reads until an event matching `pred` arrives and returns it.
    pub async fn until(&mut self, mut pred: impl FnMut(&Event) -> bool) -> Arc<Event> {
        let limit = self.limit;
        let seen = &mut self.seen;
        let stream = &mut self.stream;
        within(limit, "waiting for an event", async move {
            loop {
                match stream.recv().await {
                    Some(Received::Event(event)) => {
                        seen.push(Arc::clone(&event));
                        if pred(&event) {
                            return event;
                        }
                    }
                    Some(Received::Dropped(n)) => {
                        panic!("the test's event lane dropped {n} events")
                    }
                    None => panic!("the bus closed before the awaited event"),
                }
            }
        })
        .await
    }

    /// The first event of `kind` for task `id`, reading until it arrives
    /// if it has not been read yet.
    pub async fn until_kind(&mut self, id: u64, kind: EventKind) -> Arc<Event> {
        let matches = |e: &Event| e.task_id == Some(id) && e.kind == kind;
        if let Some(event) = self.seen.iter().find(|e| matches(e)) {
            return Arc::clone(event);
        }
        self.until(matches).await
    }

    /// Reads until at least `n` events of `kind` for task `id` have been
    /// seen (counting those already read).
    pub async fn until_count(&mut self, id: u64, kind: EventKind, n: usize) {
        let mut have = self
            .seen
            .iter()
            .filter(|e| e.task_id == Some(id) && e.kind == kind)
            .count();
        if have >= n {
            return;
        }
        self.until(|e| {
            if e.task_id == Some(id) && e.kind == kind {
                have += 1;
            }
            have >= n
        })
        .await;
    }

    /// Reads until task `id` is removed (its last event).
    pub async fn until_removed(&mut self, id: u64) -> Arc<Event> {
        self.until_kind(id, EventKind::TaskRemoved).await
    }

    /// Reads until the bus closes (after shutdown).
    pub async fn until_closed(&mut self) {
        let limit = self.limit;
        let seen = &mut self.seen;
        let stream = &mut self.stream;
        within(limit, "waiting for the bus to close", async move {
            while let Some(received) = stream.recv().await {
                match received {
                    Received::Event(event) => seen.push(event),
                    Received::Dropped(n) => panic!("the test's event lane dropped {n} events"),
                }
            }
        })
        .await;
    }

    /// The events of task `id`, without guest output.
    pub fn of(&self, id: u64) -> Vec<Arc<Event>> {
        self.seen
            .iter()
            .filter(|e| e.task_id == Some(id) && !is_guest_output(e.kind))
            .cloned()
            .collect()
    }

    /// The event kinds of task `id`, without guest output.
    pub fn kinds(&self, id: u64) -> Vec<EventKind> {
        self.of(id).iter().map(|e| e.kind).collect()
    }

    /// The events of task `id` of one kind.
    pub fn of_kind(&self, id: u64, kind: EventKind) -> Vec<Arc<Event>> {
        self.of(id).into_iter().filter(|e| e.kind == kind).collect()
    }

    /// Every event of `kind`, of any task.
    pub fn all_of_kind(&self, kind: EventKind) -> Vec<Arc<Event>> {
        self.seen
            .iter()
            .filter(|e| e.kind == kind)
            .cloned()
            .collect()
    }
}
