//! Owns `/metrics`: the Prometheus (OpenMetrics) text exposition of the
//! daemon. Counters come from one lane of the supervisor's event bus, read
//! by a task of its own, so publishing gains no lock and no work; gauges
//! (tasks by state, slots, queues, permits, the plugin cache) are read from
//! the daemon's state at scrape time; the runtime's and the store's
//! histograms are their own lock-free counts (`taskhost_core::stats`); process
//! metrics come from `/proc/self`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use taskhost_core::controller::{SlotState, SlotView};
use taskhost_core::lifecycle::TaskState;
use taskhost_core::outcome::{OutcomeKind, RejectionKind};
use taskhost_core::stats::{
    DELAYS_DUE, DUE_TO_START, DurationHistogram, HistogramSnapshot, SCHEDULE_LATENESS,
    STORE_COMMITS,
};
use taskhost_core::supervisor::{EventKind, EventStream, Received};
use taskhost_runtime::Allocator;

use super::Http;
use super::slot_metrics::{self, PerSlot, SUPERSEDED, THROTTLED};
use crate::backend::daemon::Daemon;

/// Slots whose queue depth is shown one by one (the deepest), so a host
/// with many slots keeps a bounded number of series.
pub const TOP_SLOTS: usize = 10;

const REJECTIONS: [RejectionKind; 9] = [
    RejectionKind::AlreadyExists,
    RejectionKind::BatchRejected,
    RejectionKind::SlotBusy,
    RejectionKind::QueueFull,
    RejectionKind::SupersededByReplace,
    RejectionKind::RemovedFromQueue,
    RejectionKind::ShuttingDown,
    RejectionKind::AdmissionFailed,
    RejectionKind::ResourceLimit,
];

const OUTCOMES: [OutcomeKind; 7] = [
    OutcomeKind::Completed,
    OutcomeKind::Failed,
    OutcomeKind::Fatal,
    OutcomeKind::Canceled,
    OutcomeKind::ForceAborted,
    OutcomeKind::Panicked,
    OutcomeKind::Rejected,
];

const ATTEMPT_RESULTS: [&str; 4] = ["succeeded", "failed", "timed-out", "canceled"];

fn rejection_index(kind: RejectionKind) -> usize {
    match kind {
        RejectionKind::AlreadyExists => 0,
        RejectionKind::BatchRejected => 1,
        RejectionKind::SlotBusy => 2,
        RejectionKind::QueueFull => 3,
        RejectionKind::SupersededByReplace => 4,
        RejectionKind::RemovedFromQueue => 5,
        RejectionKind::ShuttingDown => 6,
        RejectionKind::AdmissionFailed => 7,
        RejectionKind::ResourceLimit => 8,
    }
}

fn outcome_index(kind: OutcomeKind) -> usize {
    match kind {
        OutcomeKind::Completed => 0,
        OutcomeKind::Failed => 1,
        OutcomeKind::Fatal => 2,
        OutcomeKind::Canceled => 3,
        OutcomeKind::ForceAborted => 4,
        OutcomeKind::Panicked => 5,
        OutcomeKind::Rejected => 6,
    }
}

