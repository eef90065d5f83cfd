//! The helpers of the cluster tests: a node served in this process on a
//! runtime of its own ([`Node`]), what it logs ([`Logs`]), the cluster's
//! event stream as one node shows it ([`Events`]), the attempts the
//! database recorded, and a partition between a node and the database
//! (`Partition`, from `tests/e2e/common/partition.rs`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use taskhost_core::supervisor::{Event, TaskRef, TaskReport};
use taskhost_daemon::protocol::{EventFilter, Reply, Request, SubmitRequest};
use taskhost_daemon::{Client, ClusterSettings, DaemonConfig, Replies};
use taskhost_runtime::Digest;

pub use crate::partition::Partition;

use crate::postgres::Postgres;

/// How long anything may take before a test gives up.
pub const LIMIT: Duration = Duration::from_secs(60);

/// A short lease, so that takeovers happen within a test's patience; a
/// node renews it every 200 ms and fences itself after 1.5 s without a
/// renewal.
pub const SHORT_LEASE: Duration = Duration::from_secs(2);

/// A lease that outlasts a loaded machine's pauses, for tests in which no
/// node may lose its work.
pub const STEADY_LEASE: Duration = Duration::from_secs(10);

/// The time now, ms since the Unix epoch (the clock the database's
/// attempt rows and the events use).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A cluster node: `taskhost_daemon::serve` on a Tokio runtime of its own,
/// its socket and state in a temporary directory.
pub struct Node {
    pub name: String,
    pub socket: PathBuf,
    /// What the node logged.
    pub logs: Logs,
    runtime: Option<tokio::runtime::Runtime>,
    _dir: tempfile::TempDir,
}

impl Node {
    /// Starts node `name` on the database at `url` with a lease of
    /// `lease`; returns once it accepts connections, and fails the test
    /// with the daemon's error if it cannot start.
    pub async fn start(url: &str, name: &str, lease: Duration) -> Node {
        Self::start_with(url, name, lease, |_| {}).await
    }

    /// Like [`Node::start`], with `settings` changed by `change`.
    pub async fn start_with(
        url: &str,
        name: &str,
        lease: Duration,
        change: impl FnOnce(&mut DaemonConfig),
    ) -> Node {
        let dir = tempfile::tempdir().expect("a temporary directory for the node");
        let socket = dir.path().join("node.sock");
        let mut config = DaemonConfig::with_state_dir(dir.path().join("state"));
        config.store = url.to_owned();
        config.cluster = ClusterSettings {
            node_name: Some(name.to_owned()),
            lease,
            renew: Duration::from_millis(200),
            poll: Duration::from_millis(200),
            notify: true,
        };
        config.grace = Duration::from_secs(5);
        config.max_concurrent = 8;
        // Instances on demand: three nodes in one process must not each
        // reserve a pool sized for the whole address space.
        config.pool_instances = Some(0);
        config.worker_threads = 2;
        change(&mut config);
        let logs = Logs::default();
        let dispatch = tracing::Dispatch::new(Collector { logs: logs.clone() });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("node-{name}"))
            .enable_all()
            .on_thread_start(move || {
                // Every thread of the node's runtime logs to the node's
                // own log, for as long as the thread lives.
                std::mem::forget(tracing::dispatcher::set_default(&dispatch));
            })
            .build()
            .expect("a runtime for the node");
        let (started, ready) = tokio::sync::oneshot::channel::<Result<(), String>>();
        let started = Arc::new(Mutex::new(Some(started)));
        let told = Arc::clone(&started);
        let tell = move |result: Result<(), String>| {
            if let Some(tx) = told.lock().unwrap_or_else(PoisonError::into_inner).take() {
                let _ = tx.send(result);
            }
        };
        let failed = tell.clone();
        let path = socket.clone();
        runtime.spawn(async move {
            let served = taskhost_daemon::serve(path, config, move || tell(Ok(()))).await;
            if let Err(err) = served {
                failed(Err(err.to_string()));
            }
        });
        match tokio::time::timeout(LIMIT, ready).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(err))) => panic!("node {name} could not start: {err}"),
            Ok(Err(_)) => panic!("node {name} stopped before it listened"),
            Err(_) => panic!("node {name} did not listen within {LIMIT:?}"),
        }
        Node {
            name: name.to_owned(),
            socket,
            logs,
            runtime: Some(runtime),
            _dir: dir,
        }
    }

    /// A new client of this node.
    pub async fn client(&self) -> Client {
        Client::connect(&self.socket)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to node {}: {e}", self.name))
    }

    /// Stops the node as a killed process stops: every task of its runtime
    /// dropped where it stands, nothing retired or handed over, its
    /// database connections closed.
    pub fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Uploads plugin `name` (from `plugins/`) to a node; its digest.
pub async fn upload(client: &Client, name: &str) -> Digest {
    let bytes = std::fs::read(plugin_artifacts::path(name)).expect("a built plugin");
    client
        .ensure_plugin(&bytes)
        .await
        .unwrap_or_else(|e| panic!("cannot upload {name}: {e}"))
}

/// The final report of task `target`, as `client` waits for it (within
/// [`LIMIT`]).
pub async fn final_report(client: &Client, target: TaskRef) -> TaskReport {
    let what = format!("{target:?}");
    tokio::time::timeout(LIMIT, client.wait(target))
        .await
        .unwrap_or_else(|_| panic!("{what} did not end within {LIMIT:?}"))
        .unwrap_or_else(|e| panic!("cannot wait for {what}: {e}"))
}

