//! The glue between [`Task`] and the wit-bindgen generated exports. Not part
//! of the public API: only [`export_task!`](crate::export_task) uses it.

use std::sync::Once;

use crate::__bindings::taskhost::plugin::types;
use crate::{Capability, Context, Level, Policy, Task, TaskError};

/// Runs `T::describe` and converts the answer to the WIT type.
pub fn describe<T: Task>() -> types::PluginInfo {
    install_panic_hook();
    let info = T::describe();
    if let Some(capacity) = info.capacity {
        crate::__bindings::taskhost::plugin::slots::declare_capacity(capacity);
    }
    types::PluginInfo {
        name: info.name,
        version: info.version,
        description: info.description,
        resource: info.resource,
        default_policy: match info.default_policy {
            Policy::Queue => types::Policy::Queue,
            Policy::Replace => types::Policy::Replace,
            Policy::DropIfRunning => types::Policy::DropIfRunning,
        },
        capabilities: info
            .capabilities
            .into_iter()
            .map(|c| match c {
                Capability::ReadDir(path) => types::Capability::ReadDir(path),
                Capability::WriteDir(path) => types::Capability::WriteDir(path),
                Capability::Env(name) => types::Capability::Env(name),
                Capability::Network => types::Capability::Network,
            })
            .collect(),
    }
}

/// Runs `T::run` with a fresh [`Context`] and converts the result to the WIT
/// types.
pub fn run<T: Task>(input: Vec<u8>) -> Result<Vec<u8>, types::TaskError> {
    install_panic_hook();
    let ctx = Context::new();
    T::run(&ctx, input).map_err(|err| match err {
        TaskError::Fail { reason, exit_code } => {
            types::TaskError::Fail(types::Failure { reason, exit_code })
        }
        TaskError::Fatal { reason, exit_code } => {
            types::TaskError::Fatal(types::Failure { reason, exit_code })
        }
        TaskError::Canceled => types::TaskError::Canceled,
    })
}

/// Installs, once per instance, a panic hook that sends
/// `panicked at <file:line:col>: <message>` to the host as an error-level log
/// line (the host puts it into the failure reason) and then runs the previous
/// hook, which prints the usual message to stderr.
fn install_panic_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let location = info.location().map(|l| (l.file(), l.line(), l.column()));
            let line = panic_line(location, info.payload_as_str());
            // Without a host (native builds) there is nobody to tell.
            if cfg!(target_arch = "wasm32") {
                crate::context::log_to_host(Level::Error, &line);
            }
            previous(info);
        }));
    });
}

/// Formats the log line the panic hook sends.
fn panic_line(location: Option<(&str, u32, u32)>, message: Option<&str>) -> String {
    let message = message.unwrap_or("Box<dyn Any>");
    match location {
        Some((file, line, column)) => format!("panicked at {file}:{line}:{column}: {message}"),
        None => format!("panicked: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_line_format() {
        assert_eq!(
            panic_line(Some(("src/lib.rs", 12, 5)), Some("boom")),
            "panicked at src/lib.rs:12:5: boom"
        );
        assert_eq!(panic_line(None, None), "panicked: Box<dyn Any>");
    }
}
