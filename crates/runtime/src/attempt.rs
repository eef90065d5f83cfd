//! Owns one attempt: a fresh store and instance, its limits (memory and
//! tables here, the other caps in `limits`), its epoch deadline callback
//! (yield to Tokio at every tick, trap when aborted), the linker of every
//! interface the guest may import, and which way the attempt ended
//! (returned, failed, trapped, ran out of memory, was aborted, found the
//! pool full), told in the words of `failure`. The host functions of our
//! own package are `host_calls`'. Retries, timeouts and outcomes belong to
//! the supervisor.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::Ordering;

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, ResourceLimiter, Store, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_config::WasiConfigVariables;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::bindings::{
    self, taskhost::plugin::children, taskhost::plugin::host, taskhost::plugin::slots,
    taskhost::plugin::types,
};
use super::children::{ChildAccess, ChildHandle, Parking};
use super::contract::ComponentKind;
use super::digest::Digest;
use super::facts::{AttemptFacts, StopSignals};
use super::failure::{AttemptError, describe_trap, error_chain, is_pool_full, join, pool_full};
use super::host_calls::HostCtx;
use super::http::{HttpHooks, OwnAddresses};
use super::kv::{KvAccess, KvHandle};
use super::limits::{GuestLimits, LimitHits, Limited};
use super::output::{Capture, CapturedStream, CommandStdout, GuestSink};
use super::plugin::Entry;
use super::reaper::Reaper;
use super::record::files::FileTape;
use super::record::tape::{Replaying, Tape};
use super::record::{AttemptRecorder, RecordSettings, RecordStart, RecordedSecret};
use super::sandbox::{CommandArgs, Sandbox};
use super::secrets::Secrets;
use taskhost_core::logline::{LogLevel, Stream};
use taskhost_core::units::format_size;

/// Largest output a `run` may return; larger output fails the attempt.
pub const MAX_OUTPUT_BYTES: usize = 16 << 20;
/// Most table elements one guest table may grow to.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// Everything needed to run one attempt of a plugin task.
#[derive(Clone)]
pub struct AttemptRequest {
    /// The attempt's facts (task id, name, slot, attempt number, params).
    pub facts: Arc<AttemptFacts>,
    /// The input bytes given to `run`.
    pub input: Arc<[u8]>,
    /// What the guest may touch.
    pub sandbox: Arc<Sandbox>,
    /// Where the guest's output goes.
    pub sink: Arc<dyn GuestSink>,
    /// How the attempt gives its concurrency permit back while its guest
    /// waits for a child (none: it keeps it; `PluginTask` sets it).
    pub parking: Option<Arc<dyn Parking>>,
    /// Whether and where the attempt is recorded (none: it is not).
    pub record: Option<Arc<RecordSettings>>,
}

/// The data of one attempt's store.
pub(crate) struct AttemptState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
    host: HostCtx,
    http: WasiHttpCtx,
    /// Checks every outbound request against the task's grant.
    http_hooks: HttpHooks,
    /// The caps of `limits` this attempt has hit.
    limits: LimitHits,
    /// What `wasi:config/store` answers.
    config: Arc<WasiConfigVariables>,
    /// The buckets `wasi:keyvalue` may open.
    kv: KvAccess,
    /// The attempt's record, while it is being recorded.
    recorder: Option<AttemptRecorder>,
    /// Reads through the directory grants, recorded or replayed.
    files: Option<Arc<FileTape>>,
}

impl AttemptState {
    /// The slot capacity the guest declared (from `describe`), if it did.
    pub(crate) fn declared_capacity(&self) -> Option<u32> {
        self.host.declared_capacity()
    }

    /// The note naming every limit this attempt hit (memory, tables, the
    /// caps of [`GuestLimits`]), given how it ended.
    fn limits_note(&mut self, err: Option<&wasmtime::Error>) -> Option<String> {
        let caps = self
            .limits
            .note(&mut self.table, self.http_hooks.refused(), err);
        match (self.limiter.note(), caps) {
            (Some(m), Some(c)) => Some(format!("{m}; {c}")),
            (m, c) => m.or(c),
        }
    }
}

