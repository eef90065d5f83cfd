//! Owns how results and guest output look: the one-object JSON result, the
//! human summary on stderr, and the tagged guest lines (with a live progress
//! line when stderr is a terminal).

use std::io::{IsTerminal, Write};
use std::sync::Mutex;

use taskhost::logline::Stream;
use taskhost::outcome::TaskOutcome;
use taskhost::supervisor::TaskReport;
use taskhost::units::format_duration;

pub use taskhost::daemon::json::JsonResult;

/// Writes the task's result: raw output or one JSON object on stdout, the
/// human summary on stderr.
pub fn print_result(json: Option<&JsonResult<'_>>, report: &TaskReport) {
    let outcome = &report.outcome;
    let mut stdout = std::io::stdout().lock();
    match json {
        Some(json) => {
            // Serialising plain strings and numbers cannot fail.
            let line = serde_json::to_string(json).unwrap_or_default();
            let _ = writeln!(stdout, "{line}");
        }
        None => {
            if let TaskOutcome::Completed { output } = outcome {
                let _ = stdout.write_all(output);
                // On a terminal, keep the summary off the output's last line.
                if std::io::stdout().is_terminal() && !output.is_empty() && !output.ends_with(b"\n")
                {
                    let _ = stdout.write_all(b"\n");
                }
            }
        }
    }
    let _ = stdout.flush();
    if json.is_none() {
        eprintln!("{}", visible(&summary(report)));
    }
}

/// `deploy-1 completed in 1 attempt (52.1ms)` and the like; the time is the
/// task's own run time, from its first attempt's start to its outcome.
pub fn summary(report: &TaskReport) -> String {
    let (name, outcome, attempts) = (&report.name, &report.outcome, report.attempts);
    let plural = if attempts == 1 { "attempt" } else { "attempts" };
    let took = format_duration(report.duration);
    match outcome {
        TaskOutcome::Completed { .. } => {
            format!("{name} completed in {attempts} {plural} ({took})")
        }
        TaskOutcome::Failed { reason, exit_code } | TaskOutcome::Fatal { reason, exit_code } => {
            let code = exit_code
                .map(|c| format!(" [exit code {c}]"))
                .unwrap_or_default();
            format!(
                "{name} {} after {attempts} {plural} ({took}): {reason}{code}",
                outcome.kind()
            )
        }
        TaskOutcome::Canceled if attempts == 0 => format!("{name} canceled before it ran"),
        TaskOutcome::Canceled => format!("{name} canceled after {attempts} {plural} ({took})"),
        TaskOutcome::ForceAborted => {
            format!(
                "{name} force-aborted: it was stopped by force after {attempts} {plural} ({took})"
            )
        }
        TaskOutcome::Panicked { reason } => format!("{name} ended by a host bug: {reason}"),
        TaskOutcome::Rejected { kind, reason } => format!("{name} rejected ({kind}): {reason}"),
    }
}

/// Prints a task's guest lines to stderr as `[name stream] text`; on a
/// terminal, progress is one line redrawn in place. Between [`StderrSink::hold`]
/// and [`StderrSink::release`] lines are gathered and written together, so a
/// burst of guest output costs a write per batch, not one per line.
pub struct StderrSink {
    tag: String,
    tty: bool,
    state: Mutex<SinkState>,
}

#[derive(Default)]
struct SinkState {
    progress_shown: bool,
    /// Bytes gathered since `hold`, written at `release` (or when large).
    held: Option<Vec<u8>>,
}

/// Held bytes past this are written out at once, keeping memory bounded.
const HELD_LIMIT: usize = 64 * 1024;

impl SinkState {
    fn emit(&mut self, bytes: &[u8]) {
        match &mut self.held {
            Some(buf) => {
                buf.extend_from_slice(bytes);
                if buf.len() >= HELD_LIMIT {
                    let _ = std::io::stderr().lock().write_all(buf);
                    buf.clear();
                }
            }
            None => {
                let _ = std::io::stderr().lock().write_all(bytes);
            }
        }
    }
}

impl StderrSink {
    pub fn new(tag: String) -> Self {
        Self {
            tag,
            tty: std::io::stderr().is_terminal(),
            state: Mutex::new(SinkState::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SinkState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gathers what is printed from now on until [`StderrSink::release`].
    pub fn hold(&self) {
        self.state().held.get_or_insert_with(Vec::new);
    }

    /// Writes what was gathered since [`StderrSink::hold`].
    pub fn release(&self) {
        if let Some(buf) = self.state().held.take() {
            let _ = std::io::stderr().lock().write_all(&buf);
        }
    }

    /// Prints a host-side note about the task, such as an attempt start.
    pub fn note(&self, text: &str) {
        self.print(&format!("[{}] {text}", self.tag));
    }

    fn print(&self, line: &str) {
        let mut state = self.state();
        let mut bytes = Vec::with_capacity(line.len() + 8);
        if state.progress_shown {
            bytes.extend_from_slice(b"\r\x1b[K");
            state.progress_shown = false;
        }
        bytes.extend_from_slice(visible(line).as_bytes());
        bytes.push(b'\n');
        state.emit(&bytes);
    }

    /// Clears a live progress line, if one is shown.
    pub fn clear_progress(&self) {
        let mut state = self.state();
        if state.progress_shown {
            state.emit(b"\r\x1b[K");
            state.progress_shown = false;
        }
    }

    /// Prints one guest line.
    pub fn line(&self, stream: Stream, text: &str) {
        self.print(&format!("[{} {stream}] {text}", self.tag));
    }

    /// Shows a live status line (on a terminal only), redrawn in place.
    pub fn status(&self, text: &str) {
        if !self.tty {
            return;
        }
        let mut state = self.state();
        let line = format!("\r\x1b[K[{}] {text}", self.tag);
        state.emit(line.as_bytes());
        state.progress_shown = true;
    }
}

/// `text` with its control characters written out as escapes (`\x1b`,
/// `\r`, `\u{9b}`), as journalctl shows them: a guest's lines and reasons
/// reach the terminal as text, and cannot move the cursor, set the
/// clipboard (OSC 52), retitle the window or overwrite a summary. Tabs
/// stay.
pub fn visible(text: &str) -> std::borrow::Cow<'_, str> {
    let control = |c: char| c != '\t' && (c.is_control() || c == '\u{7f}');
    if !text.chars().any(control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            c if control(c) && (c as u32) < 0x80 => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if control(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// How progress reads, in `host run`, `submit --wait`, `wait` and `ps`:
/// `3/10 (30%)`, or `3` when the total is unknown.
pub fn progress_text(done: u64, total: u64) -> String {
    if total > 0 {
        format!(
            "{done}/{total} ({:.0}%)",
            done as f64 * 100.0 / total as f64
        )
    } else {
        format!("{done}")
    }
}
