//! Owns the global concurrency limit: a counting semaphore whose waiters
//! are kept in share groups (`TaskSpec::with_share`; tasks without one are
//! in the default group). When a permit frees up and more than one group
//! has waiters, it goes to the group whose turn it is by stride scheduling:
//! each grant moves a group's pass on by a stride inversely proportional to
//! its weight, and the group with the lowest pass goes next, so groups are
//! served in proportion to their weights whatever the length of their
//! lines. A group that starts to wait starts at the current virtual time
//! (the pass of the latest grant), so time spent idle earns it no burst
//! later. Within a group, waiters are served by priority, highest first,
//! then in arrival order. A released permit goes straight to the chosen
//! waiter (nobody arriving later can take it first), so the order is exact;
//! with one group it is priority, then arrival. A waiter that gives up (its
//! task was stopped) leaves no trace: a permit handed to it at that very
//! moment goes on to the next, and a group whose last waiter left keeps
//! only its pass, and that only while it is ahead of the virtual time. It
//! also counts the attempts that gave their permit back while they wait
//! (parked): they hold an instance but no permit.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// A share group; `None` is the default group.
type Group = Option<Arc<str>>;

/// A waiter's place in its group's line: priority first (highest first),
/// then arrival.
type Place = (Reverse<i32>, u64);

/// A group's turn: its pass, then the arrival of its first waiter (so that
/// equal passes go in arrival order), then the group itself.
type Turn = (u128, u64, Group);

/// How far one grant moves the pass of a group of weight 1. Large enough
/// that every `u32` weight has a stride of at least one.
const STRIDE: u128 = 1 << 32;

/// Most idle groups whose pass is remembered. Forgetting one lets it start
/// at the virtual time, at most one stride early: a bounded unfairness, in
/// exchange for bounded memory however many groups come and go.
const MAX_IDLE: usize = 1024;

/// Maps keyed by group, hashed like the registry's.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The semaphore.
#[derive(Debug)]
pub(crate) struct Permits {
    state: Mutex<State>,
    /// Attempts parked: their permit given back while they wait.
    parked: AtomicUsize,
}

#[derive(Debug, Default)]
struct State {
    available: usize,
    arrivals: u64,
    /// The line of every group with waiters.
    lines: Map<Group, Line>,
    /// The turn of every group with waiters, next first.
    turns: BTreeSet<Turn>,
    /// The virtual time: the pass of the latest grant.
    now: u128,
    /// The passes of groups without waiters that are still ahead of the
    /// virtual time, so that leaving and coming back earns no credit.
    idle: Map<Group, u128>,
    /// The same by pass, to forget those the virtual time caught up with.
    idle_by_pass: BTreeSet<(u128, Group)>,
    /// Weights other than 1.
    weights: Map<Group, u32>,
}

/// One group's waiters and its pass.
#[derive(Debug)]
struct Line {
    pass: u128,
    waiters: BTreeMap<Place, oneshot::Sender<()>>,
}

impl Line {
    /// The group's turn; `None` if nobody waits.
    fn turn(&self, group: &Group) -> Option<Turn> {
        let (&(_, arrival), _) = self.waiters.first_key_value()?;
        Some((self.pass, arrival, group.clone()))
    }
}

impl State {
    fn weight(&self, group: &Group) -> u32 {
        self.weights.get(group).copied().unwrap_or(1)
    }

    /// Puts a waiter in its group's line; a group that was not waiting
    /// starts no earlier than the virtual time.
    fn join(&mut self, group: Group, place: Place, tx: oneshot::Sender<()>) {
        if let Some(line) = self.lines.get_mut(&group) {
            let before = line.turn(&group);
            line.waiters.insert(place, tx);
            let after = line.turn(&group);
            if before != after {
                if let Some(before) = before {
                    self.turns.remove(&before);
                }
                if let Some(after) = after {
                    self.turns.insert(after);
                }
            }
            return;
        }
        let pass = match self.idle.remove(&group) {
            Some(pass) => {
                self.idle_by_pass.remove(&(pass, group.clone()));
                pass.max(self.now)
            }
            None => self.now,
        };
        self.turns.insert((pass, place.1, group.clone()));
        let waiters = BTreeMap::from([(place, tx)]);
        self.lines.insert(group, Line { pass, waiters });
    }

