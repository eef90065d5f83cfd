//! Owns how results and guest output look: the one-object JSON result, the
//! human summary on stderr, the tagged guest lines (with a live progress
//! line when stderr is a terminal), and the one way text that may come from
//! a guest (outputs, reasons, lines, names) is made safe for a terminal:
//! [`visible`] for a line, [`visible_output`] for an output, [`json_line`]
//! for JSON. Every verb prints guest text through these.

use std::borrow::Cow;
use std::io::{IsTerminal, Write};
use std::sync::Mutex;

use taskhost::logline::Stream;
use taskhost::outcome::TaskOutcome;
use taskhost::supervisor::TaskReport;
use taskhost::units::format_duration;

pub use taskhost::daemon::json::JsonResult;

/// Writes the task's result: one JSON object on stdout, or its output
/// ([`print_output`]) on stdout and the human summary on stderr.
pub fn print_result(json: Option<&JsonResult<'_>>, report: &TaskReport, raw: bool) {
    match json {
        Some(json) => print_json(json),
        None => {
            if let TaskOutcome::Completed { output } = &report.outcome {
                print_output(output, raw);
            }
            say(&summary(report));
        }
    }
}

/// Writes a task's output (or a stored value) on stdout: into a pipe or a
/// file exactly as it is; on a terminal as text ([`visible_output`]) unless
/// `raw`, and followed by a newline when it does not end with one, so what
/// comes next starts a line of its own.
pub fn print_output(bytes: &[u8], raw: bool) {
    let terminal = std::io::stdout().is_terminal();
    let shown = if terminal && !raw {
        visible_output(bytes)
    } else {
        Cow::Borrowed(bytes)
    };
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(&shown);
    if terminal && !bytes.is_empty() && !bytes.ends_with(b"\n") {
        let _ = stdout.write_all(b"\n");
    }
    let _ = stdout.flush();
}

/// Writes one line for people on stderr, with any guest text in it shown
/// as text ([`visible`]).
pub fn say(line: &str) {
    let mut bytes = visible(line).into_owned().into_bytes();
    bytes.push(b'\n');
    let _ = std::io::stderr().lock().write_all(&bytes);
}

/// Writes `value` as one line of JSON on stdout ([`json_line`]).
pub fn print_json(value: &impl serde::Serialize) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", json_line(value));
    let _ = stdout.flush();
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

/// The attempt history of a task that did not complete after more than
/// one attempt, one note per attempt (`  attempt 2: failed: … (1.2ms)`);
/// nothing for any other report.
pub fn history(report: &TaskReport) -> Vec<String> {
    if matches!(report.outcome, TaskOutcome::Completed { .. }) || report.attempts <= 1 {
        return Vec::new();
    }
    report
        .history
        .iter()
        .map(|record| {
            format!(
                "  attempt {}: {} ({})",
                record.attempt,
                record.result,
                format_duration(record.duration)
            )
        })
        .collect()
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
    /// Its text may hold a guest's reason: shown as text, like every line.
    pub fn status(&self, text: &str) {
        if !self.tty {
            return;
        }
        let mut state = self.state();
        let line = format!("[{}] {text}", self.tag);
        let mut bytes = b"\r\x1b[K".to_vec();
        bytes.extend_from_slice(visible(&line).as_bytes());
        state.emit(&bytes);
        state.progress_shown = true;
    }
}

/// Whether `c` acts on a terminal, or on how the text around it is shown,
/// instead of showing itself: the C0 and C1 controls and DEL (an escape
/// sequence starts with ESC or the C1 CSI; BEL ends one; CR moves back over
/// the line), the bidirectional formatting characters, which reorder what
/// is shown (the "Trojan Source" ones, U+202A to U+202E and U+2066 to
/// U+2069, and the marks U+061C, U+200E and U+200F), and the line and
/// paragraph separators U+2028 and U+2029.
fn acts(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

/// `text` with every character that [`acts`] written out as an escape
/// (`\x1b`, `\r`, `\u{9b}`, `\u{202e}`), but tabs, and newlines when
/// `keep_newlines`.
fn escaped(text: &str, keep_newlines: bool) -> Cow<'_, str> {
    let escape = |c: char| acts(c) && c != '\t' && !(keep_newlines && c == '\n');
    if !text.chars().any(escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            c if !escape(c) => out.push(c),
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

/// One line of text that may come from a guest (a log line, a reason, a
/// name), as a terminal should get it: every control character, escape
/// sequence and bidirectional override written out as an escape (`\x1b`,
/// `\r`, `\n`, `\u{9b}`, `\u{202e}`), as journalctl shows them, so it
/// cannot move the cursor, set the clipboard (OSC 52), retitle the window,
/// overwrite a summary or reorder the line. Tabs stay.
pub fn visible(text: &str) -> Cow<'_, str> {
    escaped(text, false)
}

/// Text of several lines (an error message) as [`visible`] makes a line,
/// its newlines kept.
pub fn visible_lines(text: &str) -> Cow<'_, str> {
    escaped(text, true)
}

/// A task's output as a terminal should get it: its text as
/// [`visible_lines`] makes it (an output is text of many lines: newlines and
/// tabs stay, every other control character is escaped), and each byte that
/// is not UTF-8 as `\xNN`.
pub fn visible_output(bytes: &[u8]) -> Cow<'_, [u8]> {
    if let Ok(text) = std::str::from_utf8(bytes) {
        return match visible_lines(text) {
            Cow::Borrowed(_) => Cow::Borrowed(bytes),
            Cow::Owned(text) => Cow::Owned(text.into_bytes()),
        };
    }
    let mut out = Vec::with_capacity(bytes.len() + 16);
    for chunk in bytes.utf8_chunks() {
        out.extend_from_slice(visible_lines(chunk.valid()).as_bytes());
        for byte in chunk.invalid() {
            out.extend_from_slice(format!("\\x{byte:02x}").as_bytes());
        }
    }
    Cow::Owned(out)
}

/// `value` as one line of JSON whose strings carry no character that
/// [`acts`] on a terminal: serde_json escapes the C0 controls, and the rest
/// (DEL, C1, the bidirectional overrides) is written as `\uXXXX` here. The
/// value read back is the same; only its spelling differs.
pub fn json_line(value: &impl serde::Serialize) -> String {
    // Serialising plain strings, numbers and maps cannot fail.
    let line = serde_json::to_string(value).unwrap_or_default();
    if !line.chars().any(acts) {
        return line;
    }
    // Outside strings JSON is ASCII without controls, so each such
    // character is inside a string, where `\uXXXX` means it (all of them
    // are in the Basic Multilingual Plane).
    let mut out = String::with_capacity(line.len() + 16);
    for c in line.chars() {
        if acts(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
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