impl Limited for AttemptState {
    fn limit_hits(&mut self) -> &mut LimitHits {
        &mut self.limits
    }

    fn log(&self, level: LogLevel, message: &str) {
        self.host.log(level, message);
    }

    fn file_tape(&self) -> Option<Arc<FileTape>> {
        self.files.clone()
    }
}

impl WasiView for AttemptState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for AttemptState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }
}

/// Enforces the memory limit (over all the guest's linear memories
/// together) and the per-table limit, and remembers that it did.
struct MemoryLimiter {
    max_memory: usize,
    /// Bytes of all the guest's linear memories: the limiter sees each
    /// memory's creation (from 0) and growth, so their sum.
    total: usize,
    /// The largest total a refused growth asked for.
    denied: Option<usize>,
    /// The table limit that refused a growth, and the largest size asked.
    table_denied: Option<(usize, usize)>,
}

impl MemoryLimiter {
    /// Says that a limit was hit, if one was.
    fn note(&self) -> Option<String> {
        let memory = self.denied.map(|d| {
            format!(
                "the guest hit its memory limit of {} (it asked for {} across all its memories; \
                 raise it with --max-memory)",
                format_size(self.max_memory as u64),
                format_size(d as u64)
            )
        });
        let table = self.table_denied.map(|(limit, asked)| {
            format!("the guest hit its table limit of {limit} elements (it asked for {asked})")
        });
        match (memory, table) {
            (Some(m), Some(t)) => Some(format!("{m}; {t}")),
            (m, t) => m.or(t),
        }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Past the memory's own maximum the growth fails anyway (after the
        // limiter, so refuse it here, uncounted and not noted as ours).
        if max.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        let total = self.total.saturating_sub(current).saturating_add(desired);
        if total > self.max_memory {
            self.denied = Some(self.denied.map_or(total, |d| d.max(total)));
            return Ok(false);
        }
        // A growth the allocator then fails (out of address space) stays
        // counted: the limit only gets stricter for this attempt.
        self.total = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // `max` is the table's own maximum, or the pooling allocator's
        // per-table limit: growth beyond it fails either way.
        let limit = max.map_or(MAX_TABLE_ELEMENTS, |m| m.min(MAX_TABLE_ELEMENTS));
        if desired > limit {
            let asked = self.table_denied.map_or(desired, |(_, a)| a.max(desired));
            self.table_denied = Some((limit, asked));
            return Ok(false);
        }
        Ok(true)
    }
}

/// Adds the WASI p2 interfaces (`open-at` wrapped by the open-files cap;
/// it, `read-directory` and `read-directory-entry` by the file tape of a
/// recorded or replayed attempt), the outgoing half of `wasi:http` (`types` and `outgoing-handler`, checked
/// by `http::HttpHooks`), `wasi:config/store` and the `host` interface to a
/// linker.
pub(crate) fn add_to_linker(linker: &mut Linker<AttemptState>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    // After wasmtime-wasi's own `open-at`, which it wraps.
    super::limits::wrap_open_at(linker)?;
    super::record::files::wrap_listings(linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
    {
        use super::bindings::keyvalue::wasi::keyvalue::{atomics, batch, store};
        use super::kv::{HasKv, KvView};
        fn view(state: &mut AttemptState) -> KvView<'_> {
            KvView {
                table: &mut state.table,
                access: &state.kv,
            }
        }
        store::add_to_linker::<AttemptState, HasKv>(linker, view)?;
        atomics::add_to_linker::<AttemptState, HasKv>(linker, view)?;
        batch::add_to_linker::<AttemptState, HasKv>(linker, view)?;
    }
    wasmtime_wasi_config::add_to_linker(linker, |state| {
        wasmtime_wasi_config::WasiConfig::from(&*state.config)
    })?;
    host::add_to_linker::<AttemptState, HasSelf<HostCtx>>(linker, |state| &mut state.host)?;
    children::add_to_linker::<AttemptState, HasSelf<HostCtx>>(linker, |state| &mut state.host)?;
    slots::add_to_linker::<AttemptState, HasSelf<HostCtx>>(linker, |state| &mut state.host)?;
    Ok(())
}

