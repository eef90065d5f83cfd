//! Owns one host's schedules: the table of them in memory (the store keeps
//! each one), the firing loop that sleeps until the soonest is due and
//! fires what is due, and the verbs (`add`, `ls`, `rm`, `pause`, `resume`,
//! `run`). A firing is an ordinary submission through the controller,
//! named `<schedule>-<id>`, in the schedule's slot by default, so the
//! slot's policy decides what an overlap with the last firing does; its
//! task row and the schedule's next firing are written in one commit.
//!
//! Missed firings (`schedule::decide`): the ones that passed while the
//! daemon was down are found at start, the ones that passed while a
//! schedule was paused at `resume`; `--missed once` fires one catch-up,
//! `skip` none. A running daemon that is only late fires once for every
//! due time that passed (never a burst).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use taskhost_core::outcome::OutcomeKind;
use taskhost_core::supervisor::{Event, EventKind, TaskId};

use crate::backend::OneHost;
use crate::backend::daemon::Daemon;
use crate::backend::submit::{Origin, place};
use crate::schedule::{self, CronZone, FireKind, Missed};
use crate::service::error::ServiceError;
use crate::store::{Firing, StoredSchedule, Ticket, now_ms};
use crate::wire::protocol::{NotBefore, ScheduleRow, ScheduleSpec, Submitted};

/// The longest the firing loop sleeps before it looks at the clock again
/// (a wall clock set forward is noticed within it).
const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// Firings by kind (on time, catch-up, run) and due times passed over,
/// process-wide, for `/metrics`.
pub(crate) static FIRED: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];
/// Due times skipped (`--missed skip`) or folded into one firing.
pub(crate) static PASSED: AtomicU64 = AtomicU64::new(0);

/// Counts a firing of this kind.
pub(crate) fn count_firing(kind: FireKind) {
    let i = match kind {
        FireKind::OnTime => 0,
        FireKind::CatchUp => 1,
        FireKind::Run => 2,
    };
    FIRED[i].fetch_add(1, Ordering::Relaxed);
}

type Failure = ServiceError;

/// One host's schedules.
#[derive(Default)]
pub(crate) struct Schedules {
    table: Mutex<Table>,
    /// Told when a schedule is added, resumed or removed.
    wake: Arc<Notify>,
}

type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Default)]
struct Table {
    entries: FastMap<String, Entry>,
    /// `(next_ms, name)` of every schedule that is not paused and fires
    /// again.
    due: BTreeSet<(u64, String)>,
    /// One zone per expression and zone name, shared by the schedules that
    /// have them (a burst of them due at once searches once).
    zones: FastMap<(String, Option<String>), Arc<CronZone>>,
}

struct Entry {
    spec: Arc<ScheduleSpec>,
    zone: Arc<CronZone>,
    plugin: String,
    paused: bool,
    next_ms: Option<u64>,
    last_fire_ms: Option<u64>,
    last_task: Option<TaskId>,
    created_ms: u64,
}

impl Entry {
    fn stored(&self) -> StoredSchedule {
        StoredSchedule {
            spec: ScheduleSpec::clone(&self.spec),
            plugin: self.plugin.clone(),
            paused: self.paused,
            next_ms: self.next_ms,
            last_fire_ms: self.last_fire_ms,
            last_task: self.last_task,
            created_ms: self.created_ms,
        }
    }

    fn row(&self, last_outcome: Option<OutcomeKind>) -> ScheduleRow {
        row_of(&self.stored(), self.zone.zone_name(), last_outcome)
    }
}

/// A schedule's row for `ls`.
pub(crate) fn row_of(
    s: &StoredSchedule,
    tz: &str,
    last_outcome: Option<OutcomeKind>,
) -> ScheduleRow {
    ScheduleRow {
        name: s.spec.name.clone(),
        cron: s.spec.cron.clone(),
        tz: tz.to_owned(),
        missed: s.spec.missed,
        paused: s.paused,
        plugin: s.plugin.clone(),
        digest: s.spec.request.plugin,
        slot: s.spec.request.slot.clone(),
        policy: s.spec.request.policy,
        priority: s.spec.request.priority,
        next_ms: if s.paused { None } else { s.next_ms },
        last_fire_ms: s.last_fire_ms,
        last_task: s.last_task,
        last_outcome,
        created_ms: s.created_ms,
    }
}

