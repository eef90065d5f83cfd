//! `host submit PLUGIN --batch FILE`: a file of submissions (one JSON object
//! per line, as `POST /api/tasks` takes it) sent in calls of up to
//! [`MAX_BATCH`] tasks, the next call's lines read while the daemon places
//! the last. Memory stays at two calls' worth whatever the file's length.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use taskhost::daemon::Replies;
use taskhost::daemon::protocol::{
    BatchItem, MAX_BATCH, MAX_FRAME, Placement, Reply, Request, SubmitJson, SubmitRequest,
};
use taskhost::runtime::Digest;

use super::super::exit::{self, kind_code, usage};
use super::super::report::{print_json, say};
use super::submit::SubmitArgs;

/// What one call carries at most, in bytes of its requests (room left for
/// the rest of the frame).
const CALL_BYTES: usize = MAX_FRAME - (256 << 10);

/// One call's requests with the line each came from.
struct Call {
    requests: Vec<SubmitRequest>,
    lines: Vec<usize>,
}

/// Counts over the whole file.
#[derive(Default)]
struct Tally {
    accepted: usize,
    existing: usize,
    refused: usize,
    /// The exit code of the first refusal.
    code: Option<u8>,
}

pub async fn submit_batch(
    args: &SubmitArgs,
    file: &Path,
    before_verb: Option<PathBuf>,
) -> anyhow::Result<u8> {
    if let Some(flag) = args.task_flag() {
        return Err(usage(format!(
            "{flag} does not go with --batch: each line of the file gives its task's settings \
             as POST /api/tasks takes them (such as {{\"params\": {{\"k\": \"v\"}}}})"
        )));
    }
    let task = args.task();
    let shown = task.plugin.display().to_string();
    let bytes = std::fs::read(&task.plugin)
        .map_err(|e| usage(format!("cannot read plugin `{shown}`: {e}")))?;
    taskhost::runtime::check_header(&shown, &bytes).map_err(usage)?;
    let mut reader: Box<dyn BufRead> = if file == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        let opened = std::fs::File::open(file)
            .map_err(|e| usage(format!("cannot read `{}`: {e}", file.display())))?;
        Box::new(std::io::BufReader::new(opened))
    };
    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    let digest = client.ensure_plugin(&bytes).await.map_err(exit::client)?;
    let json = task.json;
    let mut tally = Tally::default();
    let mut line_no = 0;
    let mut in_flight: Option<(Replies, Vec<usize>)> = None;
    loop {
        // The next call is read while the daemon places the one in flight.
        let next = read_call(&mut reader, &mut line_no, digest, file);
        if let Some((replies, lines)) = in_flight.take() {
            answer(replies, &lines, json, &mut tally).await?;
        }
        let call = match next {
            Ok(Some(call)) => call,
            Ok(None) => break,
            Err(e) => {
                summary(&tally);
                return Err(e);
            }
        };
        let replies = client
            .request(Request::SubmitBatch(call.requests))
            .await
            .map_err(exit::client)?;
        in_flight = Some((replies, call.lines));
    }
    summary(&tally);
    Ok(tally.code.unwrap_or(0))
}

/// Reads up to a call's worth of lines; `None` at the end of the file. A
/// line that is not a submission stops the file there (exit 2, naming it).
fn read_call(
    reader: &mut dyn BufRead,
    line_no: &mut usize,
    digest: Digest,
    file: &Path,
) -> anyhow::Result<Option<Call>> {
    let mut call = Call {
        requests: Vec::new(),
        lines: Vec::new(),
    };
    let mut bytes = 0;
    let first = *line_no + 1;
    let mut text = String::new();
    while call.requests.len() < MAX_BATCH && bytes < CALL_BYTES {
        text.clear();
        let read = reader
            .read_line(&mut text)
            .map_err(|e| usage(format!("cannot read `{}`: {e}", file.display())))?;
        if read == 0 {
            break;
        }
        *line_no += 1;
        if text.trim().is_empty() {
            continue;
        }
        let at = |e: String| {
            usage(format!(
                "{}:{line_no}: {e} (nothing from line {first} on was sent)",
                file.display()
            ))
        };
        let request = serde_json::from_str::<SubmitJson>(&text)
            .map_err(|e| e.to_string())
            .and_then(|json| json.request(Some(digest)))
            .map_err(at)?;
        bytes += text.len() + request.input.len();
        call.requests.push(request);
        call.lines.push(*line_no);
    }
    Ok((!call.requests.is_empty()).then_some(call))
}

/// Prints one call's answers, in the order of its lines.
async fn answer(
    mut replies: Replies,
    lines: &[usize],
    json: bool,
    tally: &mut Tally,
) -> anyhow::Result<()> {
    let items = match replies.next_reply().await.map_err(exit::client)? {
        Reply::SubmittedBatch(items) if items.len() == lines.len() => items,
        other => {
            return Err(exit::ExitError::error(
                exit::EXIT_DAEMON,
                format!("the daemon answered a batch with {other:?}"),
            ));
        }
    };
    for (item, line) in items.iter().zip(lines) {
        if json {
            let mut value =
                serde_json::to_value(taskhost::daemon::json::batch_item(item)).unwrap_or_default();
            value["line"] = (*line).into();
            print_json(&value);
        }
        match item {
            BatchItem::Submitted(s) => {
                if let Placement::Rejected(outcome) = &s.placement {
                    // Rejected at intake (a full queue, a busy slot under
                    // drop-if-running): its final outcome, as `host submit`
                    // says it.
                    tally.refused += 1;
                    tally.code.get_or_insert(exit::outcome_code(outcome));
                    say(&format!(
                        "line {line}: {} (id {}) rejected: {}",
                        s.name,
                        s.id,
                        outcome.reason().unwrap_or("rejected")
                    ));
                    continue;
                }
                tally.accepted += 1;
                tally.existing += usize::from(s.existing);
                if !json {
                    println!("{}", s.id);
                }
            }
            BatchItem::Refused { kind, message } => {
                tally.refused += 1;
                tally.code.get_or_insert(kind_code(*kind));
                say(&format!("line {line}: refused: {message}"));
            }
        }
    }
    Ok(())
}

fn summary(tally: &Tally) {
    let existing = match tally.existing {
        0 => String::new(),
        n => format!(" ({n} already submitted with their idempotency key)"),
    };
    say(&format!(
        "submitted {} tasks{existing}, {} refused or rejected",
        tally.accepted, tally.refused
    ));
}