/// What every attempt of one runtime shares: the caps on what a guest holds
/// and the addresses outbound HTTP must not reach unless granted by address.
#[derive(Debug, Clone, Default)]
pub(crate) struct AttemptEnv {
    pub(crate) limits: GuestLimits,
    pub(crate) own: Arc<OwnAddresses>,
    /// Where the values of the secrets a task names come from.
    pub(crate) secrets: Arc<Secrets>,
    /// The operator's `wasi:config` values, which a task's own override.
    pub(crate) config: Arc<Vec<(String, String)>>,
    /// Where `wasi:keyvalue` buckets live (none: `open` fails, saying so).
    pub(crate) kv: Option<KvHandle>,
    /// Where child tasks go (none: a spawn fails, saying so).
    pub(crate) children: Option<ChildHandle>,
}

/// What an attempt replayed from its record starts with.
pub(crate) struct ReplaySetup {
    /// The tape of recorded answers.
    pub(crate) replaying: Arc<Replaying>,
    /// The recorded seed of its random numbers.
    pub(crate) seed: [u8; 32],
    /// Whether the recorded attempt had a key-value store.
    pub(crate) kv: bool,
    /// Whether the recorded attempt was granted outbound HTTP (its
    /// requests are answered from the record; without a grant, every
    /// request is denied again, as it was).
    pub(crate) http: bool,
}

/// The start of a record of the attempt `request` asks for.
fn record_start(
    env: &AttemptEnv,
    request: &AttemptRequest,
    plugin: Digest,
    source: &str,
    kind: ComponentKind,
    seed: [u8; 32],
) -> RecordStart {
    let sandbox = &request.sandbox;
    let facts = &request.facts;
    let secrets = sandbox
        .secrets
        .iter()
        .map(|s| RecordedSecret {
            var: s.var.clone(),
            name: s.name.clone(),
            digest: super::record::format::sha256(
                env.secrets.resolve(&s.name).unwrap_or_default().as_bytes(),
            ),
        })
        .collect();
    let started_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    RecordStart {
        plugin,
        source: source.to_owned(),
        command: kind == ComponentKind::Command,
        task_id: facts.task_id,
        name: facts.name.clone(),
        slot: facts.slot.clone(),
        attempt: facts.attempt,
        params: facts.params.clone(),
        args: facts.args.clone(),
        input: request.input.to_vec(),
        input_kept: true,
        env: sandbox.env.clone(),
        secrets,
        config: env.config.iter().chain(&sandbox.config).cloned().collect(),
        kv: sandbox.kv.clone(),
        kv_store: env.kv.is_some(),
        dirs: sandbox.dirs.iter().map(|d| d.guest.clone()).collect(),
        http: !sandbox.http.is_empty(),
        max_memory: sandbox.max_memory,
        seed,
        started_unix_ms,
    }
}

