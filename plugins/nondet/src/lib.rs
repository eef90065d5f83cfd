//! `nondet`: reads everything that differs between two runs, for the flight
//! recorder's tests. It reads the wall and monotonic clocks, 16 random bytes,
//! the insecure seed and an insecure number, and logs and answers them as
//! JSON with its input.
//!
//! Params: `kv` (any value): also add one to `runs` in its slot's bucket and
//! swap `last` for 4 of the random bytes; `child=DIGEST`: spawn that plugin
//! as a child with 2 random bytes as input, wait, and answer its outcome;
//! `trap`: panic when the first random byte is even; `until_cancelled`: then
//! sleep 1–8 ms (a random length) at a time, checking `is-cancelled`, until
//! asked to stop; `spin`: then busy-loop forever; `fail`: fail at the end,
//! with what it saw (so `--max-retries` gives many attempts).

/// `nondet-changed` reads the wall clock once more.
const EXTRA_CLOCK: bool = false;

include!("body.rs");