/// The `sleeper` plugin's request: `name` in `slot`, sleeping `ms`.
pub fn sleeper(plugin: Digest, name: &str, slot: &str, ms: u64) -> SubmitRequest {
    let mut request = SubmitRequest::new(plugin);
    request.name = Some(name.to_owned());
    request.slot = Some(slot.to_owned());
    request.params = vec![("ms".to_owned(), ms.to_string())];
    request
}

/// The cluster's events as one node streams them: the recent ones, then
/// each new one.
pub struct Events {
    replies: Replies,
    /// Every event seen so far.
    pub seen: Vec<Event>,
}

impl Events {
    /// Follows the events of task `name` through `client`.
    pub async fn of(client: &Client, name: &str) -> Events {
        let filter = EventFilter {
            task: Some(TaskRef::Name(name.to_owned())),
            kinds: Vec::new(),
        };
        let replies = client
            .request(Request::Events {
                follow: true,
                filter,
            })
            .await
            .expect("follow the events");
        Events {
            replies,
            seen: Vec::new(),
        }
    }

    /// The first event (seen before or coming) that `wanted` picks.
    pub async fn until(&mut self, what: &str, wanted: impl Fn(&Event) -> bool) -> Event {
        if let Some(event) = self.seen.iter().find(|e| wanted(e)) {
            return event.clone();
        }
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            let reply = tokio::time::timeout_at(deadline, self.replies.next())
                .await
                .unwrap_or_else(|_| panic!("no event {what} within {LIMIT:?}: {:?}", self.seen));
            match reply {
                Some(Reply::Event(event)) => {
                    self.seen.push(event.clone());
                    if wanted(&event) {
                        return event;
                    }
                }
                Some(Reply::Dropped(_)) => {}
                other => panic!("the event stream ended waiting for {what}: {other:?}"),
            }
        }
    }
}

/// One attempt as the database recorded it.
#[derive(Debug)]
pub struct Attempt {
    pub task: u64,
    pub node: u64,
    pub started: u64,
    pub ended: Option<u64>,
    pub result: String,
}

/// The recorded attempts of a slot, by start.
pub fn attempts(pg: &Postgres, slot: &str) -> Vec<Attempt> {
    pg.psql(&format!(
        "SELECT task_id, node, started_ms, ended_ms, coalesce(result, '') \
         FROM taskhost_attempts WHERE slot = '{slot}' ORDER BY started_ms, task_id"
    ))
    .lines()
    .map(|l| {
        let f: Vec<&str> = l.split('|').collect();
        Attempt {
            task: f[0].parse().expect("a task id"),
            node: f[1].parse().expect("a node id"),
            started: f[2].parse().expect("a start"),
            ended: f[3].parse().ok(),
            result: f[4].to_owned(),
        }
    })
    .collect()
}

/// No two recorded attempts of one slot overlap in time, and each ended.
pub fn assert_no_overlap(slot: &str, rows: &[Attempt]) {
    for pair in rows.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let ended = a
            .ended
            .unwrap_or_else(|| panic!("slot {slot}: attempt {a:?} never ended"));
        assert!(
            ended <= b.started,
            "slot {slot}: attempt {a:?} overlaps attempt {b:?} (two owners at once)"
        );
    }
}

/// One line a node logged.
#[derive(Debug, Clone)]
pub struct Line {
    /// When it was logged, ms since the Unix epoch.
    pub at_ms: u64,
    pub target: String,
    /// The message, then each field as `name=value`.
    pub text: String,
}

impl Line {
    /// The value of field `name`, as logged.
    pub fn field(&self, name: &str) -> Option<&str> {
        let start = self.text.find(&format!(" {name}="))? + name.len() + 2;
        let rest = &self.text[start..];
        Some(rest.split(' ').next().unwrap_or(rest))
    }
}

/// What one node logged (debug and above), and a wake-up for each line.
#[derive(Clone, Default)]
pub struct Logs {
    lines: Arc<Mutex<Vec<Line>>>,
    added: Arc<tokio::sync::Notify>,
}

impl Logs {
    /// The first line (logged already, or coming) that `wanted` picks.
    pub async fn until(&self, what: &str, wanted: impl Fn(&Line) -> bool) -> Line {
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            let added = self.added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            if let Some(line) = self.find(&wanted) {
                return line;
            }
            if tokio::time::timeout_at(deadline, added).await.is_err() {
                panic!("no log line {what} within {LIMIT:?}");
            }
        }
    }

    /// The first line logged so far that `wanted` picks.
    pub fn find(&self, wanted: impl Fn(&Line) -> bool) -> Option<Line> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|l| wanted(l))
            .cloned()
    }
}

/// The `tracing` subscriber of one node's threads: events into its
/// [`Logs`], spans ignored.
struct Collector {
    logs: Logs,
}

/// Writes an event's message and fields as text.
struct Text(String);

impl tracing::field::Visit for Text {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.insert_str(0, &format!("{value:?}"));
        } else {
            self.0.push_str(&format!(" {}={value:?}", field.name()));
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.0.insert_str(0, value);
        } else {
            self.0.push_str(&format!(" {}={value}", field.name()));
        }
    }
}

impl tracing::Subscriber for Collector {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::DEBUG
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::DEBUG)
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut text = Text(String::new());
        event.record(&mut text);
        let line = Line {
            at_ms: now_ms(),
            target: event.metadata().target().to_owned(),
            text: text.0,
        };
        self.logs
            .lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
        self.logs.added.notify_waiters();
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}