/// The tape of an attempt (replayed: of its record; recorded: a new one;
/// else off), the seed of its random numbers, the capture of its lines
/// (recorded or replayed: digesting them too) and its recorder.
fn tape_of(
    env: &AttemptEnv,
    request: &AttemptRequest,
    plugin: Option<Digest>,
    kind: ComponentKind,
    replay: Option<&ReplaySetup>,
) -> (Tape, [u8; 32], Arc<Capture>, Option<AttemptRecorder>) {
    let sink = Arc::clone(&request.sink);
    let mut recorder = None;
    let (tape, seed) = match (replay, &request.record, plugin) {
        (Some(replay), _, _) => (Tape::Replay(Arc::clone(&replay.replaying)), replay.seed),
        (None, Some(settings), Some(plugin)) => {
            let seed = super::record::fresh_seed();
            let mut start = record_start(env, request, plugin, &settings.source, kind, seed);
            // The input counts against the budget; one over it is not kept.
            if start.input.len() > settings.budget {
                start.input = Vec::new();
                start.input_kept = false;
            }
            let budget = settings.budget.saturating_sub(start.input.len());
            let recording = super::record::tape::Recording::new(budget);
            recorder = Some(AttemptRecorder {
                start: Some(start),
                recording: Arc::clone(&recording),
                lines: Capture::digesting(Arc::clone(&sink)),
                started: std::time::Instant::now(),
                sink: Arc::clone(&settings.sink),
            });
            (Tape::Record(recording), seed)
        }
        _ => (Tape::Off, [0; 32]),
    };
    let capture = match (&recorder, &tape) {
        (Some(recorder), _) => Arc::clone(&recorder.lines),
        (None, Tape::Off) => Capture::new(sink),
        (None, _) => Capture::digesting(sink),
    };
    (tape, seed, capture, recorder)
}

/// The `wasi:config` store of the attempts that have no values, shared.
static NO_CONFIG: std::sync::LazyLock<Arc<WasiConfigVariables>> =
    std::sync::LazyLock::new(Arc::default);

/// A new attempt's store, its capture, and a command's standard output.
pub(crate) type NewStore = (Store<AttemptState>, Arc<Capture>, Option<CommandStdout>);

/// Creates the store of one attempt with its limits, WASI context and epoch
/// behaviour: every tick yields to Tokio (so a spinning guest never starves
/// the runtime) unless the attempt was aborted, in which case it traps.
pub(crate) fn new_store(
    engine: &Engine,
    env: &AttemptEnv,
    request: &AttemptRequest,
    plugin: Option<Digest>,
    kind: ComponentKind,
    signals: &StopSignals,
    replay: Option<&ReplaySetup>,
) -> Result<NewStore, AttemptError> {
    let sandbox = &request.sandbox;
    let facts = Arc::clone(&request.facts);
    let (tape, seed, capture, recorder) = tape_of(env, request, plugin, kind, replay);
    let taped = tape.is_on().then(|| super::record::TapedWorld {
        tape: &tape,
        seed,
        // The recorder's start is the taped monotonic clock's zero: one
        // clock read serves both.
        started: recorder
            .as_ref()
            .map_or_else(std::time::Instant::now, |r| r.started),
    });
    let parking = request.parking.clone();
    let children = match (&env.children, plugin) {
        (Some(handle), Some(plugin)) => Some(ChildAccess {
            backend: Arc::clone(&handle.0),
            parking,
            facts: Arc::clone(&facts),
            plugin,
            sandbox: Arc::clone(sandbox),
        }),
        _ => None,
    };
    let stderr = CapturedStream::new(&capture, Stream::Stderr);
    // A command's standard output is its task's output, its standard input
    // the task's input; a plugin's stdout is a log stream.
    let command_out =
        (kind == ComponentKind::Command).then(|| CommandStdout::new(MAX_OUTPUT_BYTES));
    let wasi = match &command_out {
        Some(out) => sandbox.wasi_ctx(
            out.clone(),
            stderr,
            &env.secrets,
            Some(CommandArgs {
                program: &facts.name,
                args: &facts.args,
                stdin: &request.input,
            }),
            taped,
        ),
        None => sandbox.wasi_ctx(
            CapturedStream::new(&capture, Stream::Stdout),
            stderr,
            &env.secrets,
            None,
            taped,
        ),
    }
    .map_err(|e| AttemptError::Fatal {
        reason: e.to_string(),
        exit_code: None,
    })?;
    let limits = env.limits;
    // A replay's store is its record, and no backend is reached; a
    // recorded attempt's answers are kept.
    let (store, backend) = match replay {
        Some(replay) => (replay.kv, None),
        None => (env.kv.is_some(), env.kv.as_ref().map(|h| Arc::clone(&h.0))),
    };
    let kv = KvAccess {
        store,
        backend,
        tape: tape.clone(),
        task: facts.task_id,
        facts: Arc::clone(&facts),
        sandbox: Arc::clone(sandbox),
        capture: Arc::clone(&capture),
    };
    let mut table = ResourceTable::new();
    table.set_max_capacity(limits.max_handles);
    // Outbound HTTP is taped when the attempt had a grant; without one
    // every request is denied, replayed or not, and nothing is kept.
    let http_tape = match replay {
        Some(replay) if replay.http => tape.clone(),
        None if !sandbox.http.is_empty() => tape.clone(),
        _ => Tape::Off,
    };
    let mut http = WasiHttpCtx::new();
    http.set_field_size_limit(limits.max_header_bytes);
    let state = AttemptState {
        wasi,
        table,
        limiter: MemoryLimiter {
            max_memory: usize::try_from(sandbox.max_memory).unwrap_or(usize::MAX),
            total: 0,
            denied: None,
            table_denied: None,
        },
        host: HostCtx::new(
            facts,
            signals.cancel.clone(),
            Arc::clone(&capture),
            children,
            tape.clone(),
        ),
        http,
        http_hooks: HttpHooks::new(
            &sandbox.http,
            Arc::clone(&capture),
            signals.cancel.clone(),
            limits.max_http_requests,
            Arc::clone(&env.own),
            http_tape,
        ),
        limits: LimitHits::new(limits),
        kv,
        config: if env.config.is_empty() && sandbox.config.is_empty() {
            Arc::clone(&NO_CONFIG)
        } else {
            Arc::new(env.config.iter().chain(&sandbox.config).cloned().collect())
        },
        recorder,
        files: FileTape::new(
            &tape,
            &sandbox
                .dirs
                .iter()
                .map(|d| (d.host.clone(), d.guest.clone()))
                .collect::<Vec<_>>(),
        ),
    };
    let mut store = Store::new(engine, state);
    store.limiter(|state| &mut state.limiter);
    store.set_epoch_deadline(1);
    epoch_behaviour(&mut store, signals, &tape);
    Ok((store, capture, command_out))
}