impl Table {
    fn put(&mut self, mut entry: Entry) {
        let key = (entry.spec.cron.clone(), entry.spec.tz.clone());
        entry.zone = Arc::clone(self.zones.entry(key).or_insert(entry.zone));
        let name = entry.spec.name.clone();
        if let Some(old) = self.entries.remove(&name)
            && let Some(next) = old.next_ms
        {
            self.due.remove(&(next, name.clone()));
        }
        if !entry.paused
            && let Some(next) = entry.next_ms
        {
            self.due.insert((next, name.clone()));
        }
        self.entries.insert(name, entry);
    }

    fn set_next(&mut self, name: &str, next_ms: Option<u64>) {
        let Some(entry) = self.entries.get_mut(name) else {
            return;
        };
        if let Some(old) = entry.next_ms {
            self.due.remove(&(old, name.to_owned()));
        }
        entry.next_ms = next_ms;
        if !entry.paused
            && let Some(next) = next_ms
        {
            self.due.insert((next, name.to_owned()));
        }
    }

    fn soonest(&self) -> Option<u64> {
        self.due.first().map(|(at, _)| *at)
    }

    /// Decides what the schedule `name`, due, does at `now` and moves its
    /// next firing on.
    fn decide(
        &mut self,
        name: &str,
        now: u64,
        missed: &dyn Fn(&Entry) -> Option<Missed>,
    ) -> Option<Due> {
        let entry = self.entries.get(name)?;
        let at = entry.next_ms?;
        let decision = schedule::decide(&entry.zone, at, now, missed(entry));
        PASSED.fetch_add(decision.passed, Ordering::Relaxed);
        let due = Due {
            name: name.to_owned(),
            spec: Arc::clone(&entry.spec),
            fire: decision.fire,
            next_ms: decision.next_ms,
            from_ms: at,
            passed: decision.passed,
        };
        self.set_next(name, decision.next_ms);
        Some(due)
    }
}

/// A firing to make: what it needs from the table, taken under its lock.
struct Due {
    name: String,
    spec: Arc<ScheduleSpec>,
    fire: Option<(u64, FireKind)>,
    next_ms: Option<u64>,
    /// The first due time it decided on, and how many it passed over.
    from_ms: u64,
    passed: u64,
}

impl crate::service::plugins::Holders for Schedules {
    /// How many schedules use each plugin.
    fn plugins(
        &self,
        only: Option<&crate::service::namespace::Ns>,
    ) -> HashMap<taskhost_runtime::Digest, u64> {
        let mut used = HashMap::new();
        let table = self.lock();
        let entries = table.entries.values();
        for entry in entries.filter(|e| only.is_none_or(|ns| ns.owns(&e.spec.name))) {
            *used.entry(entry.spec.request.plugin).or_default() += 1;
        }
        used
    }
}

impl Schedules {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many schedules there are.
    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// How many schedules' names pass `which` (a namespace's).
    pub(crate) fn count(&self, which: impl Fn(&str) -> bool) -> usize {
        self.lock()
            .entries
            .keys()
            .filter(|name| which(name))
            .count()
    }

    /// Takes every schedule due by `now` out of the due set, each with what
    /// it does (`schedule::decide`; `missed`: how the passed firings
    /// count), and moves each one's next firing on.
    fn take_due(&self, now: u64, missed: impl Fn(&Entry) -> Option<Missed>) -> Vec<Due> {
        let mut table = self.lock();
        let mut out = Vec::new();
        while let Some((at, name)) = table.due.first().cloned() {
            if at > now {
                break;
            }
            match table.decide(&name, now, &missed) {
                Some(due) => out.push(due),
                None => {
                    table.due.pop_first();
                }
            }
        }
        out
    }

    /// The soonest schedule due by `now`, decided (the running daemon's
    /// rule: late, not missed), its next firing moved on.
    fn take_next(&self, now: u64) -> Option<Due> {
        let mut table = self.lock();
        loop {
            let (at, name) = table.due.first().cloned()?;
            if at > now {
                return None;
            }
            if let Some(due) = table.decide(&name, now, &|_| None) {
                return Some(due);
            }
            table.due.pop_first();
        }
    }

