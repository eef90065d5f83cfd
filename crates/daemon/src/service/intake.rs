//! Owns what a submit request must satisfy before anything is recorded,
//! and what it becomes: its grants against the daemon's ceilings (HTTP
//! hosts, directories, environment, memory), its name, slot and policy, and
//! the supervisor's spec of its task. Pure functions of the request, the
//! plugin and the settings; `backend/submit.rs` calls them.

use std::sync::Arc;

use taskhost_core::controller::AdmissionPolicy;
use taskhost_core::outcome::{RejectionKind, TaskOutcome};
use taskhost_core::supervisor::{RestartPolicy, Resume, TaskBody, TaskId, TaskSpec};
use taskhost_core::units::format_size;
use taskhost_runtime::plugin_task::resolve_slot;

use crate::service::namespace::{Ns, bare};
use taskhost_runtime::{ComponentKind, DirGrant, HttpAllow, PluginInfo};

use crate::config::DirAllow;
use crate::store::postgres::Names;
use crate::wire::protocol::SubmitRequest;

/// Refuses outbound HTTP grants beyond the daemon's own `allow_http`,
/// naming the first one and how the operator widens the ceiling.
pub(crate) fn check_http_ceiling(
    ceiling: &[HttpAllow],
    wanted: &[HttpAllow],
) -> Result<(), String> {
    let Some(over) = HttpAllow::first_uncovered(ceiling, wanted) else {
        return Ok(());
    };
    Err(if ceiling.is_empty() {
        format!(
            "--allow-http {over}: this daemon allows no outbound HTTP; its operator can allow \
             it with `allow_http = [\"{over}\"]` in the config file or `host serve --allow-http {over}`"
        )
    } else {
        let allowed: Vec<String> = ceiling.iter().map(ToString::to_string).collect();
        format!(
            "--allow-http {over} is beyond what this daemon allows ({}); ask for one of \
             those, or its operator can add `{over}` to allow_http in the config file \
             or `host serve --allow-http {over}`",
            allowed.join(", ")
        )
    })
}

/// Refuses a directory grant outside the daemon's `allow_dirs` (compared
/// once symbolic links and `..` are resolved), or a writable one under a
/// read-only entry.
pub(crate) fn check_dir_ceiling(allowed: &[DirAllow], dirs: &[DirGrant]) -> Result<(), String> {
    let roots: Vec<(std::path::PathBuf, &DirAllow)> = allowed
        .iter()
        .filter_map(|a| Some((std::fs::canonicalize(&a.path).ok()?, a)))
        .collect();
    for dir in dirs {
        let real = std::fs::canonicalize(&dir.host).map_err(|e| {
            format!(
                "directory grant `{}` cannot be resolved: {e}",
                dir.host.display()
            )
        })?;
        let within = |(root, _): &&(std::path::PathBuf, &DirAllow)| real.starts_with(root);
        if roots
            .iter()
            .filter(within)
            .any(|(_, a)| dir.read_only || !a.read_only)
        {
            continue;
        }
        let grant = format!("{}::{}", dir.host.display(), dir.guest);
        return Err(if roots.iter().any(|r| within(&r)) {
            format!(
                "--dir {grant}: this daemon allows only read-only grants there; add `:ro`, \
                 or its operator can allow writing with `host serve --allow-dir {}`",
                dir.host.display()
            )
        } else if allowed.is_empty() {
            format!(
                "--dir {grant}: this daemon allows no directory grants; its operator can \
                 allow some with `host serve --allow-dir {}` or `allow_dirs = [\"{}\"]` in \
                 the config file",
                dir.host.display(),
                dir.host.display()
            )
        } else {
            let shown: Vec<String> = allowed.iter().map(ToString::to_string).collect();
            format!(
                "--dir {grant} is outside the directories this daemon allows ({}); grant \
                 one under those, or its operator can add it with `host serve --allow-dir {}`",
                shown.join(", "),
                dir.host.display()
            )
        });
    }
    Ok(())
}

/// Refuses an environment variable the daemon's `allow_env` does not name.
pub(crate) fn check_env_ceiling<'a>(
    allowed: &[String],
    mut names: impl Iterator<Item = &'a str>,
) -> Result<(), String> {
    let covered = |name: &str| {
        allowed.iter().any(|a| match a.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => a == name,
        })
    };
    match names.find(|name| !covered(name)) {
        None => Ok(()),
        Some(name) => Err(format!(
            "--env {name}: this daemon does not let submissions set `{name}` (its allow_env: \
             {}); its operator can add it with `host serve --allow-env {name}`",
            if allowed.is_empty() {
                "none".to_owned()
            } else {
                allowed.join(", ")
            }
        )),
    }
}