/// Sets what `store`'s guest does at each epoch tick: it yields to Tokio
/// (so a spinning guest never starves the runtime) unless the attempt was
/// aborted or, replayed, stopped at a host call, in which case it traps.
fn epoch_behaviour(store: &mut Store<AttemptState>, signals: &StopSignals, tape: &Tape) {
    let abort = Arc::clone(&signals.abort);
    // At each tick the guest yields to the executor. Wasmtime sets the next
    // deadline when the guest resumes, so the yield asks for a check right
    // then (delta 0): an abort that came while the guest waited traps it at
    // once, and if a deadline fired anywhere meanwhile, or one that fired
    // has not seen its attempt gone yet (`ABORTS_PENDING`), the guest yields
    // again, so the executor reaches the aborted guest before the others run
    // a whole tick each; otherwise it runs on until the next tick.
    let mut resuming = false;
    let mut fired_at_yield = 0;
    // A replayed guest stopped at a host call traps at its next check.
    let replaying = match tape {
        Tape::Replay(replaying) => Some(Arc::clone(replaying)),
        _ => None,
    };
    store.epoch_deadline_callback(move |mut cx| {
        if abort.load(Ordering::Relaxed) || replaying.as_ref().is_some_and(|r| r.stopped()) {
            return Ok(UpdateDeadline::Interrupt);
        }
        let fired = super::ticker::ABORTS_FIRED.load(Ordering::Relaxed);
        // An abort has fired and its attempt is not gone yet: yield at
        // every check until the executor has reached that guest.
        let hurrying = super::ticker::ABORTS_PENDING.load(Ordering::Relaxed) > 0;
        // Back from a wait (a sleep, woken by its timer or a cancel): the
        // executor has just polled this guest, so it runs on to the next
        // tick instead of yielding at once (which, when thousands of
        // parked guests are cancelled together, was one more poll and
        // fiber switch each).
        if cx.data_mut().host.take_woke() && !hurrying {
            resuming = false;
            fired_at_yield = fired;
            return Ok(UpdateDeadline::Continue(1));
        }
        if resuming && fired == fired_at_yield && !hurrying {
            resuming = false;
            return Ok(UpdateDeadline::Continue(1));
        }
        resuming = true;
        fired_at_yield = fired;
        Ok(UpdateDeadline::YieldCustom(
            0,
            Box::pin(tokio::task::yield_now()),
        ))
    });
}