    /// How many schedules are due by `now`, counted up to `most`.
    fn due_by(&self, now: u64, most: usize) -> usize {
        self.lock()
            .due
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(most)
            .count()
    }

    /// Like [`Schedules::take_due`] for one schedule.
    fn take_one(&self, name: &str, now: u64, missed: Missed) -> Option<Due> {
        let mut table = self.lock();
        let next = table.entries.get(name)?.next_ms?;
        if next > now {
            return None;
        }
        table.decide(name, now, &|_| Some(missed))
    }

    fn record_fire(&self, name: &str, due_ms: u64, task: TaskId) {
        if let Some(entry) = self.lock().entries.get_mut(name) {
            entry.last_fire_ms = Some(due_ms);
            entry.last_task = Some(task);
        }
    }
}

/// Loads the store's schedules, handles the firings they missed while the
/// daemon was down, and starts the firing loop. After recovery: catch-up
/// firings find their slots as the recovered work left them.
pub(crate) async fn start(daemon: &Arc<Daemon>) {
    let Some(host) = daemon.one_host() else {
        return;
    };
    let now = now_ms();
    for stored in host.store.take_schedules() {
        let name = stored.spec.name.clone();
        let zone = match CronZone::parse(&stored.spec.cron, stored.spec.tz.as_deref()) {
            Ok(zone) => zone,
            Err(e) => {
                tracing::error!(schedule = %name, "schedule `{name}` in the store cannot be read ({e}); it does not fire");
                continue;
            }
        };
        let next_ms = stored.next_ms.or_else(|| zone.next_after(now));
        host.schedules.lock().put(Entry {
            spec: Arc::new(stored.spec),
            zone: Arc::new(zone),
            plugin: stored.plugin,
            paused: stored.paused,
            next_ms,
            last_fire_ms: stored.last_fire_ms,
            last_task: stored.last_task,
            created_ms: stored.created_ms,
        });
    }
    // Everything due before this start was missed: the daemon was down.
    let missed = host
        .schedules
        .take_due(now, |entry| Some(entry.spec.missed));
    for due in missed {
        settle_missed(daemon, host, due).await;
    }
    tokio::spawn(fire_loop(Arc::downgrade(daemon)));
}

/// Carries out the decision on firings missed while the daemon was down or
/// the schedule paused: one catch-up firing, or none (the next firing is
/// stored then, as the catch-up's commit would have).
async fn settle_missed(daemon: &Arc<Daemon>, host: &Arc<OneHost>, due: Due) {
    match due.fire {
        Some((due_ms, kind)) => {
            if let Err(message) = fire(daemon, host, &due, due_ms, kind).await {
                tracing::warn!(schedule = %due.name, "the catch-up firing of `{}` failed: {message}", due.name);
            }
        }
        None => {
            let mut event = Event::new(EventKind::ScheduleMissed).reason(format!(
                "skipped {} firing{} due from {} on (--missed skip)",
                due.passed,
                if due.passed == 1 { "" } else { "s" },
                schedule::format_ms(due.from_ms)
            ));
            event.schedule = Some(Arc::from(due.name.as_str()));
            daemon.controller.supervisor().publish(event);
            let stored = host
                .schedules
                .lock()
                .entries
                .get(&due.name)
                .map(Entry::stored);
            if let Some(stored) = stored
                && let Err(e) = host.store.schedule(stored).committed().await
            {
                tracing::warn!(schedule = %due.name, "cannot record schedule `{}`: {e}", due.name);
            }
        }
    }
}

