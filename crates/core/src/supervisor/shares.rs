//! Owns the share groups of the concurrency limit (`TaskSpec::with_share`;
//! tasks without one are in the default group): each group's line of
//! waiters, whose turn it is, and the permits each group holds against its
//! cap. When a permit frees up and more than one group may take it, it goes
//! to the group whose turn it is by stride scheduling: each grant moves a
//! group's pass on by a stride inversely proportional to its weight, and the
//! group with the lowest pass goes next, so groups are served in proportion
//! to their weights whatever the length of their lines. A group that starts
//! to wait starts at the current virtual time (the pass of the latest
//! grant), so time spent idle earns it no burst later. Within a group,
//! waiters are served by priority, highest first, then in arrival order.
//!
//! A group with a cap that holds that many permits is out of turn: its line
//! waits, holding nothing, and it comes back into turn, at no earlier than
//! the virtual time (time at its cap earns no credit either), as soon as it
//! holds fewer. So a group in turn is always one that may take a permit.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use tokio::sync::oneshot;

/// A share group; `None` is the default group.
pub(super) type Group = Option<Arc<str>>;

/// A waiter's place in its group's line: priority first (highest first),
/// then arrival.
pub(super) type Place = (Reverse<i32>, u64);

/// A group's turn: its pass, then the arrival of its first waiter (so that
/// equal passes go in arrival order), then the group itself.
type Turn = (u128, u64, Group);

/// How far one grant moves the pass of a group of weight 1. Large enough
/// that every `u32` weight has a stride of at least one.
const STRIDE: u128 = 1 << 32;

/// Most idle groups whose pass is remembered. Forgetting one lets it start
/// at the virtual time, at most one stride early: a bounded unfairness, in
/// exchange for bounded memory however many groups come and go.
pub(super) const MAX_IDLE: usize = 1024;

/// Most entries the counts of permits held keep before they drop those that
/// fall to 0: a group whose count goes between 0 and 1 keeps its entry
/// rather than pay an insertion and a removal per permit, and the counts
/// hold at most this many groups beyond those holding permits.
pub(super) const KEEP_COUNTS: usize = 64;

/// Maps keyed by group, hashed like the registry's.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The share groups' bookkeeping; lives under the semaphore's lock.
#[derive(Debug, Default)]
pub(super) struct Shares {
    /// The line of every group with waiters.
    pub(super) lines: Map<Group, Line>,
    /// The turn of every group with waiters that is under its cap, next
    /// first.
    pub(super) turns: BTreeSet<Turn>,
    /// The virtual time: the pass of the latest grant.
    now: u128,
    /// The passes of groups without waiters that are still ahead of the
    /// virtual time, so that leaving and coming back earns no credit.
    pub(super) idle: Map<Group, u128>,
    /// The same by pass, to forget those the virtual time caught up with.
    pub(super) idle_by_pass: BTreeSet<(u128, Group)>,
    /// Weights other than 1.
    weights: Map<Group, u32>,
    /// Permits held, by group: every group holding any, and a bounded few
    /// at 0 ([`KEEP_COUNTS`]).
    pub(super) held: Map<Group, usize>,
    /// Caps on the permits a group may hold at once.
    caps: Map<Group, usize>,
}

/// One group's waiters and its pass.
#[derive(Debug)]
pub(super) struct Line {
    pass: u128,
    pub(super) waiters: BTreeMap<Place, oneshot::Sender<()>>,
}

impl Line {
    /// The group's turn; `None` if nobody waits.
    fn turn(&self, group: &Group) -> Option<Turn> {
        let (&(_, arrival), _) = self.waiters.first_key_value()?;
        Some((self.pass, arrival, group.clone()))
    }
}

impl Shares {
    /// Whether some group that may take a permit is waiting for one.
    pub(super) fn ready(&self) -> bool {
        !self.turns.is_empty()
    }

    /// Permits `group` holds.
    pub(super) fn running(&self, group: &Group) -> usize {
        self.held.get(group).copied().unwrap_or(0)
    }

    /// Whether `group` holds as many permits as its cap allows. Without any
    /// cap, no lookup at all.
    pub(super) fn capped(&self, group: &Group) -> bool {
        !self.caps.is_empty()
            && self
                .caps
                .get(group)
                .is_some_and(|&cap| self.running(group) >= cap)
    }

