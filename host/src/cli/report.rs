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
/// terminal, progress is one line redrawn in place.
pub struct StderrSink {
    tag: String,
    tty: bool,
    progress_shown: Mutex<bool>,
}

impl StderrSink {
    pub fn new(tag: String) -> Self {
        Self {
            tag,
            tty: std::io::stderr().is_terminal(),
            progress_shown: Mutex::new(false),
        }
    }

    /// Prints a host-side note about the task, such as an attempt start.
    pub fn note(&self, text: &str) {
        self.print(&format!("[{}] {text}", self.tag));
    }

    fn print(&self, line: &str) {
        let mut shown = self
            .progress_shown
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut stderr = std::io::stderr().lock();
        if *shown {
            let _ = write!(stderr, "\r\x1b[K");
            *shown = false;
        }
        let _ = writeln!(stderr, "{}", visible(line));
    }

    /// Clears a live progress line, if one is shown.
    pub fn clear_progress(&self) {
        let mut shown = self
            .progress_shown
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if *shown {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[K");
            *shown = false;
        }
    }
}

impl StderrSink {
    /// Prints one guest line.
    pub fn line(&self, stream: Stream, text: &str) {
        self.print(&format!("[{} {stream}] {text}", self.tag));
    }

    /// Shows a live status line (on a terminal only), redrawn in place.
    pub fn status(&self, text: &str) {
        if !self.tty {
            return;
        }
        let mut shown = self
            .progress_shown
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let _ = write!(std::io::stderr().lock(), "\r\x1b[K[{}] {text}", self.tag);
        *shown = true;
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
