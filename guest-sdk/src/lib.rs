//! Write task plugins for the taskhost WebAssembly task host.
//!
//! A task plugin is a WebAssembly component built for `wasm32-wasip2` that
//! the `host` binary runs in a sandbox, once per attempt, in a fresh instance.
//! With this crate you write a type that implements [`Task`] and export it
//! with [`export_task!`]; the crate hides the component-model bindings
//! (wit-bindgen) and the plugin contract (`wit/task-plugin.wit`,
//! `taskhost:plugin@0.1.2`).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use taskhost_guest::{Context, PluginInfo, Policy, Task, TaskError};
//!
//! struct Greet;
//!
//! impl Task for Greet {
//!     fn describe() -> PluginInfo {
//!         PluginInfo::new("greet", "0.1.0")
//!             .description("Greets someone, slowly")
//!             .resource("greeting/{who}")
//!             .default_policy(Policy::Queue)
//!     }
//!
//!     fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
//!         let who = ctx.param_or("who", "world");
//!         let delay_ms: u64 = ctx.param_parse_or("delay_ms", 100)?;
//!         taskhost_guest::info!(ctx, "attempt {}: greeting {who}", ctx.attempt());
//!         if ctx.sleep(Duration::from_millis(delay_ms)).is_cancelled() {
//!             return Err(TaskError::canceled());
//!         }
//!         if who.is_empty() {
//!             return Err(taskhost_guest::fatal("`who` must not be empty").with_exit_code(2));
//!         }
//!         Ok(format!("hello, {who}!").into_bytes())
//!     }
//! }
//!
//! taskhost_guest::export_task!(Greet);
//! ```
//!
//! Build it as a `cdylib` with `cargo build --target wasm32-wasip2 --release`
//! and run it with `host run target/wasm32-wasip2/release/greet.wasm --param who=you`.
//! The crate's `README.md` walks through a first plugin step by step.
//!
//! # What is where
//!
//! - [`Task`]: the trait a plugin implements; [`export_task!`] exports it.
//! - [`PluginInfo`], [`Policy`], [`Capability`]: what
//!   [`describe`](Task::describe) returns: name, version, description, the
//!   resource template, the default admission policy and the capabilities the
//!   plugin needs granted.
//! - [`Context`]: the host calls available while running: cancellation
//!   ([`Context::is_cancelled`], [`Context::sleep`]), logs
//!   ([`Context::log`] and the macros [`trace!`], [`debug!`], [`info!`],
//!   [`warn!`], [`error!`]), [`Context::progress`], and the attempt's facts
//!   and params ([`Context::param`], [`Context::param_parse_or`], ...).
//! - `http` (cargo feature `http`, off by default; `json` adds JSON bodies):
//!   outbound HTTP requests, `http::get`, `http::post`, `http::Request`, to
//!   the hosts the submission grants with `--allow-http`.
//! - [`TaskError`], [`fail`], [`fatal`], [`canceled`]: how an attempt fails.
//!   Any [`std::error::Error`] converts into a retryable failure, so `?`
//!   works.
//!
//! # Panics, traps and output
//!
//! A panic ends the attempt as failed: the panic message and location are
//! sent to the host as an error log line (`panicked at src/lib.rs:3:5: ...`)
//! and become the failure reason. `wasm32-wasip2` aborts on panic, so a panic
//! cannot be caught. Anything written to stdout or stderr (`println!`,
//! `eprintln!`) is captured into the task's log by the host.

#![warn(missing_docs)]

pub mod children;
pub mod config;
mod context;
mod error;
mod export;
#[cfg(feature = "http")]
pub mod http;
mod info;
pub mod kv;
mod macros;

/// The glue [`export_task!`] expands to. Not part of the public API.
#[doc(hidden)]
pub mod __export {
    pub use crate::export::{describe, run};
}

/// The wit-bindgen generated bindings for `wit/task-plugin.wit`. Not part of
/// the public API: use [`Task`], [`Context`] and [`export_task!`] instead.
#[doc(hidden)]
#[allow(missing_docs, clippy::all)]
pub mod __bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "task-plugin",
        pub_export_macro: true,
        default_bindings_module: "$crate::__bindings",
    });
}

pub use context::{Context, Level, SleepStatus};
pub use error::{TaskError, canceled, fail, fatal};
pub use info::{Capability, PluginInfo, Policy};

/// The secret the submission gave as variable `var` (`--secret VAR` or
/// `--env-secret VAR=NAME`), which the host looks up as each attempt
/// starts. Not granted: a fatal error naming the flag, as retrying will not
/// grant it. Keep it out of the output and the log: those are stored.
pub fn secret(var: &str) -> Result<String, TaskError> {
    std::env::var(var).map_err(|_| {
        fatal(format!(
            "secret `{var}` is not granted to this task: submit it with --secret {var} \
             (or --env-secret {var}=NAME)"
        ))
    })
}

/// A task plugin: what it is ([`describe`](Task::describe)) and what it does
/// ([`run`](Task::run)).
///
/// Implement it on a unit struct and export it with [`export_task!`]. The
/// type is never instantiated: both functions are associated functions, and
/// every attempt runs in a fresh WebAssembly instance, so nothing (not even a
/// `static`) survives from one attempt to the next.
pub trait Task {
    /// Says what the plugin is, what it acts on and what it needs.
    ///
    /// Called at load time (`host inspect`, `host submit`), without a
    /// [`Context`], under a small time and memory limit: answer quickly and
    /// without side effects.
    fn describe() -> PluginInfo;

    /// Runs one attempt.
    ///
    /// `input` is the submission's input bytes (`--input`, `--input-file`;
    /// empty if none). On success the returned bytes are the task's output.
    /// Return [`TaskError::canceled()`] soon after [`Context::is_cancelled`]
    /// turns true or a [`Context::sleep`] reports
    /// [`SleepStatus::Cancelled`].
    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, TaskError>;
}

/// The result type of [`Task::run`]: output bytes, or a [`TaskError`].
pub type TaskResult<T = Vec<u8>> = Result<T, TaskError>;
