//! Owns a replay: one recorded attempt run again, without grants, network
//! or clock, every host call (outbound HTTP and the files opened through
//! directory grants too) answered from its record, and the verdict:
//! identical, diverged at a call (what the guest asked, what the record
//! holds), or ended differently. Secrets are looked up again by name and
//! must have the recorded digests.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use super::files::ReplayDirs;
use super::format::{AttemptRecord, EndKind, RecordEnd};
use super::record_end;
use super::tape::{Divergence, Replaying, Stop};
use crate::attempt::{AttemptEnv, AttemptRequest, ReplaySetup};
use crate::facts::{AttemptFacts, StopSignals};
use crate::failure::AttemptError;
use crate::output::GuestSink;
use crate::plugin::Plugin;
use crate::runtime::Runtime;
use crate::sandbox::{DirGrant, Sandbox};
use crate::secrets::{SecretRef, Secrets};

/// What to replay, and with what.
pub struct ReplayRequest {
    /// The record.
    pub record: AttemptRecord,
    /// Where the record's secrets are looked up again by name.
    pub secrets: Secrets,
    /// Where the replayed guest's lines go.
    pub sink: Arc<dyn GuestSink>,
    /// How long the replay may run before it is stopped by force (none:
    /// the recorded duration, doubled, and 10 s more).
    pub deadline: Option<Duration>,
}

/// A replay's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every call was answered, and the output, lines and outcome are the
    /// recorded ones.
    Identical,
    /// The guest asked what the record does not hold.
    Diverged(Divergence),
    /// Every call was answered, but what it said or how it ended differs:
    /// these differ (`output`, `log lines`, `outcome`).
    Differs(Vec<String>),
    /// The guest reached the end of a record whose budget ran out after
    /// this many calls: what followed was not kept.
    Truncated(u32),
}

/// What a replay did.
#[derive(Debug)]
pub struct ReplayReport {
    /// How the replayed attempt ended.
    pub result: Result<Vec<u8>, AttemptError>,
    /// Its end, in the record's terms.
    pub end: RecordEnd,
    /// The verdict.
    pub verdict: Verdict,
    /// Recorded calls the replay used, of how many.
    pub calls_used: usize,
    /// How many calls the record holds.
    pub calls_recorded: usize,
    /// What the replay could not give the guest as it was (what it wrote
    /// through directory grants, their metadata), said so a divergence
    /// there is understood.
    pub notes: Vec<String>,
}

/// Why a replay could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The record cannot be read.
    #[error(transparent)]
    Record(#[from] super::format::RecordError),
    /// A secret is missing or has another value.
    #[error("{0}")]
    Secret(String),
    /// The attempt could not be instantiated.
    #[error("the replay could not start: {0}")]
    Start(String),
}

