//! Owns the bridge between the supervisor and the runtime: [`PluginTask`], the
//! [`TaskBody`] whose every attempt is a fresh instance of a WebAssembly
//! plugin, [`resolve_slot`], which picks a plugin task's admission slot, and
//! the plugin's default policy as the controller's [`AdmissionPolicy`].
//! The supervisor does not know plugins exist; the runtime does not know
//! tasks exist; this module is the only place that knows both.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use taskhost_runtime::prelude::*;
//!
//! let runtime = Arc::new(Runtime::new(&RuntimeConfig::default())?);
//! let plugin = runtime.load_file("target/plugins/hello.wasm".as_ref()).await?;
//! let supervisor = Supervisor::default();
//! let task = PluginTask::new(&runtime, &plugin).input(b"hi".to_vec());
//! let report = supervisor.add(TaskSpec::once("hello", task)).report().await;
//! assert_eq!(report.outcome, TaskOutcome::Completed { output: b"hi".to_vec() });
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::attempt::AttemptRequest;
use crate::children::Parking;
use crate::contract::{DefaultPolicy, ResourceTemplate, TemplateError};
use crate::facts::{AttemptFacts, StopSignals};
use crate::failure::AttemptError;
use crate::output::GuestSink;
use crate::plugin::Plugin;
use crate::runtime::Runtime;
use crate::sandbox::Sandbox;
use taskhost_core::controller::AdmissionPolicy;
use taskhost_core::logline::{LineSink, Stream};
use taskhost_core::supervisor::{AttemptContext, RunFuture, TaskBody, TaskError};

/// A task body that runs a plugin: every attempt instantiates it afresh with
/// the same input, params and grants.
#[derive(Clone)]
pub struct PluginTask {
    runtime: Arc<Runtime>,
    plugin: Arc<Plugin>,
    input: Arc<[u8]>,
    params: Arc<[(String, String)]>,
    args: Arc<[String]>,
    sandbox: Arc<Sandbox>,
    sink: Option<Arc<dyn LineSink>>,
    /// Shared by every attempt, not copied for each.
    record: Option<Arc<crate::record::RecordSettings>>,
}

impl std::fmt::Debug for PluginTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginTask")
            .field("plugin", &self.plugin.info().name)
            .field("digest", &self.plugin.digest())
            .finish_non_exhaustive()
    }
}

impl PluginTask {
    /// A task of `plugin` with no input, no params and nothing granted.
    pub fn new(runtime: &Arc<Runtime>, plugin: &Arc<Plugin>) -> Self {
        Self {
            runtime: Arc::clone(runtime),
            plugin: Arc::clone(plugin),
            input: Arc::from(&[][..]),
            params: Arc::from(Vec::new()),
            args: Arc::from(Vec::new()),
            sandbox: Arc::new(Sandbox::default()),
            sink: None,
            record: None,
        }
    }

    /// The input bytes every attempt's `run` gets.
    pub fn input(mut self, input: impl Into<Arc<[u8]>>) -> Self {
        self.input = input.into();
        self
    }

    /// The params the guest reads (and the resource template is filled
    /// from), in order.
    pub fn params(mut self, params: Vec<(String, String)>) -> Self {
        self.params = params.into();
        self
    }

    /// A WASI command's arguments after its name (`argv[1..]`), in order;
    /// a task plugin reads none.
    pub fn args(mut self, args: Vec<String>) -> Self {
        self.args = args.into();
        self
    }

    /// What the guest may touch. Check it against the plugin's declared
    /// capabilities first (`Sandbox::check_capabilities`).
    pub fn sandbox(mut self, sandbox: Sandbox) -> Self {
        self.sandbox = Arc::new(sandbox);
        self
    }

    /// Where the guest's lines go besides the supervisor's events (a task
    /// log, a terminal).
    pub fn sink(mut self, sink: Arc<dyn LineSink>) -> Self {
        self.sink = Some(sink);
        self
    }

    /// Records every attempt of the task into `settings`' sink (see
    /// [`record`](crate::record)).
    pub fn record(mut self, settings: crate::record::RecordSettings) -> Self {
        self.record = Some(Arc::new(settings));
        self
    }

    /// The plugin.
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }
}

