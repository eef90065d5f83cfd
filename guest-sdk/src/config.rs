//! Configuration values of a task through `wasi:config/store`: [`get`] and
//! [`all`]. A task's values are its submission's (`--config-var KEY=VALUE`)
//! over the daemon's own (`host serve --config-var`, the `config_vars`
//! table); unlike `--env`, they need no capability or grant.
//!
//! ```no_run
//! use taskhost_guest::{Context, PluginInfo, Task, TaskError, config};
//!
//! struct Greet;
//!
//! impl Task for Greet {
//!     fn describe() -> PluginInfo {
//!         PluginInfo::new("greet", "0.1.0")
//!     }
//!
//!     fn run(_ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
//!         let region = config::get("region")?.unwrap_or_else(|| "local".into());
//!         Ok(format!("hello from {region}").into_bytes())
//!     }
//! }
//!
//! taskhost_guest::export_task!(Greet);
//! ```
//!
//! A plugin that uses neither function does not import the interface.

use crate::TaskError;

#[allow(missing_docs, clippy::all)]
mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "wasi:config/imports@0.2.0-rc.1",
        generate_all,
    });
}

use bindings::wasi::config::store;

/// The value of `key`, or `None` when neither the submission nor the
/// daemon sets it. An error of the host is a retryable failure.
pub fn get(key: &str) -> Result<Option<String>, TaskError> {
    store::get(key).map_err(failed)
}

/// Every key and its value, in no particular order.
pub fn all() -> Result<Vec<(String, String)>, TaskError> {
    store::get_all().map_err(failed)
}

fn failed(err: store::Error) -> TaskError {
    let why = match err {
        store::Error::Upstream(why) | store::Error::Io(why) => why,
    };
    TaskError::fail(format!("cannot read the configuration: {why}"))
}
