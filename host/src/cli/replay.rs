//! `host replay RECORD`: one recorded attempt run again in this process,
//! every host call answered from its record (no grants, no network, no
//! clock), and the verdict: identical, or where and how it diverged.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde_json::json;
use taskhost::logline::Stream;
use taskhost::runtime::record::{AttemptRecord, RecordFile, ReplayReport, ReplayRequest, Verdict};
use taskhost::runtime::{AttemptError, GuestSink, Runtime, Secrets};
use taskhost::units::parse_duration;

use super::args::{CacheArgs, RawArg, SocketArg};
use super::exit::usage;
use super::report::{StderrSink, print_json, print_output};

/// The largest record file read.
const MAX_RECORD_FILE: u64 = 1 << 30;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// A record file (`host run --record FILE`, `host record export`), or a task of the daemon: its id or name (its record and plugin are fetched from the daemon; the replay runs here).
    #[arg(value_name = "FILE|ID|NAME")]
    record: PathBuf,
    /// Which attempt of the record to replay [default: the last].
    #[arg(long, value_name = "N")]
    attempt: Option<u32>,
    /// Replay this component instead of the recorded one (another build of it): the verdict says whether it now ends the same and where it diverged [default: the recorded plugin's path, if it still holds the recorded digest].
    #[arg(long, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// Look the recorded attempt's secrets up again in this directory (a file per secret) [default: this process's environment, a variable per secret name]. Each must have the value the attempt saw (its digest is recorded, never the value).
    #[arg(long, value_name = "DIR")]
    secrets_dir: Option<PathBuf>,
    /// Stop the replay by force after this long [default: the recorded attempt's duration, doubled, and 10s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Print the verdict as one JSON object on stdout (the output is then not printed).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    raw: RawArg,
    #[command(flatten)]
    cache: CacheArgs,
    #[command(flatten)]
    socket: SocketArg,
}

/// Where a replayed guest's lines go: stderr, tagged as `host run` tags them.
struct Lines(StderrSink);

impl GuestSink for Lines {
    fn line(&self, stream: Stream, text: &str) {
        self.0.line(stream, text);
    }

    fn progress(&self, _: u64, _: u64) {}
}