/// An instantiated attempt, ready to call `run`. Dropping it drops the
/// instance.
pub struct PreparedAttempt {
    store: Store<AttemptState>,
    instance: Instance,
    pub(crate) capture: Arc<Capture>,
    /// A command's standard output (none for a plugin).
    stdout: Option<CommandStdout>,
    signals: StopSignals,
    reaper: Arc<Reaper>,
}

impl std::fmt::Debug for PreparedAttempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedAttempt").finish_non_exhaustive()
    }
}

/// An instance of either kind of component.
enum Instance {
    Plugin(bindings::TaskPlugin),
    Command(wasmtime_wasi::p2::bindings::Command),
}

/// Instantiates `pre` in `store`: the instance creation step of an attempt,
/// before its timeout starts.
pub(crate) async fn instantiate(
    pre: &Entry,
    (mut store, capture, stdout): NewStore,
    signals: &StopSignals,
    reaper: &Arc<Reaper>,
) -> Result<PreparedAttempt, AttemptError> {
    let instance = match pre {
        Entry::Plugin(pre) => pre
            .instantiate_async(&mut store)
            .await
            .map(Instance::Plugin),
        Entry::Command(pre) => pre
            .instantiate_async(&mut store)
            .await
            .map(Instance::Command),
    };
    match instance {
        Ok(instance) => Ok(PreparedAttempt {
            store,
            instance,
            capture,
            stdout,
            signals: signals.clone(),
            reaper: Arc::clone(reaper),
        }),
        Err(_) if signals.is_aborted() => Err(AttemptError::Aborted),
        // Every slot of the instance pool is taken (by attempts, describe
        // calls, or guests with more core instances than the pool sized
        // for): a passing condition, so retryable, never Fatal.
        Err(err) if is_pool_full(&err) => {
            capture.finish();
            Err(pool_full(&err))
        }
        Err(err) => {
            capture.finish();
            let limiter = &store.data().limiter;
            Err(AttemptError::Fatal {
                reason: match limiter.note() {
                    Some(note) => format!("the plugin could not be instantiated: {note}"),
                    None => format!(
                        "the plugin could not be instantiated: {}",
                        error_chain(&err)
                    ),
                },
                exit_code: None,
            })
        }
    }
}

/// The instance of an attempt that was asked to stop, still to be dropped
/// ([`PreparedAttempt::run_stopping_later`]).
pub struct StoppedInstance {
    store: Store<AttemptState>,
    reaper: Arc<Reaper>,
}

impl std::fmt::Debug for StoppedInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoppedInstance").finish_non_exhaustive()
    }
}

impl StoppedInstance {
    /// Drops the instance, returning its pool slot, on a reaper thread;
    /// returns once it is gone.
    pub async fn release(self) {
        self.reaper.reap(Box::new(self.store)).await;
    }

    /// Drops the instance on a reaper thread (at the lowest CPU priority,
    /// so that a crowd of stops is answered first), then calls `then`
    /// there.
    pub fn release_then(self, then: impl FnOnce() + Send + 'static) {
        self.reaper.reap_then(Box::new(self.store), Box::new(then));
    }
}

impl PreparedAttempt {
    /// Calls `run(input)`; returns when the instance is gone.
    pub async fn run(self, input: &[u8]) -> Result<Vec<u8>, AttemptError> {
        let (result, stopped) = self.run_stopping_later(input).await;
        // On a current-thread runtime, whose one thread would otherwise do
        // every drop of a crowd of stops, the reaper's thread does it.
        match stopped {
            Some(stopped) if super::reaper::wanted() => stopped.release().await,
            stopped => drop(stopped),
        }
        result
    }

