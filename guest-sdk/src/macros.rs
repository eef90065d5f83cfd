//! The export macro and the log macros.

/// Exports a type implementing [`Task`](crate::Task) as the plugin's
/// `describe` and `run` functions.
///
/// Invoke it exactly once, at the top level of a `cdylib` crate built for
/// `wasm32-wasip2`:
///
/// ```
/// use taskhost_guest::{Context, PluginInfo, Task, TaskError};
///
/// struct Echo;
///
/// impl Task for Echo {
///     fn describe() -> PluginInfo {
///         PluginInfo::new("echo", "0.1.0").description("Returns its input")
///     }
///
///     fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
///         Ok(input)
///     }
/// }
///
/// taskhost_guest::export_task!(Echo);
/// ```
///
/// The argument may be any type path (`export_task!(tasks::Deploy)`). The
/// macro also installs a panic hook that reports panics to the host, and it
/// embeds the WIT world the host checks the component against.
#[macro_export]
macro_rules! export_task {
    ($task:ty $(,)?) => {
        const _: () = {
            #[doc(hidden)]
            struct __TaskhostGuestExport;

            impl $crate::__bindings::Guest for __TaskhostGuestExport {
                fn describe() -> $crate::__bindings::PluginInfo {
                    $crate::__export::describe::<$task>()
                }

                fn run(
                    input: ::std::vec::Vec<u8>,
                ) -> ::core::result::Result<::std::vec::Vec<u8>, $crate::__bindings::TaskError>
                {
                    $crate::__export::run::<$task>(input)
                }
            }

    $crate::__bindings::export!(__TaskhostGuestExport with_types_in $crate::__bindings);
        };
    };
}

/// Formats a message and writes it to the task's log at the given
/// [`Level`](crate::Level).
///
/// ```no_run
/// # fn f(ctx: &taskhost_guest::Context) {
/// use taskhost_guest::Level;
/// taskhost_guest::log!(ctx, Level::Info, "copied {} files", 3);
/// # }
/// ```
#[macro_export]
macro_rules! log {
    ($ctx:expr, $level:expr, $($arg:tt)+) => {
        ($ctx).log($level, &::std::format!($($arg)+))
    };
}

/// Formats a message and writes it to the task's log at
/// [`Level::Trace`](crate::Level::Trace): `taskhost_guest::trace!(ctx, "x = {}", x)`.
#[macro_export]
macro_rules! trace {
    ($ctx:expr, $($arg:tt)+) => {
        $crate::log!($ctx, $crate::Level::Trace, $($arg)+)
    };
}

/// Formats a message and writes it to the task's log at
/// [`Level::Debug`](crate::Level::Debug): `taskhost_guest::debug!(ctx, "x = {}", x)`.
#[macro_export]
macro_rules! debug {
    ($ctx:expr, $($arg:tt)+) => {
        $crate::log!($ctx, $crate::Level::Debug, $($arg)+)
    };
}

/// Formats a message and writes it to the task's log at
/// [`Level::Info`](crate::Level::Info): `taskhost_guest::info!(ctx, "x = {}", x)`.
#[macro_export]
macro_rules! info {
    ($ctx:expr, $($arg:tt)+) => {
        $crate::log!($ctx, $crate::Level::Info, $($arg)+)
    };
}

/// Formats a message and writes it to the task's log at
/// [`Level::Warn`](crate::Level::Warn): `taskhost_guest::warn!(ctx, "x = {}", x)`.
#[macro_export]
macro_rules! warn {
    ($ctx:expr, $($arg:tt)+) => {
        $crate::log!($ctx, $crate::Level::Warn, $($arg)+)
    };
}

/// Formats a message and writes it to the task's log at
/// [`Level::Error`](crate::Level::Error): `taskhost_guest::error!(ctx, "x = {}", x)`.
#[macro_export]
macro_rules! error {
    ($ctx:expr, $($arg:tt)+) => {
        $crate::log!($ctx, $crate::Level::Error, $($arg)+)
    };
}
