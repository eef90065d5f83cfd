//! Owns the words of an attempt that did not succeed ([`AttemptError`]) and
//! the translation of what wasmtime reports into them: a trap named with
//! what the guest said last and the top of its own backtrace, a full
//! instance pool as a failure that a retry can fix, an error and its
//! causes on one line. Which ending an attempt had is decided where it
//! ends (`attempt`); what follows from it is the supervisor's business.

#![forbid(unsafe_code)]

use wasmtime::{Trap, WasmBacktrace};

/// How an attempt ended when it did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttemptError {
    /// A retryable failure: the guest returned `fail`, trapped, or hit its
    /// memory limit.
    #[error("{reason}")]
    Fail {
        /// What happened, for people.
        reason: String,
        /// The guest's exit code, if it gave one.
        exit_code: Option<i32>,
    },
    /// A failure retrying cannot fix: the guest returned `fatal`, or the
    /// plugin could not be instantiated.
    #[error("{reason}")]
    Fatal {
        /// What happened, for people.
        reason: String,
        /// The guest's exit code, if it gave one.
        exit_code: Option<i32>,
    },
    /// The guest returned `canceled`.
    #[error("the plugin stopped on request")]
    Canceled,
    /// The attempt was force-aborted (its instance trapped on request).
    #[error("the attempt was force-aborted")]
    Aborted,
}

/// Whether `err` says the pooling allocator has no free slot (instances,
/// memories, tables or fiber stacks).
pub(crate) fn is_pool_full(err: &wasmtime::Error) -> bool {
    err.chain()
        .any(|e| e.is::<wasmtime::PoolConcurrencyLimitError>())
}

/// The retryable failure of an attempt that found the instance pool full.
pub(crate) fn pool_full(err: &wasmtime::Error) -> AttemptError {
    AttemptError::Fail {
        reason: format!(
            "the instance pool is full ({}); the attempt did not run and can be retried \
             (--restart on-failure), or give the daemon a larger --pool-instances",
            error_chain(err)
        ),
        exit_code: None,
    }
}

pub(crate) fn join(reason: &str, note: Option<String>) -> String {
    match note {
        Some(note) => format!("{reason} ({note})"),
        None => reason.to_owned(),
    }
}

/// One line naming the trap, what the guest said last (its panic message or
/// stderr tail), and the top of the guest backtrace when there is one.
pub(crate) fn describe_trap(
    err: &wasmtime::Error,
    memory: Option<String>,
    said: Option<String>,
) -> String {
    let frames: Vec<String> = err
        .downcast_ref::<WasmBacktrace>()
        .map(|trace| {
            trace
                .frames()
                .iter()
                .map(|f| match f.func_name() {
                    Some(name) => format!("{:#}", rustc_demangle::demangle(name)),
                    None => format!("<wasm function {}>", f.func_index()),
                })
                .collect()
        })
        .unwrap_or_default();
    let trap = err.downcast_ref::<Trap>();
    let mut reason = match trap {
        Some(Trap::StackOverflow) => {
            "the guest trapped: call stack exhausted (stack overflow)".to_owned()
        }
        Some(trap) => {
            let text = trap.to_string();
            format!(
                "the guest trapped: {}",
                text.strip_prefix("wasm trap: ").unwrap_or(&text)
            )
        }
        None => format!("the guest failed: {}", error_chain(err)),
    };
    // A Rust or C guest keeps its stack in linear memory: running past its
    // bottom is an out-of-bounds access, deep inside one recursive function.
    if trap == Some(&Trap::MemoryOutOfBounds)
        && frames.len() >= 16
        && frames.iter().all(|f| f == &frames[0])
    {
        reason.push_str(&format!(
            " (most likely a stack overflow: `{}` calls itself at least {} frames deep)",
            frames[0],
            frames.len()
        ));
    }
    if let Some(memory) = memory {
        reason = format!("{memory}; {reason}");
    }
    if let Some(said) = said {
        reason.push_str(&format!("; guest said: {said}"));
    }
    let shown = summarize_frames(&frames);
    if !shown.is_empty() {
        reason.push_str(&format!("; backtrace: {shown}"));
    }
    reason
}

/// The guest's own frames, innermost first, without the language runtime's
/// panic and abort machinery, repeated frames collapsed (`f ×20`).
fn summarize_frames(frames: &[String]) -> String {
    const RUNTIME: [&str; 10] = [
        "std::",
        "core::",
        "alloc::",
        "__rustc",
        "__rust_",
        "rust_panic",
        "abort",
        "panic_abort::",
        "wit_bindgen::",
        "taskhost_guest::",
    ];
    let own = frames
        .iter()
        .filter(|f| !RUNTIME.iter().any(|r| f.starts_with(r)));
    let mut runs: Vec<(&str, usize)> = Vec::new();
    for frame in own {
        match runs.last_mut() {
            Some((last, n)) if *last == frame.as_str() => *n += 1,
            _ => runs.push((frame, 1)),
        }
    }
    runs.iter()
        .take(6)
        .map(|(f, n)| {
            if *n > 1 {
                format!("{f} ×{n}")
            } else {
                (*f).to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" <- ")
}

/// The error and its causes on one line (a wasm backtrace, which wasmtime
/// attaches as a multi-line cause, is left out: `describe_trap` summarises
/// it).
pub(crate) fn error_chain(err: &wasmtime::Error) -> String {
    let mut parts: Vec<String> = err
        .chain()
        .map(|c| c.to_string())
        .filter(|c| !c.starts_with("error while executing at wasm backtrace"))
        .map(|c| c.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    parts.dedup();
    parts.join(": ")
}
