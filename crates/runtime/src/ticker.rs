//! Owns the epoch ticker: the thread that advances the engine's epoch every
//! tick (at real-time priority where the process may), the force-abort and
//! timeout deadlines of attempts, which it fires at their very time and
//! after which it ticks every millisecond until their attempts are gone,
//! and the process's counters of fired aborts that every guest's epoch
//! callback reads (`attempt::new_store`). What a guest does at a tick is
//! the attempt's business; building the engine is `engine`'s.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::Duration;

use wasmtime::Engine;

/// The default interval of the epoch ticker.
pub const DEFAULT_EPOCH_TICK: Duration = Duration::from_millis(10);

/// The thread that advances the engine's epoch every tick; stops when the
/// engine or the ticker is dropped.
pub(crate) struct EpochTicker {
    stop: Arc<AtomicBool>,
    hurry: Arc<Hurry>,
    /// Whether its thread runs at real-time priority.
    realtime: bool,
}

/// An attempt's force-abort deadline, its [`HurryGuard`]'s state (gone
/// once the attempt is), and its abort flag.
type Deadline = (std::time::Instant, Weak<AtomicU8>, Arc<AtomicBool>);

/// Force-abort deadlines of attempts that are still alive. While one has
/// passed, the ticker ticks every millisecond: every spinning guest then
/// yields its worker thread within a millisecond, so the actor that must
/// abort one of them gets to run (with 10 ms ticks, five spinners on one
/// thread delayed it by several ticks).
#[derive(Debug, Default)]
pub(crate) struct Hurry {
    deadlines: Mutex<Deadlines>,
    /// Wakes the ticker when a deadline nearer than its wait is added.
    wake: Condvar,
}

#[derive(Debug, Default)]
struct Deadlines {
    list: Vec<Deadline>,
    /// Until when the ticker sleeps (while it does): a deadline added for
    /// later does not wake it. Waking it for each of 10,000 stops at a
    /// shutdown made it rescan the list each time (quadratic: 3.5 s for
    /// 10,000 parked tasks against 55 ms for 1,000).
    sleeping_until: Option<std::time::Instant>,
    /// The earliest deadline not yet overdue, as of the last scan and the
    /// additions since: a tick scans the list only when one may have come,
    /// while one is overdue, or when the list has doubled (to drop those
    /// whose attempts are gone), so a regular tick costs the same with
    /// 10,000 deadlines as with none.
    earliest: Option<std::time::Instant>,
    /// Whether one was overdue (its abort flag set) at the last scan.
    overdue: bool,
    /// How many the list held after the last scan.
    scanned: usize,
}