/// Refuses a memory limit above the daemon's `memory_ceiling`, naming both
/// and the fix: `asked` is the submission's `--max-memory`, `limit` what
/// its attempts would get (the daemon's default when it asked for none).
pub(crate) fn check_memory_ceiling(
    ceiling: u64,
    asked: Option<u64>,
    limit: u64,
) -> Result<(), String> {
    if limit <= ceiling {
        return Ok(());
    }
    let (limit_text, ceiling_text) = (format_size(limit), format_size(ceiling));
    Err(match asked {
        Some(_) => format!(
            "--max-memory {limit_text} is above this daemon's memory ceiling of \
             {ceiling_text}; ask for {ceiling_text} or less, or its operator can raise it \
             with `host serve --memory-ceiling {limit_text}` or `memory_ceiling = \
             \"{limit_text}\"` in the config file"
        ),
        None => format!(
            "this daemon's default memory limit ({limit_text}, its max_memory) is above its \
             memory ceiling of {ceiling_text}; ask for --max-memory {ceiling_text} or less, \
             or its operator can lower max_memory or raise memory_ceiling"
        ),
    })
}

/// A submission's name, slot and policy once it has its id, written once
/// for a daemon and for a cluster: the name given, else `<plugin>-<id>`
/// (`<schedule>-<id>` for a schedule's firing); the slot given, else the
/// plugin's resource template filled from the params, else the name (the
/// schedule's name for its firings); the policy given, else the plugin's
/// default.
pub(crate) fn naming(
    request: &SubmitRequest,
    info: &PluginInfo,
    id: TaskId,
) -> Result<(String, String, AdmissionPolicy), String> {
    if !request.args.is_empty() && info.kind != ComponentKind::Command {
        return Err(format!(
            "`{}` is a task plugin, which takes no arguments: give it --param K=V (arguments, \
             --arg and `-- ARGS`, are for WASI commands)",
            info.name
        ));
    }
    // A schedule's name is its namespace's key.
    let schedule = request.schedule.as_deref().map(bare);
    // A deployment's tasks are named after it.
    let deployed = (request.deployment.as_deref()).map(|d| d.split_once('@').map_or(d, |(n, _)| n));
    let name = request.name.clone().unwrap_or_else(|| {
        let prefix = schedule.or(deployed).unwrap_or(&info.name);
        format!("{prefix}-{id}")
    });
    // A schedule's firings share the schedule's slot unless told
    // otherwise, so that its policy decides what an overlap does.
    let slot = resolve_slot(
        request.slot.as_deref(),
        info.resource.as_ref(),
        &request.params,
        schedule.unwrap_or(&name),
    )
    .map_err(|e| e.to_string())?;
    let policy = request
        .policy
        .unwrap_or_else(|| AdmissionPolicy::from(info.default_policy));
    for (what, text) in [("task name", &name), ("slot", &slot)] {
        if text.chars().any(char::is_control) {
            return Err(format!(
                "the {what} `{}` holds a control character: names are printable text",
                text.escape_debug()
            ));
        }
    }
    let ns = Ns::named(request.namespace.as_deref());
    Ok((ns.key(&name), ns.key(&slot), policy))
}

/// [`naming`] for the cluster's database, which gives the id.
pub(crate) fn names(request: &SubmitRequest, info: &PluginInfo) -> Names {
    let (request, info) = (request.clone(), info.clone());
    Box::new(move |id| naming(&request, &info, id))
}

/// The supervisor's spec of a submission's task: its policies from the
/// request, resuming where it stood.
pub(crate) fn spec_for(
    request: &SubmitRequest,
    name: String,
    slot: String,
    body: Arc<dyn TaskBody>,
    resume: Resume,
) -> TaskSpec {
    let mut spec = TaskSpec::with_body(name, body)
        .with_slot(slot)
        .with_restart(request.restart.unwrap_or(RestartPolicy::Never))
        .with_max_retries(request.max_retries)
        .with_timeout(request.timeout.unwrap_or_default())
        .with_priority(request.priority)
        .resuming(resume);
    if let Some(share) = Ns::named(request.namespace.as_deref()).share() {
        spec = spec.with_share(share);
    }
    if let Some(schedule) = &request.schedule {
        spec = spec.with_schedule(schedule.as_str());
    }
    if let Some(parent) = request.parent {
        spec = spec.with_parent(TaskId::from_u64(parent));
    }
    if let Some(backoff) = request.backoff.clone() {
        spec = spec.with_backoff(backoff);
    }
    spec
}

/// The outcomes a graceful stop with a durable store gives, which the next
/// start replaces with the real end.
pub(crate) fn left_for_next_start(outcome: &TaskOutcome) -> bool {
    matches!(
        outcome,
        TaskOutcome::Canceled
            | TaskOutcome::ForceAborted
            | TaskOutcome::Rejected {
                kind: RejectionKind::ShuttingDown,
                ..
            }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_limit_above_the_ceiling_names_both_and_the_fix() {
        assert_eq!(
            check_memory_ceiling(64 << 20, Some(64 << 20), 64 << 20),
            Ok(())
        );
        assert_eq!(check_memory_ceiling(64 << 20, None, 32 << 20), Ok(()));
        assert_eq!(
            check_memory_ceiling(64 << 20, Some(128 << 20), 128 << 20).unwrap_err(),
            "--max-memory 128MiB is above this daemon's memory ceiling of 64MiB; ask for \
             64MiB or less, or its operator can raise it with `host serve --memory-ceiling \
             128MiB` or `memory_ceiling = \"128MiB\"` in the config file"
        );
        let default = check_memory_ceiling(64 << 20, None, 256 << 20).unwrap_err();
        assert!(
            default.starts_with("this daemon's default memory limit (256MiB"),
            "{default}"
        );
    }
}
