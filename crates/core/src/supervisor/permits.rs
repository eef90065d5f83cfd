//! Owns the global concurrency limit: a counting semaphore whose waiters
//! are kept in share groups, and which counts the permits each group holds.
//! Which group a freed permit goes to, and which of its waiters, is
//! `shares`' business: by weight, within a group by priority then arrival,
//! never to a group at its cap. A released permit goes straight to the
//! chosen waiter (nobody arriving later can take it first), so the order is
//! exact; with one group it is priority, then arrival. An arrival takes a
//! free permit at once only if no group that may take it waits, and its own
//! group is under its cap: a free permit with waiters means every waiting
//! group is at its cap. A waiter that gives up (its task was stopped)
//! leaves no trace: a permit handed to it at that very moment goes on to
//! the next, and a group whose last waiter left keeps only its pass, and
//! that only while it is ahead of the virtual time. It also counts the
//! attempts that gave their permit back while they wait (parked): they hold
//! an instance but no permit. And it keeps a listing's count of running
//! attempts within the limit: no attempt starts while one is read.

use std::cmp::Reverse;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::sync::oneshot;

use super::shares::{Group, Place, Shares};

/// The semaphore.
#[derive(Debug)]
pub(crate) struct Permits {
    state: Mutex<State>,
    /// Attempts parked: their permit given back while they wait.
    parked: AtomicUsize,
    /// Held shared while an attempt is shown running on its new permit,
    /// and alone while a listing reads the tasks' phases. An attempt is
    /// shown off running before its permit goes back, so a listing sees
    /// no more running than there are permits, though it reads its rows
    /// one by one.
    starts: RwLock<()>,
}

#[derive(Debug, Default)]
struct State {
    available: usize,
    arrivals: u64,
    shares: Shares,
}

impl State {
    /// Hands a permit to the next waiter still waiting; false if none may
    /// take it.
    fn hand_out(&mut self) -> bool {
        while let Some((group, tx)) = self.shares.next() {
            if tx.send(()).is_ok() {
                return true;
            }
            self.shares.gave_back(&group);
        }
        false
    }
}

/// One permit, held by an attempt of `group`; dropping it gives it back
/// (to the next waiter, if any).
#[derive(Debug)]
pub(crate) struct Permit {
    permits: Arc<Permits>,
    group: Group,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.permits.release(&self.group);
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
            starts: RwLock::new(()),
        }
    }

    /// Held while an attempt that got a permit is shown running.
    pub(crate) fn starting(&self) -> RwLockReadGuard<'_, ()> {
        self.starts.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Held while a listing reads the tasks' phases: no attempt starts.
    pub(crate) fn no_starts(&self) -> RwLockWriteGuard<'_, ()> {
        self.starts.write().unwrap_or_else(PoisonError::into_inner)
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

    /// Permits held right now by share group `group`.
    pub(crate) fn running(&self, group: Option<&str>) -> usize {
        let group: Group = group.map(Arc::from);
        self.lock().shares.running(&group)
    }

    /// Sets a share group's weight (0 counts as 1), for the next grants.
    pub(crate) fn set_weight(&self, group: Option<&str>, weight: u32) {
        self.lock().shares.set_weight(group.map(Arc::from), weight);
    }

    /// Caps the permits share group `group` holds at once (`None`: no cap;
    /// 0: none). Permits held beyond a lowered cap are kept until given
    /// back; free permits go at once to the waiters a raised cap lets in.
    pub(crate) fn set_limit(&self, group: Option<&str>, limit: Option<usize>) {
        let mut state = self.lock();
        state.shares.set_cap(group.map(Arc::from), limit);
        while state.available > 0 && state.hand_out() {
            state.available -= 1;
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
        let group: Group = group.cloned();
        loop {
            let (place, rx) = {
                let mut state = self.lock();
                if state.available > 0 && !state.shares.ready() && !state.shares.capped(&group) {
                    state.available -= 1;
                    state.shares.took(&group);
                    return Permit {
                        permits: Arc::clone(self),
                        group,
                    };
                }
                state.arrivals += 1;
                let place = (Reverse(priority), state.arrivals);
                let (tx, rx) = oneshot::channel();
                state.shares.join(group.clone(), place, tx);
                (place, rx)
            };
            let mut waiting = Waiting {
                permits: self,
                group: &group,
                place,
                rx: Some(rx),
            };
            let granted = match waiting.rx.as_mut() {
                Some(rx) => rx.await.is_ok(),
                None => false,
            };
            waiting.rx = None;
            drop(waiting);
            if granted {
                // Counted as the group's when it was handed over.
                return Permit {
                    permits: Arc::clone(self),
                    group,
                };
            }
            // A sender dropped unused (never, as senders are only dropped
            // once their receiver is gone): wait again rather than invent a
            // permit.
        }
    }

    /// Gives a permit of `group` back: to the next waiter that may take it,
    /// else to the pool. The group's count goes down first, so that a group
    /// at its cap may be the one to get it.
    fn release(&self, group: &Group) {
        let mut state = self.lock();
        state.shares.gave_back(group);
        if !state.hand_out() {
            state.available += 1;
        }
    }
}