impl Deadlines {
    /// Sets the abort flags of the deadlines that have come, drops those
    /// whose attempts are gone, and recomputes `earliest` and `overdue`
    /// from the others; says whether it set any flag.
    fn scan(&mut self, now: std::time::Instant) -> bool {
        self.list.retain(|(_, state, _)| state.strong_count() > 0);
        self.earliest = None;
        self.overdue = false;
        let mut fired = false;
        for (at, state, abort) in &self.list {
            if *at <= now && !abort.swap(true, Ordering::SeqCst) {
                fired = true;
                ABORTS_FIRED.fetch_add(1, Ordering::SeqCst);
                // Pending until its attempt is gone (the guard's drop),
                // unless that has already happened.
                if let Some(state) = state.upgrade()
                    && state
                        .compare_exchange(ARMED, FIRED, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                {
                    ABORTS_PENDING.fetch_add(1, Ordering::SeqCst);
                }
            }
            if abort.load(Ordering::Relaxed) {
                self.overdue = true;
            } else {
                self.earliest = Some(self.earliest.map_or(*at, |e| e.min(*at)));
            }
        }
        self.scanned = self.list.len();
        fired
    }
}

/// Keeps a force-abort deadline registered with the ticker until dropped.
#[derive(Debug)]
pub struct HurryGuard {
    /// [`ARMED`], [`FIRED`] by the ticker, or [`DROPPED`].
    state: Arc<AtomicU8>,
}

const ARMED: u8 = 0;
const FIRED: u8 = 1;
const DROPPED: u8 = 2;

impl Drop for HurryGuard {
    fn drop(&mut self) {
        if self.state.swap(DROPPED, Ordering::SeqCst) == FIRED {
            ABORTS_PENDING.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Hurry {
    /// Waits until the next tick is due: the regular tick (`next_tick`), a
    /// deadline coming, or every [`HURRY_TICK`] while one is overdue. A new
    /// deadline wakes it to recompute, so one nearer than the tick is kept
    /// exactly. On return, the abort flags of the deadlines that have come
    /// are set (before the tick, so the guest's next epoch check traps).
    fn wait(&self, tick: Duration, next_tick: &mut std::time::Instant) {
        let mut deadlines = self
            .deadlines
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        loop {
            let now = std::time::Instant::now();
            deadlines.sleeping_until = None;
            let fired = (deadlines.overdue
                || deadlines.earliest.is_some_and(|at| at <= now)
                || deadlines.list.len() > 2 * deadlines.scanned.max(32))
                && deadlines.scan(now);
            let mut due = *next_tick;
            // Once one is overdue, tick every HURRY_TICK after the last
            // tick (`next_tick - tick`).
            if deadlines.overdue {
                due = due.min((*next_tick - tick + HURRY_TICK).min(*next_tick));
            }
            if let Some(at) = deadlines.earliest {
                due = due.min(at);
            }
            if fired || due <= now {
                *next_tick = now + tick;
                return;
            }
            deadlines.sleeping_until = Some(due);
            deadlines = self
                .wake
                .wait_timeout(deadlines, due - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// How many deadlines the epoch tickers of this process have fired. A
/// guest that resumes after a yield and sees this changed yields once more,
/// so the executor reaches the aborted guest before the others run on (see
/// `attempt::new_store`).
pub(crate) static ABORTS_FIRED: AtomicU64 = AtomicU64::new(0);

/// How many deadlines the tickers fired whose attempts are not gone yet.
/// While there is one, every guest yields at each epoch check instead of
/// running on for a tick: the aborted guest's task may wait anywhere in the
/// executor's queue (Tokio wakes the tasks that yielded last first), so
/// yielding once is not enough to let the executor reach it before the
/// others run a whole tick each (with 4 spinners on a current-thread
/// runtime, 4.4 ms from the deadline to the outcome).
pub(crate) static ABORTS_PENDING: AtomicI64 = AtomicI64::new(0);

/// The tick while a force-abort is overdue.
const HURRY_TICK: Duration = Duration::from_millis(1);

impl EpochTicker {
    /// Registers an attempt's deadline: the ticker sets `abort` and ticks at
    /// it, then every millisecond until the guard is dropped (when the
    /// attempt is gone).
    pub(crate) fn hurry_at(&self, at: std::time::Instant, abort: Arc<AtomicBool>) -> HurryGuard {
        let state = Arc::new(AtomicU8::new(ARMED));
        let mut deadlines = self
            .hurry
            .deadlines
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        deadlines.list.push((at, Arc::downgrade(&state), abort));
        deadlines.earliest = Some(deadlines.earliest.map_or(at, |e| e.min(at)));
        // Not sleeping: it scans the list before it sleeps again.
        if deadlines.sleeping_until.is_some_and(|until| at < until) {
            self.hurry.wake.notify_one();
        }
        HurryGuard { state }
    }

    /// Starts the ticker's thread for `engine`, at real-time priority if
    /// asked and allowed; the error says why the thread did not start.
    pub(crate) fn start(
        engine: &Engine,
        tick: Duration,
        ask_realtime: bool,
    ) -> Result<Self, String> {
        let weak = engine.weak();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let hurry = Arc::new(Hurry::default());
        let deadlines = Arc::clone(&hurry);
        let thread = std::thread::Builder::new()
            .name("taskhost-epoch".into())
            .spawn(move || {
                let mut next_tick = std::time::Instant::now() + tick;
                while !flag.load(Ordering::Relaxed) {
                    deadlines.wait(tick, &mut next_tick);
                    match weak.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .map_err(|e| format!("cannot start the epoch ticker thread: {e}"))?;
        let realtime = ask_realtime && realtime_priority(&thread);
        Ok(Self {
            stop,
            hurry,
            realtime,
        })
    }

    /// Whether its thread runs at real-time priority.
    pub(crate) fn is_realtime(&self) -> bool {
        self.realtime
    }
}

/// Gives `thread` the lowest real-time priority, if this process may.
fn realtime_priority(thread: &std::thread::JoinHandle<()>) -> bool {
    use std::os::unix::thread::JoinHandleExt;
    use thread_priority::{
        RealtimeThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
        set_thread_priority_and_policy,
    };
    match set_thread_priority_and_policy(
        thread.as_pthread_t(),
        ThreadPriority::Min,
        ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Fifo),
    ) {
        Ok(()) => true,
        Err(err) => {
            tracing::debug!("the epoch ticker runs at normal priority: {err:?}");
            false
        }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
