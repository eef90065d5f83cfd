//! # taskhost-runtime
//!
//! The sandboxed WebAssembly runtime: one [`Runtime`] per host process owns
//! the engine, the linker, the epoch ticker and the content-addressed plugin
//! cache, and runs attempts. It decides *how* a plugin body runs; *when* and
//! *how often* it runs is the supervisor's business.
//!
//! | module | owns |
//! |---|---|
//! | `runtime` | [`Runtime`]: starts the engine, linker, ticker and reaper; loads plugins; makes attempts |
//! | `config` | the runtime's settings ([`RuntimeConfig`]) and their defaults |
//! | `engine` | engine config, pooling vs on-demand |
//! | `ticker` | the epoch ticker: ticks, attempts' abort deadlines fired on time, the abort counters |
//! | `artifacts` | compiled plugins on disk: written atomically, checked, mapped back (the one `unsafe`) |
//! | `file_digests` | the memo of plugin files' digests by their status, so a warm run reads no plugin |
//! | `cache` | the compiled plugins in memory, bounded by their image sizes |
//! | `digest` | a plugin's content digest: [`Digest`], computed off the async workers for large inputs |
//! | `bindings` | the Rust side of `wit/` (generated) |
//! | `contract` | what a plugin declares: [`PluginInfo`], [`Capability`], resource templates |
//! | `plugin` | bytes → validated [`Plugin`] (header sniffing, compile, world check, describe) |
//! | `attempt` | one fresh instance: memory limits, epoch callback, linker, how it ended |
//! | `facts` | what an attempt is told: [`AttemptFacts`], [`StopSignals`] |
//! | `failure` | [`AttemptError`] and the translation of traps and wasmtime's errors into it |
//! | `host_calls` | the host functions of `taskhost:plugin` (`host`, `children`) for one attempt |
//! | `limits` | the per-attempt caps on handles, open files, HTTP requests, header bytes |
//! | `sandbox` | grants: dirs, env, http, memory; capability checks; WASI context |
//! | `children` | child tasks: what a guest's spawn asks, its parent's grants as the ceiling, the cancellable wait |
//! | `kv` | `wasi:keyvalue`: which bucket a guest may open, limits, [`MemoryKv`](kv::MemoryKv) with its journal |
//! | `secrets` | secrets by name: [`SecretRef`], the [`Secrets`] source, resolved at attempt start |
//! | `grant_error` | [`GrantError`], why a grant was refused |
//! | `http_grant` | outbound HTTP's grant: `--allow-http` parsed into [`HttpAllow`], matching, ceilings |
//! | `http` | outbound HTTP: the checks of every request and address against the grant, the cap in flight |
//! | `outbound` | outbound HTTP's send path: lookup, connect to the checked address, TLS, HTTP/1 |
//! | `output` | guest stdout/stderr/log capture, bounded, line by line |
//! | `reaper` | the low-priority threads that drop stopped attempts' stores after their outcomes; lowering a thread's priority |
//! | `record` | the flight recorder: an attempt's record (within a budget) and its replay |
//! | `plugin_task` | the bridge: [`PluginTask`](plugin_task::PluginTask), the supervisor's body of a plugin |

// Every module but `artifacts` forbids `unsafe` itself (see there).
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod artifacts;
mod attempt;
mod bindings;
mod cache;
pub mod children;
mod config;
pub mod contract;
mod digest;
mod engine;
mod facts;
mod failure;
mod file_digests;
mod grant_error;
mod host_calls;
mod http;
mod http_grant;
pub mod kv;
mod limits;
mod outbound;
mod output;
mod plugin;
pub mod plugin_task;
mod reaper;
pub mod record;
mod runtime;
mod sandbox;
mod secrets;
mod ticker;

pub use attempt::{AttemptRequest, MAX_OUTPUT_BYTES, PreparedAttempt, StoppedInstance};
pub use config::{RuntimeConfig, SLOW_COMPILE, SlowCompile, default_cache_dir};
pub use contract::{
    Capability, ComponentKind, DefaultPolicy, PluginInfo, ResourceTemplate, TemplateError,
};
pub use digest::{Digest, digest_of};
pub use engine::{Allocator, AllocatorChoice, DEFAULT_POOL_INSTANCES, POOL_RESERVE, PoolReset};
pub use facts::{AttemptFacts, StopSignals};
pub use failure::AttemptError;
pub use grant_error::GrantError;
pub use http::{DEFAULT_HTTP_CONNECT_TIMEOUT, DEFAULT_HTTP_FIRST_BYTE_TIMEOUT};
pub use http_grant::{HttpAllow, HttpScheme};
pub use kv::{Bucket, KvBackend, KvError, KvLimits, MemoryKv, ScopeQuota, ScopeQuotas};
pub use limits::{
    DEFAULT_MAX_HANDLES, DEFAULT_MAX_HEADER_BYTES, DEFAULT_MAX_HTTP_REQUESTS,
    DEFAULT_MAX_OPEN_FILES, GuestLimits, LimitError,
};
pub use output::{GuestSink, MAX_LINE_BYTES, MAX_OUTPUT_BYTES_PER_ATTEMPT, NullSink};
pub use plugin::{
    DESCRIBE_MAX_MEMORY, DESCRIBE_TIMEOUT, LoadError, MAX_PLUGIN_BYTES, Plugin, check_header,
};
pub use runtime::{Runtime, RuntimeError, RuntimeStats};
pub use sandbox::{DEFAULT_MAX_MEMORY, DirGrant, Sandbox, parse_env};
pub use secrets::{
    MAX_SECRET_BYTES, MAX_SECRET_NAME, SecretError, SecretRef, Secrets,
    check_name as check_secret_name,
};
pub use ticker::{DEFAULT_EPOCH_TICK, HurryGuard};

/// The types most embedders need, in one `use`: the supervisor's and the
/// controller's ([`taskhost_core::prelude`]) and the runtime's.
pub mod prelude {
    pub use crate::plugin_task::PluginTask;
    pub use crate::{Runtime, RuntimeConfig, Sandbox};
    pub use taskhost_core::prelude::*;
}