/// The counters derived from the event bus.
#[derive(Debug, Default)]
pub(super) struct Metrics {
    events: AtomicU64,
    submissions: AtomicU64,
    rejections: [AtomicU64; 9],
    outcomes: [AtomicU64; 7],
    attempts: [AtomicU64; 4],
    attempt_duration: DurationHistogram,
    force_aborts: AtomicU64,
    recovered: AtomicU64,
    /// Events this lane lost (it fell behind the bus).
    dropped_metrics: AtomicU64,
    /// Events subscriber lanes reported lost (`SubscriberOverflow`).
    dropped_subscribers: AtomicU64,
    /// Events lost by readers of `/api/events`.
    dropped_http: AtomicU64,
    /// Per slot: attempts throttled by its rate, and submissions
    /// superseded.
    per_slot: PerSlot,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Metrics {
    /// Starts counting the daemon's events.
    pub(super) fn start(daemon: &Daemon) -> Arc<Self> {
        let metrics = Arc::new(Self::default());
        let lane = daemon.controller.supervisor().subscribe();
        tokio::spawn(Arc::clone(&metrics).count(lane));
        metrics
    }

    async fn count(self: Arc<Self>, mut lane: EventStream) {
        while let Some(received) = lane.recv().await {
            let event = match received {
                Received::Event(event) => event,
                Received::Dropped(n) => {
                    add(&self.dropped_metrics, n);
                    continue;
                }
            };
            add(&self.events, 1);
            let attempt = |i: usize| {
                add(&self.attempts[i], 1);
                if let Some(ms) = event.duration_ms {
                    self.attempt_duration
                        .observe(std::time::Duration::from_millis(ms));
                }
            };
            match event.kind {
                EventKind::ControllerSubmitted => add(&self.submissions, 1),
                EventKind::ControllerRejected | EventKind::TaskAddFailed => {
                    if let Some(kind) = event.rejection {
                        add(&self.rejections[rejection_index(kind)], 1);
                        if kind == RejectionKind::SupersededByReplace {
                            self.per_slot.count(event.slot.as_ref(), SUPERSEDED);
                        }
                    }
                    add(&self.outcomes[outcome_index(OutcomeKind::Rejected)], 1);
                }
                EventKind::TaskFinished => {
                    if let Some(kind) = event.outcome {
                        add(&self.outcomes[outcome_index(kind)], 1);
                        if kind == OutcomeKind::ForceAborted {
                            add(&self.force_aborts, 1);
                        }
                    }
                }
                EventKind::AttemptThrottled => {
                    self.per_slot.count(event.slot.as_ref(), THROTTLED);
                }
                EventKind::AttemptSucceeded => attempt(0),
                EventKind::AttemptFailed => attempt(1),
                EventKind::AttemptTimedOut => attempt(2),
                EventKind::AttemptCanceled => attempt(3),
                EventKind::SubscriberOverflow => {
                    add(&self.dropped_subscribers, event.dropped.unwrap_or(0));
                }
                EventKind::Recovered => add(&self.recovered, 1),
                _ => {}
            }
        }
    }

    /// Counts events an `/api/events` reader lost.
    pub(super) fn lane_dropped(&self, n: u64) {
        add(&self.dropped_http, n);
    }
}

/// `GET /metrics`.
pub(super) async fn scrape(State(http): State<Http>) -> Response {
    let scrape = Scrape {
        daemon: Arc::clone(&http.daemon),
        metrics: Arc::clone(&http.metrics),
    };
    let text = tokio::task::spawn_blocking(move || {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(scrape));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).map(|()| text)
    })
    .await;
    match text {
        Ok(Ok(text)) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot encode the metrics",
        )
            .into_response(),
    }
}

/// One scrape: reads the daemon's state while it encodes.
struct Scrape {
    daemon: Arc<Daemon>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scrape")
    }
}

pub(super) type Out = Result<(), std::fmt::Error>;

fn counter(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: u64) -> Out {
    let c = ConstCounter::new(value);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: i64) -> Out {
    let g = ConstGauge::new(value);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

/// A metric with one label, one series per `(label value, value)`; a
/// namespaced slot's label is `namespace/slot`.
pub(super) fn labeled(
    enc: &mut DescriptorEncoder<'_>,
    kind: MetricType,
    name: &str,
    help: &str,
    label: &str,
    series: &[(String, u64)],
) -> Out {
    let mut family = enc.encode_descriptor(name, help, None, kind)?;
    for (value, n) in series {
        let value = value.replace(crate::service::namespace::SEP, "/");
        let labels = [(label, escape(&value))];
        let metric = family.encode_family(&labels)?;
        match kind {
            MetricType::Counter => ConstCounter::new(*n).encode(metric)?,
            _ => ConstGauge::new(i64::try_from(*n).unwrap_or(i64::MAX)).encode(metric)?,
        }
    }
    Ok(())
}

fn histogram(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    h: &HistogramSnapshot,
) -> Out {
    let mut metric =
        enc.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
    metric.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)
}

/// A label value in the text format's escaping (the encoder writes values
/// as they are, and slot names are the users').
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn loaded(counters: &[AtomicU64], names: impl Iterator<Item = String>) -> Vec<(String, u64)> {
    names
        .zip(counters)
        .map(|(name, c)| (name, c.load(Ordering::Relaxed)))
        .collect()
}