impl TaskBody for PluginTask {
    fn attempt(&self, ctx: AttemptContext) -> BoxFuture<'static, Result<RunFuture, TaskError>> {
        let task = self.clone();
        let signals = StopSignals {
            cancel: ctx.cancellation().clone(),
            abort: ctx.abort_flag(),
        };
        let facts = Arc::new(AttemptFacts {
            task_id: ctx.task_id().get(),
            name: ctx.name().to_string(),
            slot: ctx.slot().to_string(),
            attempt: ctx.attempt(),
            params: task.params.to_vec(),
            args: task.args.to_vec(),
        });
        let sink = Arc::new(ContextSink {
            ctx,
            forward: task.sink.clone(),
        });
        let handover = Arc::clone(&sink);
        // The sink holds the attempt's context: it parks it too, with no
        // allocation of its own per attempt.
        let parking: Arc<dyn Parking> = Arc::clone(&sink) as _;
        let request = AttemptRequest {
            facts,
            input: Arc::clone(&task.input),
            sandbox: Arc::clone(&task.sandbox),
            sink,
            parking: Some(parking),
            record: task.record.clone(),
        };
        Box::pin(async move {
            let prepared = task
                .runtime
                .prepare_attempt(&task.plugin, &request, &signals)
                .await
                .map_err(task_error)?;
            let input = request.input;
            let run: RunFuture = Box::pin(async move {
                let (result, stopped) = prepared.run_stopping_later(&input).await;
                // A stopped attempt's instance is dropped after its outcome
                // is out, before its permit and slot are freed.
                if let Some(stopped) = stopped {
                    handover.ctx.finish_after_outcome(Box::new(move |then| {
                        stopped.release_then(move || then.done());
                    }));
                }
                result.map_err(task_error)
            });
            Ok(run)
        })
    }

    fn hurry(
        &self,
        deadline: std::time::Instant,
        abort: &Arc<std::sync::atomic::AtomicBool>,
    ) -> Option<Box<dyn Send>> {
        Some(Box::new(self.runtime.hurry_at(deadline, Arc::clone(abort))))
    }

    fn describe(&self) -> String {
        self.plugin.info().name.clone()
    }

    fn code_digest(&self) -> Option<String> {
        Some(self.plugin.digest_text().to_owned())
    }
}

fn task_error(err: AttemptError) -> TaskError {
    match err {
        AttemptError::Fail { reason, exit_code } => TaskError::Fail { reason, exit_code },
        AttemptError::Fatal { reason, exit_code } => TaskError::Fatal { reason, exit_code },
        AttemptError::Canceled | AttemptError::Aborted => TaskError::Canceled,
    }
}

/// The attempt's concurrency permit, parked while its guest waits for a
/// child.
impl Parking for ContextSink {
    fn park(&self) -> bool {
        self.ctx.park()
    }

    fn unpark(&self) -> crate::children::ChildFuture<()> {
        let ctx = self.ctx.clone();
        Box::pin(async move { ctx.unpark().await })
    }
}

/// Turns a guest's lines into the supervisor's events and forwards them to
/// the task's own sink.
struct ContextSink {
    ctx: AttemptContext,
    forward: Option<Arc<dyn LineSink>>,
}

impl GuestSink for ContextSink {
    fn line(&self, stream: Stream, text: &str) {
        self.ctx.line(stream, text);
        if let Some(forward) = &self.forward {
            forward.push(self.ctx.attempt(), stream, text);
        }
    }

    fn progress(&self, done: u64, total: u64) {
        self.ctx.progress(done, total);
        if let Some(forward) = &self.forward {
            forward.progress(self.ctx.attempt(), done, total);
        }
    }
}

/// Picks a plugin task's slot: an explicit slot wins, else the plugin's
/// resource template filled from the params, else the task name.
pub fn resolve_slot(
    explicit: Option<&str>,
    template: Option<&ResourceTemplate>,
    params: &[(String, String)],
    name: &str,
) -> Result<String, TemplateError> {
    match (explicit, template) {
        (Some(slot), _) => Ok(slot.to_owned()),
        (None, Some(template)) => template.fill(params),
        (None, None) => Ok(name.to_owned()),
    }
}

impl From<DefaultPolicy> for AdmissionPolicy {
    fn from(policy: DefaultPolicy) -> Self {
        match policy {
            DefaultPolicy::Queue => Self::Queue,
            DefaultPolicy::Replace => Self::Replace,
            DefaultPolicy::DropIfRunning => Self::DropIfRunning,
        }
    }
}
