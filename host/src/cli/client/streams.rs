//! `host events` and `host logs`: streams printed as they arrive; a closed
//! stdout (`| head`) ends them quietly.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use taskhost::daemon::protocol::{EventFilter, Reply, Request};
use taskhost::supervisor::{Event, EventKind, TaskRef};
use taskhost::units::format_duration;

use super::super::args::SocketArg;
use super::super::exit;
use super::super::report::{json_line, progress_text, say, visible};

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Keep streaming new events until interrupted.
    #[arg(long, short)]
    follow: bool,
    /// Only events of this task (its id or name).
    #[arg(long, value_name = "ID|NAME")]
    task: Option<String>,
    /// Only events of these kinds, such as task-finished or AttemptFailed (repeatable, or comma-separated).
    #[arg(long = "kind", value_name = "KIND", value_delimiter = ',', value_parser = parse_kind)]
    kinds: Vec<EventKind>,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub socket: SocketArg,
}

/// An event kind as written in JSON (`TaskFinished`) or in kebab case
/// (`task-finished`).
fn parse_kind(text: &str) -> Result<EventKind, String> {
    let pascal: String = text
        .split(['-', '_'])
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect();
    serde_json::from_value(serde_json::Value::String(pascal)).map_err(|_| {
        format!(
            "unknown event kind `{text}`: use one such as TaskAdded, AttemptStarting, AttemptFailed, \
             TaskFinished, GuestLog, Progress, ControllerRejected (see `host events --json`)"
        )
    })
}

pub async fn events(args: EventsArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    let filter = EventFilter {
        task: args.task.as_deref().map(TaskRef::parse),
        kinds: args.kinds.clone(),
    };
    let mut replies = client
        .request(Request::Events {
            follow: args.follow,
            filter,
        })
        .await
        .map_err(exit::client)?;
    let mut stdout = std::io::stdout().lock();
    loop {
        match replies.next_reply().await.map_err(exit::client)? {
            Reply::Event(e) => {
                let line = if args.json {
                    json_line(&e.to_json())
                } else {
                    visible(&event_line(&e)).into_owned()
                };
                if writeln!(stdout, "{line}")
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    return Ok(0);
                }
            }
            Reply::Dropped(n) => eprintln!("({n} events were dropped: this reader fell behind)"),
            Reply::End => return Ok(0),
            _ => {}
        }
    }
}

/// One event as a line for people: seq, kind, task, then what matters for
/// the kind.
fn event_line(e: &Event) -> String {
    let mut line = format!("{:>6} {:<24}", e.seq, format!("{:?}", e.kind));
    if let Some(id) = e.task_id {
        line.push_str(&format!(" {id} {}", e.name.as_deref().unwrap_or("")));
    }
    if let Some(attempt) = e.attempt {
        line.push_str(&format!(" attempt {attempt}"));
    }
    let ms = |v: u64| format_duration(std::time::Duration::from_millis(v));
    match e.kind {
        EventKind::GuestLog => {
            let stream = e.stream.map(|s| s.to_string()).unwrap_or_default();
            line.push_str(&format!(
                " [{stream}] {}",
                e.reason.as_deref().unwrap_or("")
            ));
            return line;
        }
        EventKind::Progress => {
            line.push_str(&format!(
                " {}",
                progress_text(e.done.unwrap_or(0), e.total.unwrap_or(0))
            ));
            return line;
        }
        _ => {}
    }
    if let Some(slot) = &e.slot {
        line.push_str(&format!(" slot={slot}"));
    }
    if let Some(schedule) = &e.schedule {
        line.push_str(&format!(" schedule={schedule}"));
    }
    if let Some(outcome) = e.outcome {
        line.push_str(&format!(" outcome={outcome}"));
    }
    if let Some(rejection) = e.rejection {
        line.push_str(&format!(" rejection={rejection}"));
    }
    if let Some(delay) = e.delay_ms {
        line.push_str(&format!(" delay={}", ms(delay)));
    }
    if let Some(took) = e.duration_ms {
        line.push_str(&format!(" took={}", ms(took)));
    }
    if let Some(detail) = &e.detail {
        line.push_str(&format!(" {detail}"));
    }
    if let Some(dropped) = e.dropped {
        line.push_str(&format!(" dropped={dropped}"));
    }
    if let Some(reason) = &e.reason {
        line.push_str(&format!(": {reason}"));
    }
    line
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The task: its id, or its name.
    #[arg(value_name = "ID|NAME")]
    target: String,
    /// Keep streaming until the task ends.
    #[arg(long, short)]
    follow: bool,
    /// One JSON object per line: attempt, stream, text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub socket: SocketArg,
}

pub async fn logs(args: LogsArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    let mut replies = client
        .request(Request::Logs {
            target: TaskRef::parse(&args.target),
            follow: args.follow,
        })
        .await
        .map_err(exit::client)?;
    let mut stdout = std::io::stdout().lock();
    let mut lines = 0u64;
    loop {
        match replies.next_reply().await.map_err(exit::client)? {
            Reply::Log(line) => {
                lines += 1;
                let text = if args.json {
                    json_line(&line)
                } else {
                    format!("[{}] {}", line.stream, visible(&line.text))
                };
                // A closed stdout (`| head`) ends the stream quietly.
                if writeln!(stdout, "{text}")
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    return Ok(0);
                }
            }
            Reply::Dropped(n) => eprintln!("({n} log lines were dropped: this reader fell behind)"),
            Reply::End => {
                if lines == 0 && !args.json {
                    say(&format!("{} has written no lines", args.target));
                }
                return Ok(0);
            }
            _ => {}
        }
    }
}