    /// Calls `run(input)`. When the attempt was asked to stop, its instance
    /// comes back with the result, to be released once the result is
    /// delivered: stops come in crowds (a shutdown, Replace, a cancel of
    /// everything), and dropping an instance (resetting its pool slot) is a
    /// good part of each. Otherwise it is gone when this returns.
    pub async fn run_stopping_later(
        mut self,
        input: &[u8],
    ) -> (Result<Vec<u8>, AttemptError>, Option<StoppedInstance>) {
        let result = match &self.instance {
            Instance::Plugin(instance) => instance.call_run(&mut self.store, input).await,
            Instance::Command(instance) => {
                let ran = instance.wasi_cli_run().call_run(&mut self.store).await;
                command_result(ran, self.stdout.as_ref(), self.signals.is_aborted())
            }
        };
        self.capture.finish();
        let mut recorder = self.store.data_mut().recorder.take();
        let memory_note = self.store.data_mut().limits_note(result.as_ref().err());
        let remains = if self.signals.cancel.is_cancelled() {
            Some(StoppedInstance {
                store: self.store,
                reaper: self.reaper,
            })
        } else {
            drop(self.store);
            None
        };
        let result = match result {
            Ok(Ok(output)) if output.len() > MAX_OUTPUT_BYTES => Err(AttemptError::Fail {
                reason: format!(
                    "the plugin returned {} of output; the limit is {}",
                    format_size(output.len() as u64),
                    format_size(MAX_OUTPUT_BYTES as u64)
                ),
                exit_code: None,
            }),
            Ok(Ok(output)) => Ok(output),
            Ok(Err(types::TaskError::Fail(f))) => Err(AttemptError::Fail {
                reason: join(&f.reason, memory_note),
                exit_code: f.exit_code,
            }),
            Ok(Err(types::TaskError::Fatal(f))) => Err(AttemptError::Fatal {
                reason: join(&f.reason, memory_note),
                exit_code: f.exit_code,
            }),
            Ok(Err(types::TaskError::Canceled)) => Err(AttemptError::Canceled),
            Err(_) if self.signals.is_aborted() => Err(AttemptError::Aborted),
            Err(err) if is_pool_full(&err) => Err(pool_full(&err)),
            Err(err) => Err(AttemptError::Fail {
                reason: describe_trap(&err, memory_note, self.capture.explanation()),
                exit_code: None,
            }),
        };
        if let Some(recorder) = &mut recorder {
            recorder.finish(&result);
        }
        (result, remains)
    }
}

/// A command's end in the words of a plugin's `run`: returning `Ok` or
/// exiting with 0 gives its standard output; returning `Err` or exiting
/// with another status fails the attempt (retryable) with that exit code;
/// writing past the output limit fails it saying so; a trap stays a trap.
fn command_result(
    ran: wasmtime::Result<Result<(), ()>>,
    stdout: Option<&CommandStdout>,
    aborted: bool,
) -> wasmtime::Result<Result<Vec<u8>, types::TaskError>> {
    let fail = |reason: String, exit_code: Option<i32>| {
        Ok(Err(types::TaskError::Fail(types::Failure {
            reason,
            exit_code,
        })))
    };
    let output = stdout.map_or(Some(Vec::new()), CommandStdout::take);
    if output.is_none() && !aborted {
        return fail(
            format!(
                "the command wrote more than {} to standard output, the limit of a task's output",
                format_size(MAX_OUTPUT_BYTES as u64)
            ),
            None,
        );
    }
    let code = match ran {
        Ok(Ok(())) => 0,
        Ok(Err(())) => 1,
        Err(err) => match err.downcast_ref::<wasmtime_wasi::I32Exit>() {
            Some(exit) => exit.0,
            None => return Err(err),
        },
    };
    if code != 0 {
        return fail(format!("the command exited with status {code}"), Some(code));
    }
    Ok(Ok(output.unwrap_or_default()))
}