impl Collector for Scrape {
    /// The families in the order of the exposition: the process's, the
    /// event bus's counters, tasks and slots now, permits, plugins, time,
    /// the store.
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Out {
        let d = &self.daemon;
        process(&mut enc)?;
        events(&mut enc, &self.metrics)?;
        tasks_and_slots(&mut enc, d)?;
        permits(&mut enc, d)?;
        plugins(&mut enc, d)?;
        time(&mut enc, d)?;
        if d.local_store().is_some_and(|s| s.is_durable()) {
            histogram(
                &mut enc,
                "taskhost_store_commit",
                "How long the store's transactions took to commit (one per batch of writes).",
                &STORE_COMMITS.snapshot(),
            )?;
        }
        Ok(())
    }
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// The counters of the event bus (see [`Metrics`]).
fn events(enc: &mut DescriptorEncoder<'_>, m: &Metrics) -> Out {
    counter(
        enc,
        "taskhost_events",
        "Events the supervisor published (seen by the metrics lane).",
        get(&m.events),
    )?;
    counter(
        enc,
        "taskhost_submissions",
        "Submissions the controller took in (before any rejection).",
        get(&m.submissions),
    )?;
    labeled(
        enc,
        MetricType::Counter,
        "taskhost_rejections",
        "Submissions rejected, by rejection kind.",
        "kind",
        &loaded(&m.rejections, REJECTIONS.iter().map(|k| k.to_string())),
    )?;
    labeled(
        enc,
        MetricType::Counter,
        "taskhost_outcomes",
        "Final outcomes, one per submission, by kind.",
        "outcome",
        &loaded(&m.outcomes, OUTCOMES.iter().map(|k| k.as_str().to_owned())),
    )?;
    labeled(
        enc,
        MetricType::Counter,
        "taskhost_attempts",
        "Attempts ended, by result.",
        "result",
        &loaded(&m.attempts, ATTEMPT_RESULTS.iter().map(|r| (*r).to_owned())),
    )?;
    histogram(
        enc,
        "taskhost_attempt_duration",
        "How long attempts ran (succeeded, failed, timed out).",
        &m.attempt_duration.snapshot(),
    )?;
    counter(
        enc,
        "taskhost_force_aborts",
        "Tasks stopped by force after their grace.",
        get(&m.force_aborts),
    )?;
    counter(
        enc,
        "taskhost_recovered",
        "Unfinished tasks found in the store at start.",
        get(&m.recovered),
    )?;
    m.per_slot.encode(enc)?;
    labeled(
        enc,
        MetricType::Counter,
        "taskhost_event_drops",
        "Events a reader lost because it fell behind the bus, by reader.",
        "reader",
        &[
            ("metrics".to_owned(), get(&m.dropped_metrics)),
            ("subscribers".to_owned(), get(&m.dropped_subscribers)),
            ("http".to_owned(), get(&m.dropped_http)),
        ],
    )?;
    Ok(())
}

/// Live tasks by state and the controller's slots and queues, read now.
fn tasks_and_slots(enc: &mut DescriptorEncoder<'_>, d: &Daemon) -> Out {
    let supervisor = d.controller.supervisor();
    let mut phases = [0u64; 6];
    let tasks = supervisor.list();
    for task in &tasks {
        phases[match task.phase {
            TaskState::Waiting => 0,
            TaskState::Running => 1,
            TaskState::BackingOff => 2,
            TaskState::Stopping => 3,
            TaskState::Throttled => 5,
            _ => 4,
        }] += 1;
    }
    let slots = d.controller.snapshot();
    super::namespaces::metrics(enc, d, &tasks, &slots)?;
    let queued: usize = slots.iter().map(|s| s.queue_depth).sum();
    let mut by_state: Vec<(String, u64)> = [
        "queued",
        "waiting",
        "running",
        "backing-off",
        "stopping",
        "finishing",
        "throttled",
    ]
    .iter()
    .map(|s| ((*s).to_owned(), 0))
    .collect();
    by_state[0].1 = queued as u64;
    for (i, n) in phases.iter().enumerate() {
        by_state[i + 1].1 = *n;
    }
    labeled(
        enc,
        MetricType::Gauge,
        "taskhost_tasks",
        "Live tasks by state (as `host ps` shows them).",
        "state",
        &by_state,
    )?;
    let mut slot_states = [0u64; 4];
    for s in &slots {
        slot_states[match s.state {
            SlotState::Idle => 0,
            SlotState::Admitting => 1,
            SlotState::Running => 2,
            SlotState::Terminating => 3,
        }] += 1;
    }
    labeled(
        enc,
        MetricType::Gauge,
        "taskhost_slots",
        "Slots the controller holds, by state.",
        "state",
        &[
            SlotState::Idle,
            SlotState::Admitting,
            SlotState::Running,
            SlotState::Terminating,
        ]
        .iter()
        .zip(slot_states)
        .map(|(s, n)| (s.as_str().to_owned(), n))
        .collect::<Vec<_>>(),
    )?;
    let mut deepest: Vec<_> = slots.iter().filter(|s| s.queue_depth > 0).collect();
    deepest.sort_by(|a, b| {
        b.queue_depth
            .cmp(&a.queue_depth)
            .then_with(|| a.key.cmp(&b.key))
    });
    deepest.truncate(TOP_SLOTS);
    labeled(
        enc,
        MetricType::Gauge,
        "taskhost_slot_queue_depth",
        "Submissions queued behind a slot's owner, for the deepest queues only (see taskhost_queued_submissions for all).",
        "slot",
        &deepest
            .iter()
            .map(|s| (s.key.clone(), s.queue_depth as u64))
            .collect::<Vec<_>>(),
    )?;
    // Slots that may hold more than one owner, the fullest first.
    let mut shared: Vec<_> = slots.iter().filter(|s| s.capacity > 1).collect();
    shared.sort_by(|a, b| {
        b.owners
            .len()
            .cmp(&a.owners.len())
            .then_with(|| a.key.cmp(&b.key))
    });
    shared.truncate(TOP_SLOTS);
    let of_shared = |value: fn(&SlotView) -> usize| {
        shared
            .iter()
            .map(|s| (s.key.clone(), value(s) as u64))
            .collect::<Vec<_>>()
    };
    labeled(
        enc,
        MetricType::Gauge,
        "taskhost_slot_owners",
        "Owners of the slots whose rule lets them hold more than one (the fullest only).",
        "slot",
        &of_shared(|s| s.owners.len()),
    )?;
    labeled(
        enc,
        MetricType::Gauge,
        "taskhost_slot_capacity",
        "The capacity of the same slots as taskhost_slot_owners (host slot set --capacity).",
        "slot",
        &of_shared(|s| s.capacity),
    )?;
    slot_metrics::rates(enc, d, &tasks)?;
    gauge(
        enc,
        "taskhost_queued_submissions",
        "Submissions queued over all slots.",
        queued as i64,
    )?;
    if d.cluster().is_none() {
        gauge(
            enc,
            "taskhost_delayed_submissions",
            "Delayed submissions waiting for their time (--delay, --at).",
            d.controller.delayed_count() as i64,
        )?;
    }
    Ok(())
}

/// The attempt permits: how many, how many held, and the parked attempts
/// that hold an instance but no permit.
fn permits(enc: &mut DescriptorEncoder<'_>, d: &Daemon) -> Out {
    let supervisor = d.controller.supervisor();
    if let Some(max) = supervisor.max_concurrent() {
        let free = supervisor.free_permits().unwrap_or(max);
        gauge(
            enc,
            "taskhost_attempt_permits",
            "Attempts that may run at once (--max-concurrent, capped by the instance pool).",
            max as i64,
        )?;
        gauge(
            enc,
            "taskhost_attempt_permits_in_use",
            "Permits held by running attempts (each holds an instance of the pool).",
            max.saturating_sub(free) as i64,
        )?;
        gauge(
            enc,
            "taskhost_attempts_parked",
            "Attempts parked while their guest waits for a child: each holds an instance \
             of the pool but no permit (at most --max-parked parents).",
            supervisor.parked() as i64,
        )?;
    }
    Ok(())
}

/// The instance pool and the compiled plugins' cache.
fn plugins(enc: &mut DescriptorEncoder<'_>, d: &Daemon) -> Out {
    let runtime = d.plugins.runtime();
    if let Allocator::Pooling { instances, .. } = runtime.allocator() {
        gauge(
            enc,
            "taskhost_pool_instances",
            "Instance slots of the pooling allocator.",
            i64::from(instances),
        )?;
    }
    gauge(
        enc,
        "taskhost_plugin_cache_bytes",
        "Compiled plugins kept in memory, by component size.",
        runtime.cached_bytes() as i64,
    )?;
    gauge(
        enc,
        "taskhost_plugin_cache_limit_bytes",
        "The plugin cache's bound (--plugin-cache).",
        d.config.plugin_cache as i64,
    )?;
    let stats = runtime.stats();
    counter(
        enc,
        "taskhost_plugin_cache_hits",
        "Plugin loads and lookups served from the cache.",
        get(&stats.cache_hits),
    )?;
    counter(
        enc,
        "taskhost_plugin_cache_misses",
        "Plugin loads that compiled (first use, or after an eviction).",
        get(&stats.cache_misses),
    )?;
    histogram(
        enc,
        "taskhost_plugin_compile",
        "How long a plugin's compile (with describe) took.",
        &stats.compile_time.snapshot(),
    )?;
    Ok(())
}

/// Time: schedules, delayed submissions, due -> start.
fn time(enc: &mut DescriptorEncoder<'_>, d: &Daemon) -> Out {
    use crate::backend::schedules::{FIRED, PASSED};
    let kinds = ["on-time", "catch-up", "run"].map(str::to_owned);
    labeled(
        enc,
        MetricType::Counter,
        "taskhost_schedule_firings",
        "Schedule firings by kind: on time, catch-up (for firings missed while down or paused), run (by request).",
        "kind",
        &loaded(&FIRED, kinds.into_iter()),
    )?;
    counter(
        enc,
        "taskhost_schedule_passed",
        "Due times of schedules that got no firing of their own: skipped (--missed skip), or folded into one firing.",
        get(&PASSED),
    )?;
    if d.cluster().is_none() {
        gauge(
            enc,
            "taskhost_schedules",
            "Schedules this daemon holds.",
            d.one_host().map_or(0, |host| host.schedules.len()) as i64,
        )?;
    }
    histogram(
        enc,
        "taskhost_schedule_lateness",
        "How late schedules fired after their due times.",
        &SCHEDULE_LATENESS.snapshot(),
    )?;
    histogram(
        enc,
        "taskhost_delay_lateness",
        "How late delayed submissions entered their slots after their due times (its count: delays that came due).",
        &DELAYS_DUE.snapshot(),
    )?;
    histogram(
        enc,
        "taskhost_due_to_start",
        "From a task's due time (a delayed submission's, a schedule firing's) to its first attempt's start.",
        &DUE_TO_START.snapshot(),
    )?;
    Ok(())
}

/// The standard process metrics, from `/proc/self`.
fn process(enc: &mut DescriptorEncoder<'_>) -> Out {
    // The kernel reports times in USER_HZ, which is 100 on Linux.
    const TICKS: f64 = 100.0;
    if let Some(stat) = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name, which may hold spaces.
            let rest = s.rsplit_once(')')?.1.to_owned();
            Some(
                rest.split_whitespace()
                    .map(str::to_owned)
                    .collect::<Vec<_>>(),
            )
        })
    {
        // `rest` starts at field 3 (state): field N is rest[N - 3].
        let field = |n: usize| {
            stat.get(n - 3)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let cpu = (field(14) + field(15)) as f64 / TICKS;
        let c = ConstCounter::new(cpu);
        c.encode(enc.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds.",
            None,
            c.metric_type(),
        )?)?;
        // Resident size from `status` (kB), not `stat` (pages of a size
        // this code would have to guess).
        let rss_kib = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
            });
        if let Some(kib) = rss_kib {
            gauge(
                enc,
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                kib * 1024,
            )?;
        }
        gauge(
            enc,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            field(23) as i64,
        )?;
        gauge(
            enc,
            "process_threads",
            "OS threads in the process.",
            field(20) as i64,
        )?;
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
        });
        if let Some(boot) = boot {
            let start = boot as f64 + field(22) as f64 / TICKS;
            let g = ConstGauge::new(start);
            g.encode(enc.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds.",
                None,
                g.metric_type(),
            )?)?;
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        gauge(
            enc,
            "process_open_fds",
            "Open file descriptors.",
            fds.count() as i64,
        )?;
    }
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3)?.parse::<i64>().ok())
        });
    if let Some(max) = max_fds {
        gauge(
            enc,
            "process_max_fds",
            "The limit of open file descriptors.",
            max,
        )?;
    }
    Ok(())
}