/// Reads a record file, bounded.
fn read_record(path: &Path) -> anyhow::Result<RecordFile> {
    let cannot =
        |e: &dyn std::fmt::Display| usage(format!("cannot read `{}`: {e}", path.display()));
    let size = std::fs::metadata(path).map_err(|e| cannot(&e))?.len();
    if size > MAX_RECORD_FILE {
        return Err(usage(format!(
            "`{}` is {size} bytes, more than any record this host writes",
            path.display()
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| cannot(&e))?;
    RecordFile::decode(&bytes).map_err(|e| cannot(&e))
}

/// The attempt `wanted` of the file (the last when none).
fn pick(file: RecordFile, wanted: Option<u32>, path: &Path) -> anyhow::Result<AttemptRecord> {
    file.take_attempt(wanted).map_err(|held| {
        usage(match wanted {
            _ if held.is_empty() => format!("`{}` holds no attempt", path.display()),
            Some(n) => format!(
                "`{}` holds no attempt {n}: it holds attempt {held}",
                path.display()
            ),
            None => format!("`{}` holds no attempt", path.display()),
        })
    })
}

/// A task's record and, unless --plugin names another, its plugin's
/// bytes, from the daemon.
async fn from_daemon(
    args: &ReplayArgs,
    before_verb: Option<&Path>,
) -> anyhow::Result<(AttemptRecord, Option<Vec<u8>>)> {
    let target = args.record.display().to_string();
    let client = super::client::connect(&args.socket, before_verb).await?;
    let bytes = super::client::record::fetch(&client, &target, args.attempt).await?;
    let file = RecordFile::decode(&bytes)
        .map_err(|e| anyhow::anyhow!("the daemon's record of `{target}`: {e}"))?;
    let record = pick(file, args.attempt, &args.record)?;
    let plugin = match &args.plugin {
        Some(_) => None,
        None => Some(
            client
                .download(record.start.plugin)
                .await
                .map_err(super::exit::client)?,
        ),
    };
    Ok((record, plugin))
}

pub async fn replay(args: ReplayArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    // A path that is there is a file; anything else names a task.
    let (record, downloaded) = if args.record.is_file() {
        let file = read_record(&args.record)?;
        (pick(file, args.attempt, &args.record)?, None)
    } else {
        from_daemon(&args, before_verb.as_deref()).await?
    };
    let start = &record.start;
    let runtime = Runtime::new(&args.cache.runtime_config()?)?;
    let plugin = match (&args.plugin, downloaded) {
        (None, Some(bytes)) => runtime
            .load_bytes(Arc::from(bytes), &start.source)
            .await
            .map_err(usage)?,
        (Some(path), _) => runtime.load_file(path).await.map_err(usage)?,
        (None, None) => runtime
            .load_file(Path::new(&start.source))
            .await
            .map_err(|e| {
                usage(format!(
                    "the recorded plugin `{}` cannot be loaded ({e}): give it with --plugin PATH",
                    start.source
                ))
            })?,
    };
    let same = plugin.digest() == start.plugin;
    if !same && args.plugin.is_none() {
        return Err(usage(format!(
            "`{}` is no longer the recorded plugin ({}): give the recorded build with \
             --plugin PATH, or this one explicitly to see how it fares",
            start.source, start.plugin
        )));
    }
    let names: Vec<&str> = start.secrets.iter().map(|s| s.name.as_str()).collect();
    let secrets = match &args.secrets_dir {
        Some(dir) => Secrets::for_daemon(Some(dir), &[]),
        None => Secrets::from_environment(names.iter().copied()),
    }
    .map_err(usage)?;
    let sink = StderrSink::new(format!("{} replay", start.name));
    if !same {
        sink.note(&format!(
            "replaying another build ({}) against the record of {}",
            plugin.digest(),
            start.plugin
        ));
    }
    let lines = Arc::new(Lines(sink));
    let attempt = start.attempt;
    let report = runtime
        .replay(
            &plugin,
            ReplayRequest {
                record: record.clone(),
                secrets,
                sink: Arc::clone(&lines) as Arc<dyn GuestSink>,
                deadline: args.timeout,
            },
        )
        .await
        .map_err(usage)?;
    let sink = &lines.0;
    for note in &report.notes {
        sink.note(note);
    }
    let verdict = verdict_text(&report);
    if args.json {
        print_json(&json_report(&record, &report, same));
    } else {
        if let Ok(output) = &report.result {
            print_output(output, args.raw.raw);
        }
        sink.note(&format!(
            "attempt {attempt} of task {} ({}): {}; {} of {} recorded host calls answered",
            start.name,
            start.task_id,
            match report.verdict {
                Verdict::Diverged(_) => "stopped where it diverged".to_owned(),
                _ => outcome_text(&report.result),
            },
            report.calls_used,
            report.calls_recorded
        ));
        sink.note(&verdict);
    }
    Ok(u8::from(report.verdict != Verdict::Identical))
}

/// How the replayed attempt ended, in words.
fn outcome_text(result: &Result<Vec<u8>, AttemptError>) -> String {
    match result {
        Ok(output) => format!("completed ({} bytes of output)", output.len()),
        Err(AttemptError::Fail { reason, .. }) => format!("failed: {reason}"),
        Err(AttemptError::Fatal { reason, .. }) => format!("failed for good: {reason}"),
        Err(AttemptError::Canceled) => "canceled".to_owned(),
        Err(AttemptError::Aborted) => "aborted by force".to_owned(),
    }
}

/// The verdict, in words.
fn verdict_text(report: &ReplayReport) -> String {
    match &report.verdict {
        Verdict::Identical => format!(
            "identical: the output, {} line{} and outcome ({}) are the recorded ones",
            report.end.line_count,
            if report.end.line_count == 1 { "" } else { "s" },
            report.end.outcome
        ),
        Verdict::Diverged(d) => match &d.recorded {
            Some(recorded) => format!(
                "diverged at host call {}: the guest asked {}, where the record holds {recorded}",
                d.call, d.asked
            ),
            None => format!(
                "diverged at host call {}: the guest asked {}, and the record ends before it",
                d.call, d.asked
            ),
        },
        Verdict::Differs(what) => format!(
            "not identical: every host call was answered, but these differ: {}",
            what.join("; ")
        ),
        Verdict::Truncated(n) => format!(
            "the record was truncated after {n} host calls (its budget, --record-budget): \
             the replay went that far, and what followed was not kept"
        ),
    }
}

fn json_report(record: &AttemptRecord, report: &ReplayReport, same: bool) -> serde_json::Value {
    let (verdict, divergence, differs) = match &report.verdict {
        Verdict::Identical => ("identical", None, Vec::new()),
        Verdict::Diverged(d) => (
            "diverged",
            Some(json!({"call": d.call, "asked": d.asked, "recorded": d.recorded})),
            Vec::new(),
        ),
        Verdict::Differs(what) => ("differs", None, what.clone()),
        Verdict::Truncated(_) => ("truncated", None, Vec::new()),
    };
    json!({
        "verdict": verdict,
        "divergence": divergence,
        "differs": differs,
        "task_id": record.start.task_id,
        "name": record.start.name,
        "attempt": record.start.attempt,
        "plugin": record.start.plugin.to_string(),
        "same_plugin": same,
        "outcome": report.end.outcome.to_string(),
        "recorded_outcome": record.end.outcome.to_string(),
        "output": report.result.as_ref().ok().map(|o| String::from_utf8_lossy(o).into_owned()),
        "lines": report.end.line_count,
        "calls_used": report.calls_used,
        "calls_recorded": report.calls_recorded,
        "notes": report.notes,
    })
}