/// A waiter's registration; on drop, it leaves the line, and a permit it
/// was handed but never took goes on.
struct Waiting<'a> {
    permits: &'a Arc<Permits>,
    group: &'a Group,
    place: Place,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let mut state = self.permits.lock();
        if state.shares.leave(self.group, &self.place) {
            return;
        }
        // Handed a permit under the lock, before this drop took it: it was
        // counted as the group's, and goes on.
        drop(state);
        if rx.try_recv().is_ok() {
            self.permits.release(self.group);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::shares::{KEEP_COUNTS, MAX_IDLE};
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
        state
            .shares
            .lines
            .values()
            .map(|line| line.waiters.len())
            .sum()
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
        give_up(&permits, "g").await;
        {
            let state = permits.lock();
            assert!(state.shares.lines.is_empty(), "{state:?}");
            assert!(state.shares.turns.is_empty(), "{state:?}");
            assert!(state.shares.idle.is_empty(), "{state:?}");
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
        assert!(permits.lock().shares.lines.is_empty());
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
        assert!(state.shares.lines.is_empty() && state.shares.turns.is_empty());
        assert_eq!(state.shares.idle.len(), MAX_IDLE);
        assert_eq!(state.shares.idle_by_pass.len(), MAX_IDLE);
    }

    /// Permits held, by all groups together.
    fn held_in_all(permits: &Permits) -> usize {
        permits.lock().shares.held.values().sum()
    }

    /// Takes a permit in `group` without waiting (fails the test if it
    /// would wait).
    /// A waiter in `group` that gives up after 5 ms, in a task of its own.
    async fn give_up(permits: &Arc<Permits>, group: &str) {
        let (permits, group) = (Arc::clone(permits), Arc::<str>::from(group));
        tokio::spawn(async move {
            let wait = permits.acquire(0, Some(&group));
            let _ = tokio::time::timeout(std::time::Duration::from_millis(5), wait).await;
        })
        .await
        .unwrap();
    }

    async fn take(permits: &Arc<Permits>, group: &str) -> Permit {
        let group: Arc<str> = Arc::from(group);
        let mut acquire = Box::pin(permits.acquire(0, Some(&group)));
        match futures::poll!(&mut acquire) {
            std::task::Poll::Ready(permit) => permit,
            std::task::Poll::Pending => panic!("{group} had to wait"),
        }
    }

    /// The next grant, which must be `label`'s.
    async fn next_grant(grants: &mut Grants, label: &str) -> Permit {
        let (granted, permit) = grants.recv().await.expect("a waiter is granted");
        assert_eq!(granted, label);
        permit
    }

    #[tokio::test(start_paused = true)]
    async fn a_capped_group_holds_at_most_its_cap_while_others_get_the_rest() {
        let permits = Arc::new(Permits::new(4));
        permits.set_limit(Some("a"), Some(2));
        let held: Vec<Permit> = vec![
            permits.acquire(0, None).await,
            permits.acquire(0, None).await,
            permits.acquire(0, None).await,
            permits.acquire(0, None).await,
        ];
        let (granted, mut grants) = mpsc::unbounded_channel();
        for _ in 0..5 {
            queue(&permits, &granted, Some("a"), 0, "a").await;
        }
        queue(&permits, &granted, Some("b"), 0, "b").await;
        queue(&permits, &granted, Some("b"), 0, "b").await;
        drop(held);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..4 {
            let (label, permit) = grants.recv().await.expect("a waiter is granted");
            if label == "a" {
                a.push(permit)
            } else {
                b.push(permit)
            }
        }
        assert_eq!((a.len(), b.len()), (2, 2));
        assert_eq!(permits.running(Some("a")), 2);
        assert_eq!(permits.running(Some("b")), 2);
        assert_eq!(permits.running(None), 0);
        assert_eq!(waiting(&permits), 3, "a's other three wait");
        // A permit that only a, at its cap, waits for goes back to the pool.
        drop(b.pop());
        assert_eq!(permits.available(), 1);
        assert_eq!(waiting(&permits), 3);
        // There, another group takes it at once, a's line notwithstanding.
        let c = take(&permits, "c").await;
        assert_eq!(permits.available(), 0);
        drop(c);
        assert_eq!(permits.available(), 1);
        assert!(grants.try_recv().is_err(), "a stayed at its cap");
        assert_eq!(permits.running(Some("a")), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_permit_of_a_capped_group_lets_its_next_waiter_in() {
        let permits = Arc::new(Permits::new(2));
        permits.set_limit(Some("a"), Some(1));
        let a1 = take(&permits, "a").await;
        let (granted, mut grants) = mpsc::unbounded_channel();
        queue(&permits, &granted, Some("a"), 0, "a2").await;
        assert_eq!(permits.available(), 1, "a2 waits with a permit free");
        let b1 = take(&permits, "b").await;
        queue(&permits, &granted, Some("b"), 0, "b2").await;
        // b's permit: a is at its cap, so b's next waiter gets it.
        drop(b1);
        let b2 = next_grant(&mut grants, "b2").await;
        // a's permit: a is under its cap again, and gets it back.
        drop(a1);
        let a2 = next_grant(&mut grants, "a2").await;
        assert_eq!(permits.running(Some("a")), 1);
        assert_eq!(permits.available(), 0);
        drop((a2, b2));
        assert_eq!(permits.available(), 2);
        assert_eq!(held_in_all(&permits), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cap_raised_while_waiting_lets_waiters_in_at_once() {
        let permits = Arc::new(Permits::new(4));
        permits.set_limit(Some("a"), Some(1));
        let a1 = take(&permits, "a").await;
        let (granted, mut grants) = mpsc::unbounded_channel();
        for _ in 0..3 {
            queue(&permits, &granted, Some("a"), 0, "a").await;
        }
        assert_eq!(permits.available(), 3);
        permits.set_limit(Some("a"), Some(3));
        // Handed out within the call.
        assert_eq!(permits.available(), 1);
        assert_eq!(permits.running(Some("a")), 3);
        assert_eq!(waiting(&permits), 1);
        let a2 = next_grant(&mut grants, "a").await;
        let a3 = next_grant(&mut grants, "a").await;
        permits.set_limit(Some("a"), None);
        assert_eq!(permits.available(), 0);
        assert_eq!(waiting(&permits), 0);
        let a4 = next_grant(&mut grants, "a").await;
        assert_eq!(permits.running(Some("a")), 4);
        drop((a1, a2, a3, a4));
        assert_eq!(permits.available(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn time_at_a_cap_earns_no_burst_later() {
        let permits = Arc::new(Permits::new(2));
        permits.set_limit(Some("a"), Some(1));
        let a1 = take(&permits, "a").await;
        let mut held = Some(permits.acquire(0, None).await);
        let (granted, mut grants) = mpsc::unbounded_channel();
        for _ in 0..20 {
            queue(&permits, &granted, Some("a"), 0, "a").await;
        }
        for _ in 0..40 {
            queue(&permits, &granted, Some("b"), 0, "b").await;
        }
        // a waits at its cap while b is served long.
        let capped = serve(&mut held, &mut grants, 20).await;
        assert!(capped.iter().all(|l| *l == "b"), "{capped:?}");
        permits.set_limit(Some("a"), None);
        let after = serve(&mut held, &mut grants, 20).await;
        assert!(longest_run(&after, "a") <= 2, "no burst: {after:?}");
        let a = after.iter().filter(|l| **l == "a").count();
        assert!((9..=11).contains(&a), "equal weights: {after:?}");
        drop(a1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cap_of_zero_lets_none_of_the_group_run() {
        let permits = Arc::new(Permits::new(2));
        permits.set_limit(Some("a"), Some(0));
        let (granted, mut grants) = mpsc::unbounded_channel();
        queue(&permits, &granted, Some("a"), 0, "a").await;
        let b = take(&permits, "b").await;
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        assert!(grants.try_recv().is_err(), "a never runs");
        assert_eq!(permits.available(), 1);
        assert_eq!(permits.running(Some("a")), 0);
        permits.set_limit(Some("a"), Some(1));
        let a = next_grant(&mut grants, "a").await;
        assert_eq!(permits.available(), 0);
        drop((a, b));
        assert_eq!(permits.available(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_capped_waiter_that_gives_up_leaves_the_counts_right() {
        let permits = Arc::new(Permits::new(2));
        permits.set_limit(Some("a"), Some(1));
        let a1 = take(&permits, "a").await;
        give_up(&permits, "a").await;
        {
            let state = permits.lock();
            assert!(state.shares.lines.is_empty(), "{state:?}");
            assert!(state.shares.turns.is_empty(), "{state:?}");
        }
        assert_eq!(permits.running(Some("a")), 1);
        assert_eq!(permits.available(), 1);
        drop(a1);
        assert_eq!(permits.running(Some("a")), 0);
        assert_eq!(permits.available(), 2);
        assert_eq!(held_in_all(&permits), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_permit_handed_to_a_capped_waiter_that_gives_up_is_counted_back() {
        let permits = Arc::new(Permits::new(1));
        permits.set_limit(Some("g"), Some(1));
        let held = permits.acquire(0, None).await;
        let group: Arc<str> = Arc::from("g");
        let mut gives_up = Box::pin(permits.acquire(0, Some(&group)));
        assert!(futures::poll!(&mut gives_up).is_pending(), "in line");
        let (granted, mut grants) = mpsc::unbounded_channel();
        queue(&permits, &granted, Some("h"), 0, "h").await;
        // The permit goes to g's waiter (g now at its cap), which drops it
        // before taking it: g's count goes back down, and h gets it.
        drop(held);
        assert_eq!(permits.running(Some("g")), 1);
        drop(gives_up);
        let h = next_grant(&mut grants, "h").await;
        assert_eq!(permits.running(Some("g")), 0);
        assert_eq!(permits.running(Some("h")), 1);
        drop(h);
        assert_eq!(permits.available(), 1);
        assert_eq!(held_in_all(&permits), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn share_running_counts_the_permits_each_group_holds() {
        let permits = Arc::new(Permits::new(3));
        let a1 = take(&permits, "a").await;
        let a2 = take(&permits, "a").await;
        let default = permits.acquire(0, None).await;
        assert_eq!(permits.running(Some("a")), 2);
        assert_eq!(permits.running(None), 1);
        assert_eq!(permits.running(Some("b")), 0);
        let (granted, mut grants) = mpsc::unbounded_channel();
        queue(&permits, &granted, Some("b"), 0, "b").await;
        drop(a1);
        let b = next_grant(&mut grants, "b").await;
        assert_eq!(permits.running(Some("a")), 1);
        assert_eq!(permits.running(Some("b")), 1);
        drop((a2, b, default));
        assert_eq!(permits.running(Some("a")), 0);
        assert_eq!(held_in_all(&permits), 0);
        assert_eq!(permits.available(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn counts_of_groups_holding_nothing_are_bounded() {
        let permits = Arc::new(Permits::new(4));
        for i in 0..KEEP_COUNTS + 10 {
            drop(take(&permits, &format!("g{i}")).await);
        }
        assert_eq!(permits.lock().shares.held.len(), KEEP_COUNTS);
        let busy = [
            take(&permits, "h1").await,
            take(&permits, "h2").await,
            take(&permits, "h3").await,
        ];
        assert_eq!(permits.lock().shares.held.len(), KEEP_COUNTS + 3);
        drop(busy);
        assert_eq!(permits.lock().shares.held.len(), KEEP_COUNTS);
        assert_eq!(held_in_all(&permits), 0);
    }
}
