//! The verbs by filter: `host cancel|remove --filter` and `host rerun
//! --filter`, with `--dry-run`.

use taskhost::daemon::Client;
use taskhost::daemon::protocol::{Reply, Request, TaskFilter};

use super::super::exit::{self, EXIT_DAEMON, ExitError};
use super::super::report::{print_json, say};

/// `--filter KEY=VALUE,...` read into a filter.
pub fn task_filter(conditions: &[String]) -> anyhow::Result<TaskFilter> {
    let mut filter = TaskFilter::default();
    for condition in conditions {
        let Some((key, value)) = condition.split_once('=') else {
            return Err(exit::usage(format!(
                "--filter `{condition}`: give KEY=VALUE, KEY one of state, slot, name, plugin, \
                 outcome"
            )));
        };
        filter
            .set(key, value)
            .map_err(|e| exit::usage(format!("--filter: {e}")))?;
    }
    Ok(filter)
}

/// Sends a verb by filter and prints its answer: the count and what it
/// did, or with `dry_run` the ids that match.
pub async fn by_filter(
    client: &Client,
    request: Request,
    dry_run: bool,
    json: bool,
) -> anyhow::Result<u8> {
    let (which, did) = match &request {
        Request::RerunMatching { .. } => ("finished", "submitted again"),
        _ => ("live", "stopped"),
    };
    let Reply::Matched { count, ids, acted } = client.call(request).await.map_err(exit::client)?
    else {
        return Err(ExitError::error(
            EXIT_DAEMON,
            "the daemon answered a verb by filter with something else",
        ));
    };
    if json {
        print_json(&serde_json::json!({ "matched": count, "ids": ids, "acted": acted }));
    } else if dry_run {
        for id in &ids {
            println!("{id}");
        }
        say(&format!(
            "{count} {which} tasks match; --dry-run {did} none"
        ));
    } else {
        say(&format!("{count} {which} tasks matched; {did} {acted}"));
    }
    Ok(0)
}