    fn weight(&self, group: &Group) -> u32 {
        self.weights.get(group).copied().unwrap_or(1)
    }

    /// Sets a group's weight (0 counts as 1).
    pub(super) fn set_weight(&mut self, group: Group, weight: u32) {
        if weight > 1 {
            self.weights.insert(group, weight);
        } else {
            self.weights.remove(&group);
        }
    }

    /// Sets a group's cap (`None`: none), taking its line out of turn or
    /// putting it back. The caller hands out the permits this frees.
    pub(super) fn set_cap(&mut self, group: Group, cap: Option<usize>) {
        let was = self.capped(&group);
        match cap {
            Some(cap) => {
                self.caps.insert(group.clone(), cap);
            }
            None => {
                self.caps.remove(&group);
            }
        }
        match (was, self.capped(&group)) {
            (false, true) => {
                if let Some(turn) = self.lines.get(&group).and_then(|line| line.turn(&group)) {
                    self.turns.remove(&turn);
                }
            }
            (true, false) => self.back_in_turn(&group),
            _ => {}
        }
    }

    /// Counts a permit taken by `group`.
    pub(super) fn took(&mut self, group: &Group) {
        match self.held.get_mut(group) {
            Some(held) => *held += 1,
            None => {
                self.held.insert(group.clone(), 1);
            }
        }
    }

    /// Counts a permit `group` gave back; a group that drops below its cap
    /// is in turn again, before the caller chooses who gets the permit.
    pub(super) fn gave_back(&mut self, group: &Group) {
        let was = self.capped(group);
        if let Some(held) = self.held.get_mut(group) {
            *held -= 1;
            if *held == 0 && self.held.len() > KEEP_COUNTS {
                self.held.remove(group);
            }
        }
        if was && !self.capped(group) {
            self.back_in_turn(group);
        }
    }

    /// Puts the line of a group no longer at its cap back in turn, no
    /// earlier than the virtual time.
    fn back_in_turn(&mut self, group: &Group) {
        let now = self.now;
        if let Some(line) = self.lines.get_mut(group) {
            line.pass = line.pass.max(now);
            if let Some(turn) = line.turn(group) {
                self.turns.insert(turn);
            }
        }
    }

    /// Puts a waiter in its group's line; a group that was not waiting
    /// starts no earlier than the virtual time.
    pub(super) fn join(&mut self, group: Group, place: Place, tx: oneshot::Sender<()>) {
        let capped = self.capped(&group);
        if let Some(line) = self.lines.get_mut(&group) {
            let before = line.turn(&group);
            line.waiters.insert(place, tx);
            let after = line.turn(&group);
            if before != after && !capped {
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
        if !capped {
            self.turns.insert((pass, place.1, group.clone()));
        }
        let waiters = BTreeMap::from([(place, tx)]);
        self.lines.insert(group, Line { pass, waiters });
    }

    /// Takes a waiter out of its line; false if it is no longer there (it
    /// was handed a permit).
    pub(super) fn leave(&mut self, group: &Group, place: &Place) -> bool {
        let capped = self.capped(group);
        let Some(line) = self.lines.get_mut(group) else {
            return false;
        };
        let before = line.turn(group);
        if line.waiters.remove(place).is_none() {
            return false;
        }
        let after = line.turn(group);
        if before != after {
            if let Some(before) = before
                && !capped
            {
                self.turns.remove(&before);
            }
            match after {
                Some(after) => {
                    if !capped {
                        self.turns.insert(after);
                    }
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

    /// Takes the first waiter of the group whose turn it is, counts the
    /// permit as that group's, and moves its pass on by its stride.
    pub(super) fn next(&mut self) -> Option<(Group, oneshot::Sender<()>)> {
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
            let (turn, kept) = (line.turn(&group), line.pass);
            self.took(&group);
            match turn {
                Some(turn) => {
                    if !self.capped(&group) {
                        self.turns.insert(turn);
                    }
                }
                None => {
                    self.lines.remove(&group);
                    self.rest(group.clone(), kept);
                }
            }
            self.advance(pass);
            return Some((group, tx));
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
