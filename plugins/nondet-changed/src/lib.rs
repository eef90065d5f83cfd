//! `nondet-changed`: `nondet` (see there), changed to read the wall clock
//! one more time at its start: the planted divergence of the replay tests.

/// This build reads the wall clock once more.
const EXTRA_CLOCK: bool = true;

include!("../../nondet/src/body.rs");