/// The firing loop: sleeps until the soonest schedule is due (or a verb
/// changes the table), fires what is due, and ends with the daemon.
async fn fire_loop(daemon: Weak<Daemon>) {
    loop {
        let (soonest, wake) = {
            let Some(daemon) = daemon.upgrade() else {
                return;
            };
            let Some(host) = daemon.one_host() else {
                return;
            };
            (
                host.schedules.lock().soonest(),
                Arc::clone(&host.schedules.wake),
            )
        };
        // A verb's wake-up after the table was read is kept by the Notify
        // (notify_one stores one), so none is lost.
        let notified = wake.notified();
        let sleep = match soonest {
            Some(at) => Duration::from_millis(at.saturating_sub(now_ms())).min(LOOK_AGAIN),
            None => LOOK_AGAIN,
        };
        if !sleep.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(sleep) => {}
                () = notified => {}
            }
        }
        let Some(daemon) = daemon.upgrade() else {
            return;
        };
        if daemon.controller.supervisor().is_shutting_down() {
            return;
        }
        let Some(host) = daemon.one_host() else {
            return;
        };
        // Two placers take the due schedules one at a time, each deciding
        // one and firing it before it takes the next: the first firing of
        // a burst is not held up by the decisions of the others, and the
        // burst is placed on both workers.
        let now = now_ms();
        let helper = (host.schedules.due_by(now, PLACER_SHARE + 1) > PLACER_SHARE).then(|| {
            let (daemon, host) = (Arc::clone(&daemon), Arc::clone(host));
            tokio::spawn(async move { place_due(&daemon, &host, now).await })
        });
        place_due(&daemon, host, now).await;
        if let Some(helper) = helper {
            let _ = helper.await;
        }
    }
}

/// A burst of more due schedules than this gets a second placer.
const PLACER_SHARE: usize = 64;

/// Fires the schedules due by `now`, taking them one at a time, until none
/// is left.
async fn place_due(daemon: &Arc<Daemon>, host: &Arc<OneHost>, now: u64) {
    while let Some(due) = host.schedules.take_next(now) {
        let Some((due_ms, kind)) = due.fire else {
            continue;
        };
        let loaded = daemon
            .plugins
            .runtime()
            .plugin(&due.spec.request.plugin)
            .is_some();
        if loaded {
            if let Err(message) = fire(daemon, host, &due, due_ms, kind).await {
                tracing::warn!(schedule = %due.name, "schedule `{}` could not fire: {message}", due.name);
            }
            continue;
        }
        // A plugin the daemon has to compile again: in a task of its own,
        // so it does not hold up the other schedules.
        let (daemon, host) = (Arc::clone(daemon), Arc::clone(host));
        tokio::spawn(async move {
            if let Err(message) = fire(&daemon, &host, &due, due_ms, kind).await {
                tracing::warn!(schedule = %due.name, "schedule `{}` could not fire: {message}", due.name);
            }
        });
    }
}

/// Fires a schedule once: its request, named for it, through the
/// controller; the task's row and the schedule's new state in one commit.
/// Returns what a submission returns.
async fn fire(
    daemon: &Arc<Daemon>,
    host: &Arc<OneHost>,
    due: &Due,
    due_ms: u64,
    kind: FireKind,
) -> Result<(Submitted, Ticket), Failure> {
    let mut request = due.spec.request.clone();
    request.schedule = Some(due.name.clone());
    request.not_before = Some(NotBefore::At(due_ms));
    let firing = Firing {
        schedule: due.name.clone(),
        due_ms,
        next_ms: due.next_ms,
        kind,
    };
    let origin = Origin::New {
        key: None,
        fired: Some(firing),
    };
    let (submitted, ticket) = place(daemon, host, request, origin).await?;
    let late = Duration::from_millis(now_ms().saturating_sub(due_ms));
    if kind != FireKind::Run {
        taskhost_core::stats::SCHEDULE_LATENESS.observe(late);
    }
    count_firing(kind);
    host.schedules.record_fire(&due.name, due_ms, submitted.id);
    let name: Arc<str> = Arc::from(submitted.name.as_str());
    let slot: Arc<str> = Arc::from(submitted.slot.as_str());
    let schedule: Arc<str> = Arc::from(due.name.as_str());
    let mut event = Event::new(EventKind::ScheduleFired)
        .task(submitted.id, &name, &slot)
        .schedule(Some(&schedule));
    event.delay_ms = Some(late.as_millis() as u64);
    event.detail = Some(kind.as_str().to_owned());
    daemon.controller.supervisor().publish(event);
    // A firing whose commit fails is withdrawn by `place`'s watcher.
    Ok((submitted, ticket))
}

