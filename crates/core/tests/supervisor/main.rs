//! The supervisor's behaviour (docs/semantics.md), one file per area,
//! through the public API of the `taskhost` library only.
//!
//! Native bodies test the semantics exactly on a paused clock; plugin bodies
//! (the real components from `plugins/`) run on the real clock, because the
//! epoch ticker that interrupts guests is a real thread. Tests synchronise on
//! events, waiters and notifications, never on sleeps. Most tests start from
//! `common_sup::Fixture` (a supervisor with an event recorder) and compare a
//! task's events with the named sequences there.
//!
//! | file | covers |
//! |---|---|
//! | `lifecycle` | once, periodic, duplicate names, the registry bound, from-defaults |
//! | `retries` | OnFailure and Always, Fatal, the retry budget, backoff delays |
//! | `timeouts` | per-attempt timeouts of spinning guests and native bodies |
//! | `cancellation` | cooperative cancel, force-abort, stops while waiting |
//! | `identity` | ids and reservations (never shared), unique names under contention, stop claims |
//! | `concurrency` | the global `max_concurrent` bound |
//! | `events` | bounded lanes, drop reports, per-task order, panicking subscribers |
//! | `shutdown` | single-flight shutdown, stuck tasks (only those it force-aborted), admission after shutdown |

mod common_sup;

mod cancellation;
mod concurrency;
mod events;
mod identity;
mod lifecycle;
mod retries;
mod shutdown;
mod timeouts;