    /// Takes a waiter out of its line; false if it is no longer there (it
    /// was handed a permit).
    fn leave(&mut self, group: &Group, place: &Place) -> bool {
        let Some(line) = self.lines.get_mut(group) else {
            return false;
        };
        let before = line.turn(group);
        if line.waiters.remove(place).is_none() {
            return false;
        }
        let after = line.turn(group);
        if before != after {
            if let Some(before) = before {
                self.turns.remove(&before);
            }
            match after {
                Some(after) => {
                    self.turns.insert(after);
                }
                None => {
                    let pass = line.pass;
                    self.lines.remove(group);
                    self.rest(group.clone(), pass);
                }
            }
        }
        true
    }

    /// Takes the first waiter of the group whose turn it is, and moves that
    /// group's pass on by its stride.
    fn next(&mut self) -> Option<oneshot::Sender<()>> {
        loop {
            let (pass, _, group) = self.turns.pop_first()?;
            let stride = STRIDE / u128::from(self.weight(&group));
            let Some(line) = self.lines.get_mut(&group) else {
                continue;
            };
            let Some((_, tx)) = line.waiters.pop_first() else {
                self.lines.remove(&group);
                continue;
            };
            line.pass = pass + stride;
            match line.turn(&group) {
                Some(turn) => {
                    self.turns.insert(turn);
                }
                None => {
                    let kept = line.pass;
                    self.lines.remove(&group);
                    self.rest(group, kept);
                }
            }
            self.advance(pass);
            return Some(tx);
        }
    }

    /// Remembers the pass of a group that no longer waits, if it is ahead
    /// of the virtual time (otherwise it would start there anyway).
    fn rest(&mut self, group: Group, pass: u128) {
        if pass <= self.now {
            return;
        }
        self.idle.insert(group.clone(), pass);
        self.idle_by_pass.insert((pass, group));
        if self.idle.len() > MAX_IDLE
            && let Some((_, group)) = self.idle_by_pass.pop_first()
        {
            self.idle.remove(&group);
        }
    }

    /// Moves the virtual time to `pass` and forgets the idle groups it
    /// caught up with.
    fn advance(&mut self, pass: u128) {
        self.now = self.now.max(pass);
        while let Some(&(pass, _)) = self.idle_by_pass.first()
            && pass <= self.now
        {
            if let Some((_, group)) = self.idle_by_pass.pop_first() {
                self.idle.remove(&group);
            }
        }
    }
}

/// One permit; dropping it gives it back (to the next waiter, if any).
#[derive(Debug)]
pub(crate) struct Permit {
    permits: Arc<Permits>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.permits.release();
    }
}

impl Permits {
    /// `n` permits.
    pub(crate) fn new(n: usize) -> Self {
        Self {
            state: Mutex::new(State {
                available: n,
                ..State::default()
            }),
            parked: AtomicUsize::new(0),
        }
    }

    /// Attempts parked right now.
    pub(crate) fn parked(&self) -> usize {
        self.parked.load(Ordering::Relaxed)
    }