impl Runtime {
    /// Replays one recorded attempt of `plugin` (the recorded component, or
    /// another build of it) against its record.
    pub async fn replay(
        &self,
        plugin: &Plugin,
        request: ReplayRequest,
    ) -> Result<ReplayReport, ReplayError> {
        let record = &request.record;
        let start = &record.start;
        if !start.input_kept {
            return Err(ReplayError::Start(
                "the record does not hold the attempt's input, which was larger than the \
                 record's budget: record it with a larger --record-budget"
                    .into(),
            ));
        }
        check_secrets(record, &request.secrets)?;
        let calls = record.decode_calls()?;
        let calls_recorded = calls.len();
        let end = if record.truncated {
            Some(Stop::Truncated)
        } else if record.end.outcome == EndKind::Aborted {
            Some(Stop::RecordedAbort)
        } else {
            None
        };
        let replaying = Replaying::new(calls, end);
        // Fresh read-only grants, filled from the record as the guest opens.
        let dirs = ReplayDirs::new(&start.dirs)
            .map_err(|e| ReplayError::Start(format!("cannot make its directories: {e}")))?;
        let setup = ReplaySetup {
            replaying: Arc::clone(&replaying),
            seed: start.seed,
            kv: start.kv_store,
            http: start.http,
        };
        let env = AttemptEnv {
            limits: self.guest_limits(),
            secrets: Arc::new(request.secrets),
            ..AttemptEnv::default()
        };
        let attempt = AttemptRequest {
            facts: Arc::new(AttemptFacts {
                task_id: start.task_id,
                name: start.name.clone(),
                slot: start.slot.clone(),
                attempt: start.attempt,
                params: start.params.clone(),
                args: start.args.clone(),
            }),
            input: Arc::from(&start.input[..]),
            sandbox: Arc::new(Sandbox {
                env: start.env.clone(),
                secrets: start
                    .secrets
                    .iter()
                    .map(|s| SecretRef {
                        var: s.var.clone(),
                        name: s.name.clone(),
                    })
                    .collect(),
                config: start.config.clone(),
                kv: start.kv.clone(),
                dirs: dirs
                    .dirs
                    .iter()
                    .map(|(host, guest)| DirGrant {
                        host: host.clone(),
                        guest: guest.clone(),
                        read_only: true,
                    })
                    .collect(),
                max_memory: start.max_memory,
                ..Sandbox::default()
            }),
            sink: Arc::clone(&request.sink),
            parking: None,
            record: None,
        };
        let signals = StopSignals::default();
        let started = std::time::Instant::now();
        let prepared = self
            .prepare_replay(plugin, &attempt, &env, &signals, &setup)
            .await
            .map_err(|e| ReplayError::Start(e.to_string()))?;
        let lines = Arc::clone(&prepared.capture);
        // A guest stopped by force may spin past its last call: it gets
        // twice its recorded time (and a second) to reach where it was.
        let slack = match record.end.outcome {
            EndKind::Aborted => Duration::from_secs(1),
            _ => Duration::from_secs(10),
        };
        let deadline = request.deadline.unwrap_or_else(|| {
            Duration::from_millis(record.end.duration_ms.saturating_mul(2)) + slack
        });
        let aborter = {
            let signals = signals.clone();
            tokio::spawn(async move {
                tokio::time::sleep(deadline).await;
                signals.abort();
            })
        };
        let _hurry = self.hurry_at(started + deadline, Arc::clone(&signals.abort));
        let mut result = prepared.run(&attempt.input).await;
        aborter.abort();
        drop(dirs);
        let (stop, divergence, calls_used, _) = replaying.result();
        // A guest stopped where the recorded one was aborted ends as it did.
        if stop == Some(Stop::RecordedAbort) {
            result = Err(AttemptError::Aborted);
        }
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let replayed = record_end(&result, lines.lines(), duration_ms);
        let verdict = match (stop, divergence) {
            (_, Some(divergence)) => Verdict::Diverged(divergence),
            (Some(Stop::Truncated), _) => Verdict::Truncated(record.call_count),
            _ => compare(&record.end, &replayed, calls_used, calls_recorded),
        };
        Ok(ReplayReport {
            result,
            end: replayed,
            verdict,
            calls_used,
            calls_recorded,
            notes: notes(record),
        })
    }
}

/// Looks every recorded secret up again and checks its digest.
fn check_secrets(record: &AttemptRecord, secrets: &Secrets) -> Result<(), ReplayError> {
    for secret in &record.start.secrets {
        let value = secrets.resolve(&secret.name).map_err(|e| {
            ReplayError::Secret(format!(
                "the recorded attempt read secret `{}`: {e}",
                secret.name
            ))
        })?;
        if super::format::sha256(value.as_bytes()) != secret.digest {
            return Err(ReplayError::Secret(format!(
                "secret `{}` has another value than the recorded attempt saw (its digest \
                 differs): give the value it had",
                secret.name
            )));
        }
    }
    Ok(())
}

/// What differs between the recorded end and the replayed one.
fn compare(recorded: &RecordEnd, replayed: &RecordEnd, used: usize, held: usize) -> Verdict {
    let mut differs = Vec::new();
    if recorded.outcome != replayed.outcome || recorded.reason != replayed.reason {
        differs.push(format!(
            "outcome (recorded: {}, replayed: {})",
            recorded.outcome, replayed.outcome
        ));
    }
    if recorded.output != replayed.output {
        differs.push("output".to_owned());
    }
    if recorded.lines != replayed.lines {
        differs.push(format!(
            "log lines (recorded: {}, replayed: {})",
            recorded.line_count, replayed.line_count
        ));
    }
    if used < held {
        differs.push(format!(
            "host calls (the guest made {used} of the {held} recorded)"
        ));
    }
    if differs.is_empty() {
        Verdict::Identical
    } else {
        Verdict::Differs(differs)
    }
}

/// What a replay of this record cannot give the guest.
fn notes(record: &AttemptRecord) -> Vec<String> {
    let start = &record.start;
    let mut notes = Vec::new();
    if !start.dirs.is_empty() {
        notes.push(format!(
            "the attempt was granted {}: the replay gives it fresh read-only directories \
             holding the files it opened and listed, as recorded; what it wrote there, and \
             metadata such as times, are not recorded",
            start.dirs.join(", ")
        ));
    }
    notes
}
