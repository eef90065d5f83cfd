//! # taskhost
//!
//! The library behind the `host` binary: a sandboxed WebAssembly runtime for
//! task plugins (this crate's [`runtime`]), with the supervisor and the keyed
//! admission controller built on top of it.
//!
//! Reading order: [`runtime`] (how one attempt runs), then [`resource`] and
//! [`units`] (small value types used at the edges). See `ARCHITECTURE.md` at
//! the repository root for the code map and the path of one submission.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use taskhost::runtime::{AttemptFacts, AttemptRequest, NullSink, Runtime, RuntimeConfig, Sandbox, StopSignals};
//!
//! let runtime = Runtime::new(&RuntimeConfig::default())?;
//! let plugin = runtime.load_file("target/plugins/hello.wasm".as_ref()).await?;
//! let request = AttemptRequest {
//!     facts: Arc::new(AttemptFacts { task_id: 1, name: "hello-1".into(), slot: "hello-1".into(), attempt: 1, params: vec![] }),
//!     input: Arc::from(&b"hi"[..]),
//!     sandbox: Arc::new(Sandbox::default()),
//!     sink: Arc::new(NullSink),
//! };
//! let output = runtime.run_attempt(&plugin, &request, &StopSignals::default()).await?;
//! assert_eq!(output, b"hi");
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod controller;
pub mod daemon;
pub mod outcome;
pub mod resource;
pub mod runtime;
pub mod supervisor;
pub mod units;