    /// Counts one attempt parked (`true`) or back (`false`).
    pub(crate) fn count_parked(&self, parked: bool) {
        if parked {
            self.parked.fetch_add(1, Ordering::Relaxed);
        } else {
            self.parked.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Permits free right now.
    pub(crate) fn available(&self) -> usize {
        self.lock().available
    }

    /// Sets a share group's weight (0 counts as 1), for the next grants.
    pub(crate) fn set_weight(&self, group: Option<&str>, weight: u32) {
        let group: Group = group.map(Arc::from);
        let mut state = self.lock();
        if weight > 1 {
            state.weights.insert(group, weight);
        } else {
            state.weights.remove(&group);
        }
    }

    /// Waits for a permit at `priority` in share group `group`. Cancel-safe:
    /// dropping the future gives back a permit it was handed and not yet
    /// took.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        priority: i32,
        group: Option<&Arc<str>>,
    ) -> Permit {
        loop {
            let (group, place, rx) = {
                let mut state = self.lock();
                if state.available > 0 && state.turns.is_empty() {
                    state.available -= 1;
                    return Permit {
                        permits: Arc::clone(self),
                    };
                }
                state.arrivals += 1;
                let place = (Reverse(priority), state.arrivals);
                let (tx, rx) = oneshot::channel();
                let group: Group = group.cloned();
                state.join(group.clone(), place, tx);
                (group, place, rx)
            };
            let mut waiting = Waiting {
                permits: self,
                group,
                place,
                rx: Some(rx),
            };
            let granted = match waiting.rx.as_mut() {
                Some(rx) => rx.await.is_ok(),
                None => false,
            };
            waiting.rx = None;
            if granted {
                return Permit {
                    permits: Arc::clone(self),
                };
            }
            // A sender dropped unused (never, as senders are only dropped
            // once their receiver is gone): wait again rather than invent a
            // permit.
        }
    }

    /// Gives a permit back: to the next waiter still waiting, else to the
    /// pool.
    fn release(&self) {
        let mut state = self.lock();
        while let Some(tx) = state.next() {
            if tx.send(()).is_ok() {
                return;
            }
        }
        state.available += 1;
    }
}

/// A waiter's registration; on drop, it leaves the line, and a permit it
/// was handed but never took goes on.
struct Waiting<'a> {
    permits: &'a Arc<Permits>,
    group: Group,
    place: Place,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let mut state = self.permits.lock();
        if state.leave(&self.group, &self.place) {
            return;
        }
        // Handed a permit under the lock, before this drop took it.
        drop(state);
        if rx.try_recv().is_ok() {
            self.permits.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    type Grants = mpsc::UnboundedReceiver<(&'static str, Permit)>;
    type Granted = mpsc::UnboundedSender<(&'static str, Permit)>;

    /// Queues a waiter that hands its label and permit to `granted` once
    /// it has a permit.
    async fn queue(
        permits: &Arc<Permits>,
        granted: &Granted,
        group: Option<&str>,
        priority: i32,
        label: &'static str,
    ) {
        let (waiter, granted) = (Arc::clone(permits), granted.clone());
        let group: Group = group.map(Arc::from);
        let before = waiting(permits);
        tokio::spawn(async move {
            let permit = waiter.acquire(priority, group.as_ref()).await;
            let _ = granted.send((label, permit));
        });
        tokio::task::yield_now().await;
        assert_eq!(waiting(permits), before + 1, "{label} is in line");
    }

    fn waiting(permits: &Permits) -> usize {
        let state = permits.lock();
        state.lines.values().map(|line| line.waiters.len()).sum()
    }

    /// Hands the held permit back `n` times, each time holding the next
    /// grant instead; the labels in the order they were granted.
    async fn serve(held: &mut Option<Permit>, grants: &mut Grants, n: usize) -> Vec<&'static str> {
        let mut order = Vec::new();
        for _ in 0..n {
            drop(held.take());
            let (label, permit) = grants.recv().await.expect("a waiter is granted");
            order.push(label);
            *held = Some(permit);
        }
        order
    }

    /// The most grants in a row that went to `label`.
    fn longest_run(order: &[&str], label: &str) -> usize {
        let (mut run, mut longest) = (0, 0);
        for l in order {
            run = if *l == label { run + 1 } else { 0 };
            longest = longest.max(run);
        }
        longest
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_served_by_priority_then_arrival() {
        let permits = Arc::new(Permits::new(1));
        let first = permits.acquire(0, None).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut handles = Vec::new();
        for (label, priority) in [("low-a", 0), ("high", 5), ("low-b", 0), ("mid", 2)] {
            let (permits, order) = (Arc::clone(&permits), Arc::clone(&order));
            handles.push(tokio::spawn(async move {
                let _permit = permits.acquire(priority, None).await;
                order.lock().unwrap().push(label);
            }));
            tokio::task::yield_now().await;
        }
        drop(first);
        for handle in handles {
            handle.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["high", "mid", "low-a", "low-b"]);
        assert_eq!(permits.available(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_gives_up_loses_nothing() {
        let permits = Arc::new(Permits::new(1));
        let held = permits.acquire(0, None).await;
        let gave_up = {
            let permits = Arc::clone(&permits);
            tokio::spawn(async move {
                let _ = tokio::time::timeout(
                    std::time::Duration::from_millis(5),
                    permits.acquire(9, None),
                )
                .await;
            })
        };
        gave_up.await.unwrap();
        drop(held);
        assert_eq!(permits.available(), 1, "the permit came back");
        let again = permits.acquire(0, None).await;
        drop(again);
        assert_eq!(permits.available(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn groups_get_permits_in_proportion_to_their_weights() {
        let permits = Arc::new(Permits::new(1));
        permits.set_weight(Some("a"), 3);
        let mut held = Some(permits.acquire(0, None).await);
        let (granted, mut grants) = mpsc::unbounded_channel();
        for _ in 0..40 {
            queue(&permits, &granted, Some("a"), 0, "a").await;
        }
        for _ in 0..40 {
            queue(&permits, &granted, Some("b"), 0, "b").await;
        }
        let order = serve(&mut held, &mut grants, 20).await;
        let a = order.iter().filter(|l| **l == "a").count();
        assert!((14..=16).contains(&a), "a has weight 3 of 4: {order:?}");
        assert!(longest_run(&order, "a") <= 3, "interleaved: {order:?}");
        assert!(longest_run(&order, "b") <= 1, "interleaved: {order:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_group_back_from_idle_gets_no_burst() {
        let permits = Arc::new(Permits::new(1));
        permits.set_weight(Some("b"), 2);
        let mut held = Some(permits.acquire(0, None).await);
        let (granted, mut grants) = mpsc::unbounded_channel();
        for _ in 0..40 {
            queue(&permits, &granted, Some("a"), 0, "a").await;
        }
        queue(&permits, &granted, Some("b"), 0, "b").await;
        // b is served once early on, then idle while a is served long.
        let early = serve(&mut held, &mut grants, 21).await;
        assert_eq!(early.iter().filter(|l| **l == "b").count(), 1, "{early:?}");
        assert_eq!(early.iter().position(|l| *l == "b"), Some(1), "{early:?}");
        for _ in 0..20 {
            queue(&permits, &granted, Some("b"), 0, "b").await;
        }
        let back = serve(&mut held, &mut grants, 15).await;
        assert!(
            longest_run(&back, "b") <= 3,
            "no more than one grant beyond its weight in a row: {back:?}"
        );
        let b = back.iter().filter(|l| **l == "b").count();
        assert!((9..=11).contains(&b), "b has weight 2 of 3: {back:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn priority_orders_waiters_within_a_group_only() {
        let permits = Arc::new(Permits::new(1));
        let mut held = Some(permits.acquire(0, None).await);
        let (granted, mut grants) = mpsc::unbounded_channel();
        queue(&permits, &granted, Some("a"), 0, "a-low").await;
        queue(&permits, &granted, Some("a"), 5, "a-high").await;
        queue(&permits, &granted, Some("b"), 10, "b-urgent").await;
        queue(&permits, &granted, Some("b"), 0, "b-low").await;
        let order = serve(&mut held, &mut grants, 4).await;
        assert_eq!(order, ["a-high", "b-urgent", "a-low", "b-low"]);
        drop(held);
        assert_eq!(permits.available(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_gives_up_in_a_group_leaves_no_trace() {
        let permits = Arc::new(Permits::new(1));
        let held = permits.acquire(0, None).await;
        let gave_up = {
            let permits = Arc::clone(&permits);
            let group: Arc<str> = Arc::from("g");
            tokio::spawn(async move {
                let wait = permits.acquire(0, Some(&group));
                let _ = tokio::time::timeout(std::time::Duration::from_millis(5), wait).await;
            })
        };
        gave_up.await.unwrap();
        {
            let state = permits.lock();
            assert!(state.lines.is_empty(), "{state:?}");
            assert!(state.turns.is_empty(), "{state:?}");
            assert!(state.idle.is_empty(), "{state:?}");
        }
        drop(held);
        assert_eq!(permits.available(), 1, "the permit came back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_permit_handed_to_a_waiter_that_gives_up_goes_to_another_group() {
        let permits = Arc::new(Permits::new(1));
        let mut held = Some(permits.acquire(0, None).await);
        let group: Arc<str> = Arc::from("g");
        let mut gives_up = Box::pin(permits.acquire(0, Some(&group)));
        assert!(futures::poll!(&mut gives_up).is_pending(), "in line");
        let (granted, mut grants) = mpsc::unbounded_channel();
        queue(&permits, &granted, Some("h"), 0, "h").await;
        // The permit goes to g's waiter, which drops it before taking it.
        drop(held.take());
        drop(gives_up);
        let (label, permit) = grants.recv().await.expect("h is granted");
        assert_eq!(label, "h");
        assert!(permits.lock().lines.is_empty());
        drop(permit);
        assert_eq!(permits.available(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_groups_remembered_are_bounded() {
        let permits = Arc::new(Permits::new(1));
        let mut held = Some(permits.acquire(0, None).await);
        let (granted, mut grants) = mpsc::unbounded_channel();
        let groups: Vec<String> = (0..MAX_IDLE + 10).map(|i| format!("g{i}")).collect();
        for group in &groups {
            queue(&permits, &granted, Some(group), 0, "g").await;
        }
        serve(&mut held, &mut grants, groups.len()).await;
        let state = permits.lock();
        assert!(state.lines.is_empty() && state.turns.is_empty());
        assert_eq!(state.idle.len(), MAX_IDLE);
        assert_eq!(state.idle_by_pass.len(), MAX_IDLE);
    }
}