fn unknown(name: &str) -> Failure {
    ServiceError::NotFound(format!(
        "no schedule named `{name}` (see `host schedule ls`)"
    ))
}

async fn stored(ticket: Ticket) -> Result<(), Failure> {
    ticket
        .committed()
        .await
        .map_err(|e| ServiceError::Internal(format!("the schedule could not be stored: {e}")))
}

/// `host schedule add`: checks the schedule as a submission would be
/// checked (the plugin, the grants, the params its resource needs), then
/// stores it; its first firing is the first due time from now.
pub(crate) async fn add(
    daemon: &Arc<Daemon>,
    host: &Arc<OneHost>,
    spec: ScheduleSpec,
) -> Result<ScheduleRow, Failure> {
    let (spec, plugin, zone) = prepare(daemon, spec).await?;
    let now = now_ms();
    let entry = Entry {
        next_ms: zone.next_after(now),
        zone: Arc::new(zone),
        plugin,
        paused: false,
        last_fire_ms: None,
        last_task: None,
        created_ms: now,
        spec: Arc::new(spec),
    };
    {
        let table = host.schedules.lock();
        if table.entries.contains_key(&entry.spec.name) {
            return Err(exists(&entry.spec.name));
        }
        let most = daemon.config.max_schedules;
        if table.entries.len() >= most {
            return Err(full(most));
        }
    }
    stored(host.store.schedule(entry.stored())).await?;
    let row = entry.row(None);
    host.schedules.lock().put(entry);
    host.schedules.wake.notify_one();
    Ok(row)
}

/// The refusal of a name that is taken.
pub(crate) fn exists(name: &str) -> Failure {
    ServiceError::Conflict(format!(
        "a schedule named `{name}` exists; remove it first (`host schedule rm {name}`) or \
             choose another name"
    ))
}

/// The refusal of a schedule past `--max-schedules`.
pub(crate) fn full(most: usize) -> Failure {
    ServiceError::Invalid(format!(
        "this daemon holds its limit of {most} schedules (--max-schedules); remove some first"
    ))
}

/// Checks a new schedule: its name, its expression and zone, and what its
/// firings will submit, as a submission is checked now. Returns it with
/// its firings' slot and policy resolved (the plugin's resource template
/// and default policy are read once, here), its plugin's name and its
/// zone.
pub(crate) async fn prepare(
    daemon: &Daemon,
    mut spec: ScheduleSpec,
) -> Result<(ScheduleSpec, String, CronZone), Failure> {
    let invalid = |m: String| ServiceError::Invalid(m);
    schedule::check_name(crate::service::namespace::bare(&spec.name)).map_err(invalid)?;
    let zone = CronZone::parse(&spec.cron, spec.tz.as_deref()).map_err(invalid)?;
    let mut request = spec.request.clone();
    request.schedule = Some(spec.name.clone());
    // A deployment by name is checked in the version of now; each firing
    // takes the version of its time.
    // (A cluster node resolved it before: `spec.request.plugin`.)
    if request.deployment.is_some()
        && let Some(host) = daemon.one_host()
    {
        crate::backend::deployments::resolve(host, &mut request)?;
        spec.request.plugin = request.plugin;
    }
    let (plugin, _) = crate::backend::submit::check(daemon, &request).await?;
    let info = plugin.info();
    let (_, slot, policy) =
        crate::service::intake::naming(&request, info, TaskId::from_u64(1)).map_err(invalid)?;
    spec.request.slot = Some(slot);
    spec.request.policy = Some(policy);
    let shown = spec
        .request
        .deployment
        .clone()
        .unwrap_or_else(|| info.name.clone());
    Ok((spec, shown, zone))
}

/// `host schedule ls`: every schedule, by name, with how its last firing's
/// task ended.
pub(crate) async fn list(daemon: &Arc<Daemon>, host: &Arc<OneHost>) -> Vec<ScheduleRow> {
    let (mut rows, unknown): (Vec<ScheduleRow>, Vec<TaskId>) = {
        let table = host.schedules.lock();
        let mut unknown = Vec::new();
        let rows = table
            .entries
            .values()
            .map(|entry| {
                let outcome = entry.last_task.and_then(|id| match daemon.tasks.get(id) {
                    Some(record) => record.outcome.get().map(|r| r.outcome.kind()),
                    None => {
                        unknown.push(id);
                        None
                    }
                });
                entry.row(outcome)
            })
            .collect();
        (rows, unknown)
    };
    if !unknown.is_empty() {
        let store = host.store.clone();
        let found = tokio::task::spawn_blocking(move || store.outcome_kinds(&unknown))
            .await
            .unwrap_or_default();
        for row in &mut rows {
            if let Some(id) = row.last_task
                && let Some(kind) = found.get(&id)
            {
                row.last_outcome = Some(*kind);
            }
        }
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// `host schedule rm`: deletes the schedule; its tasks go on.
pub(crate) async fn remove(host: &OneHost, name: &str) -> Result<ScheduleRow, Failure> {
    let row = {
        let table = host.schedules.lock();
        table
            .entries
            .get(name)
            .map(|e| e.row(None))
            .ok_or_else(|| unknown(name))?
    };
    stored(host.store.schedule_removed(name)).await?;
    let mut table = host.schedules.lock();
    if let Some(entry) = table.entries.remove(name) {
        if let Some(next) = entry.next_ms {
            table.due.remove(&(next, name.to_owned()));
        }
        // The zone goes with the last schedule that had it.
        let key = (entry.spec.cron.clone(), entry.spec.tz.clone());
        drop(entry);
        if table
            .zones
            .get(&key)
            .is_some_and(|z| Arc::strong_count(z) == 1)
        {
            table.zones.remove(&key);
        }
    }
    drop(table);
    host.schedules.wake.notify_one();
    Ok(row)
}

/// `host schedule pause` and `resume`. A resumed schedule's firings that
/// passed while it was paused are missed: `--missed once` fires one
/// catch-up now, `skip` none.
pub(crate) async fn set_paused(
    daemon: &Arc<Daemon>,
    host: &Arc<OneHost>,
    name: &str,
    paused: bool,
) -> Result<ScheduleRow, Failure> {
    let now = now_ms();
    let (stored_now, was_paused) = {
        let mut table = host.schedules.lock();
        let entry = table.entries.get(name).ok_or_else(|| unknown(name))?;
        let was_paused = entry.paused;
        if was_paused != paused {
            let next_ms = entry.next_ms;
            let mut entry = table.entries.remove(name).ok_or_else(|| unknown(name))?;
            if let Some(next) = next_ms {
                table.due.remove(&(next, name.to_owned()));
            }
            entry.paused = paused;
            table.put(entry);
        }
        let entry = table.entries.get(name).ok_or_else(|| unknown(name))?;
        (entry.stored(), was_paused)
    };
    if was_paused == paused {
        let table = host.schedules.lock();
        let entry = table.entries.get(name).ok_or_else(|| unknown(name))?;
        return Ok(entry.row(None));
    }
    let missed = stored_now.spec.missed;
    stored(host.store.schedule(stored_now)).await?;
    if !paused {
        // What passed while it was paused is missed.
        if let Some(due) = host.schedules.take_one(name, now, missed) {
            settle_missed(daemon, host, due).await;
        }
        host.schedules.wake.notify_one();
    }
    let table = host.schedules.lock();
    let entry = table.entries.get(name).ok_or_else(|| unknown(name))?;
    Ok(entry.row(None))
}

/// `host schedule run`: fires the schedule once now, whatever its time and
/// even while it is paused; its next firing stays as it was.
pub(crate) async fn run(
    daemon: &Arc<Daemon>,
    host: &Arc<OneHost>,
    name: &str,
) -> Result<(Submitted, Ticket), Failure> {
    let due = {
        let table = host.schedules.lock();
        let entry = table.entries.get(name).ok_or_else(|| unknown(name))?;
        Due {
            name: name.to_owned(),
            spec: Arc::clone(&entry.spec),
            fire: None,
            next_ms: entry.next_ms,
            from_ms: now_ms(),
            passed: 0,
        }
    };
    fire(daemon, host, &due, now_ms(), FireKind::Run).await
}
