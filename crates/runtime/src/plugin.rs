//! Owns turning bytes into a runnable plugin: recognising what the bytes are
//! (not wasm, a core module, a component), compiling once per content digest
//! off the async runtime, checking the component targets our world, asking
//! `describe` under a small time and memory limit, and validating what it
//! says. Each failure is a [`LoadError`] that names the problem and the fix.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use wasmtime::Engine;
use wasmtime::component::Component;

use super::attempt::{self, AttemptEnv, AttemptState};
use super::bindings::{self, WIT_PACKAGE, WIT_VERSION, taskhost::plugin::types};
use super::contract::{Capability, ComponentKind, PluginInfo, ResourceTemplate};
use super::digest::Digest;
use super::facts::{AttemptFacts, StopSignals};
use super::failure::{describe_trap, error_chain};
use super::output::NullSink;
use super::sandbox::Sandbox;
use taskhost_core::slot_settings::MAX_CAPACITY;

/// Largest plugin file accepted.
pub const MAX_PLUGIN_BYTES: usize = 256 << 20;
/// How long `describe` may take at load time.
pub const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Memory limit of the `describe` call at load time.
pub const DESCRIBE_MAX_MEMORY: u64 = 128 << 20;

const MAX_NAME_LEN: usize = 128;
const MAX_TEXT_LEN: usize = 4096;
const MAX_CAPABILITIES: usize = 64;

/// Why bytes could not become a plugin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read plugin `{origin}`: {why}")]
    Unreadable {
        /// Where the bytes came from.
        origin: String,
        /// The OS error.
        why: String,
    },
    /// The bytes are not WebAssembly at all, or too big.
    #[error("`{origin}` is not a WebAssembly component: {why}")]
    NotWasm {
        /// Where the bytes came from.
        origin: String,
        /// What they look like instead.
        why: String,
    },
    /// A core module where a component was expected.
    #[error(
        "`{origin}` is a core WebAssembly module, not a component: build the plugin for \
         wasm32-wasip2 (cargo build --target wasm32-wasip2) or wrap it with `wasm-tools component new`"
    )]
    CoreModule {
        /// Where the bytes came from.
        origin: String,
    },
    /// The component failed to compile.
    #[error("`{origin}` is not a valid component: {why}")]
    Invalid {
        /// Where the bytes came from.
        origin: String,
        /// The compiler's complaint.
        why: String,
    },
    /// A component of another world.
    #[error("`{origin}` is a component but not a task plugin: {why}")]
    WrongWorld {
        /// Where the bytes came from.
        origin: String,
        /// What is missing or mismatched, and the fix.
        why: String,
    },
    /// `describe` trapped, timed out or said something invalid.
    #[error("`{origin}`: describe() {why}")]
    BadDescribe {
        /// Where the bytes came from.
        origin: String,
        /// What went wrong.
        why: String,
    },
}

/// A compiled, validated plugin, ready to instantiate any number of times.
pub struct Plugin {
    digest: Digest,
    /// `digest` as text, written once: a task's span carries it.
    digest_text: String,
    size: usize,
    compiled: usize,
    info: PluginInfo,
    pre: Entry,
}

/// A linked component of either kind, ready to instantiate.
pub(crate) enum Entry {
    /// A task plugin of our world.
    Plugin(bindings::TaskPluginPre<AttemptState>),
    /// A WASI command (`wasi:cli/run`).
    Command(wasmtime_wasi::p2::bindings::CommandPre<AttemptState>),
}

impl Entry {
    /// The compiled component.
    pub(crate) fn component(&self) -> &Component {
        match self {
            Self::Plugin(pre) => pre.instance_pre().component(),
            Self::Command(pre) => pre.instance_pre().component(),
        }
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("digest", &self.digest)
            .field("size", &self.size)
            .field("compiled", &self.compiled)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl Plugin {
    /// A plugin of this linked component and what its `describe` said.
    pub(crate) fn new(digest: Digest, size: usize, info: PluginInfo, pre: Entry) -> Self {
        let image = pre.component().image_range();
        Self {
            digest_text: digest.to_string(),
            digest,
            size,
            compiled: image.end.addr().saturating_sub(image.start.addr()),
            info,
            pre,
        }
    }

    /// The content digest of the plugin's bytes.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// [`digest`](Self::digest) as text (`sha256:` and 64 hex digits).
    pub fn digest_text(&self) -> &str {
        &self.digest_text
    }

    /// Size of the component in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Size of its compiled image in memory (native code, data segments,
    /// metadata): what keeping it loaded costs, about twice the component
    /// for Python and JavaScript components.
    pub fn compiled_size(&self) -> usize {
        self.compiled
    }

    /// What the plugin declared.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    pub(crate) fn pre(&self) -> &Entry {
        &self.pre
    }
}

/// The error for a plugin over [`MAX_PLUGIN_BYTES`].
pub(crate) fn too_big(origin: &str, size: u64) -> LoadError {
    LoadError::NotWasm {
        origin: origin.to_owned(),
        why: format!(
            "it is {}; the limit for a plugin is {}",
            taskhost_core::units::format_size(size),
            taskhost_core::units::format_size(MAX_PLUGIN_BYTES as u64)
        ),
    }
}

/// Sniffs the wasm header so the common mistakes get a precise message.
pub fn check_header(origin: &str, bytes: &[u8]) -> Result<(), LoadError> {
    const MAGIC: &[u8] = b"\0asm";
    let not_wasm = |why: String| LoadError::NotWasm {
        origin: origin.to_owned(),
        why,
    };
    if bytes.len() > MAX_PLUGIN_BYTES {
        return Err(too_big(origin, bytes.len() as u64));
    }
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        let why = if bytes.is_empty() {
            "the file is empty".to_owned()
        } else if bytes.starts_with(b"(") || bytes.starts_with(b";;") {
            "it looks like WebAssembly text; compile it to a binary component first".to_owned()
        } else {
            "it does not start with the WebAssembly magic bytes `\\0asm`".to_owned()
        };
        return Err(not_wasm(why));
    }
    match bytes[6..8] {
        [0, 0] => Err(LoadError::CoreModule {
            origin: origin.to_owned(),
        }),
        [1, 0] => Ok(()),
        _ => Err(not_wasm(format!(
            "unknown WebAssembly layer/version {:02x?}",
            &bytes[4..8]
        ))),
    }
}

/// The WASI 0.2 interfaces `attempt::add_to_linker` links (wasmtime-wasi's
/// p2 set), as `package/interface`. [`check_world`] refuses a component that
/// imports any other `wasi:` interface before compiling it: keep this in
/// step with the linker.
const LINKED_WASI: &[&str] = &[
    "cli/environment",
    "cli/exit",
    "cli/stderr",
    "cli/stdin",
    "cli/stdout",
    "cli/terminal-input",
    "cli/terminal-output",
    "cli/terminal-stderr",
    "cli/terminal-stdin",
    "cli/terminal-stdout",
    "clocks/monotonic-clock",
    "clocks/wall-clock",
    "filesystem/preopens",
    "filesystem/types",
    // Outbound HTTP (each request checked against the task's grant).
    "http/outgoing-handler",
    "http/types",
    "io/error",
    "io/poll",
    "io/streams",
    "random/insecure",
    "random/insecure-seed",
    "random/random",
    "sockets/instance-network",
    "sockets/ip-name-lookup",
    "sockets/network",
    "sockets/tcp",
    "sockets/tcp-create-socket",
    "sockets/udp",
    "sockets/udp-create-socket",
];

/// The one interface of a WASI proposal the linker adds, at the version
/// wasmtime-wasi-config implements (`wasi:config` has no 0.2.x release).
const WASI_CONFIG: &str = "wasi:config/store@0.2.0-rc.1";

/// The `wasi:keyvalue` interfaces the linker adds (`kv`), at the draft
/// version the wasmtime ecosystem uses.
const WASI_KEYVALUE: &[&str] = &["store", "atomics", "batch"];
const WASI_KEYVALUE_VERSION: &str = "0.2.0-draft";

/// The interfaces of our own package a plugin may import.
const OUR_INTERFACES: &[&str] = &["host", "types", "children", "slots"];

/// The versions of our package this host serves: its own and the earlier
/// ones of 0.1 (0.1.1 only added `children`, 0.1.2 `slots`; the linker
/// matches a 0.1.0 or 0.1.1 import to the 0.1.2 definition).
const SERVED_VERSIONS: &[&str] = &["0.1.0", "0.1.1", WIT_VERSION];

/// The names of a component's own imports (but not of imported types) and
/// exports (not those of the modules and components nested in it), read
/// without compiling it.
fn import_export_names(
    origin: &str,
    bytes: &[u8],
) -> Result<(Vec<String>, Vec<String>), LoadError> {
    use wasmparser::{Chunk, Parser, Payload};
    let invalid = |why: String| LoadError::Invalid {
        origin: origin.to_owned(),
        why,
    };
    let (mut imports, mut exports) = (Vec::new(), Vec::new());
    let mut parser = Parser::new(0);
    let mut rest = bytes;
    loop {
        let payload = match parser.parse(rest, true) {
            Ok(Chunk::Parsed { consumed, payload }) => {
                rest = &rest[consumed..];
                payload
            }
            Ok(Chunk::NeedMoreData(_)) => {
                return Err(invalid("the file ends in the middle of a section".into()));
            }
            Err(e) => return Err(invalid(e.to_string())),
        };
        match payload {
            Payload::ComponentImportSection(reader) => {
                for import in reader {
                    let import = import.map_err(|e| invalid(e.to_string()))?;
                    // A world's `use` of a type is an import of that type
                    // (`plugin-info`): nothing a linker provides.
                    if !matches!(import.ty, wasmparser::ComponentTypeRef::Type(_)) {
                        imports.push(import.name.name.to_owned());
                    }
                }
            }
            Payload::ComponentExportSection(reader) => {
                for export in reader {
                    let export = export.map_err(|e| invalid(e.to_string()))?;
                    exports.push(export.name.name.to_owned());
                }
            }
            // Nested modules and components (the bulk of the bytes) are
            // the compiler's business: skip them.
            Payload::ModuleSection {
                unchecked_range, ..
            }
            | Payload::ComponentSection {
                unchecked_range, ..
            } => {
                let Some(after) = rest.get(unchecked_range.len()..) else {
                    return Err(invalid(format!(
                        "a nested module at byte {} runs past the end of the file",
                        unchecked_range.start
                    )));
                };
                rest = after;
            }
            Payload::End(_) => return Ok((imports, exports)),
            _ => {}
        }
    }
}

/// Whether `version` is a WASI 0.2 release (`0.2.x`, any x: wasmtime's
/// version matching serves guests built for other 0.2 releases).
fn is_wasi_02(version: &str) -> bool {
    version
        .strip_prefix("0.2.")
        .is_some_and(|patch| !patch.is_empty() && patch.bytes().all(|b| b.is_ascii_digit()))
}

/// Which kind of component these exports make: a task plugin (`describe`
/// and `run`), else a WASI command (`wasi:cli/run` of WASI 0.2), else
/// none, told with the fix.
fn kind_of(exports: &[String]) -> Result<ComponentKind, String> {
    if exports.iter().any(|e| e == "run") && exports.iter().any(|e| e == "describe") {
        return Ok(ComponentKind::Plugin);
    }
    let command = exports.iter().any(|e| {
        e.split_once('@')
            .is_some_and(|(path, version)| path == "wasi:cli/run" && is_wasi_02(version))
    });
    if command {
        return Ok(ComponentKind::Command);
    }
    Err(format!(
        "it exports [{}] but a task plugin exports `describe` and `run` of {WIT_PACKAGE} \
         (build it with the taskhost-guest SDK or against the `task-plugin` world of wit/), \
         and a WASI command exports `wasi:cli/run` of WASI 0.2 (what \
         `cargo build --target wasm32-wasip2` makes of a `main`)",
        exports.join(", ")
    ))
}

/// Checks, before compiling, that a component is a task plugin (exports
/// `describe` and `run`) or a WASI command (exports `wasi:cli/run`), and
/// imports only what this host links: our package at [`WIT_VERSION`] and
/// WASI 0.2. Reading the names takes a millisecond; finding the same at
/// instantiation would take a compile of seconds for a large component.
pub(crate) fn check_world(origin: &str, bytes: &[u8]) -> Result<ComponentKind, LoadError> {
    let (imports, exports) = import_export_names(origin, bytes)?;
    let wrong_world = |why: String| LoadError::WrongWorld {
        origin: origin.to_owned(),
        why,
    };
    let kind = kind_of(&exports).map_err(wrong_world)?;
    let mut unknown = Vec::new();
    for import in &imports {
        let (path, version) = import.split_once('@').unwrap_or((import, ""));
        if let Some(interface) = path.strip_prefix("taskhost:plugin/") {
            if !SERVED_VERSIONS.contains(&version) {
                return Err(wrong_world(format!(
                    "it imports `{import}` but this host provides {WIT_PACKAGE}; rebuild the \
                     plugin against {WIT_PACKAGE}: the wit/ directory of this host's release \
                     (for Rust, the taskhost-guest SDK of that release)"
                )));
            }
            if !OUR_INTERFACES.contains(&interface) {
                unknown.push(import.as_str());
            }
        } else if path == "wasi:config/store" {
            if import != WASI_CONFIG {
                return Err(wrong_world(format!(
                    "it imports `{import}` but this host provides {WASI_CONFIG}; build the \
                     plugin against that version of wasi:config"
                )));
            }
        } else if let Some(interface) = path.strip_prefix("wasi:keyvalue/") {
            if version != WASI_KEYVALUE_VERSION {
                return Err(wrong_world(format!(
                    "it imports `{import}` but this host provides wasi:keyvalue@\
                     {WASI_KEYVALUE_VERSION}; build the plugin against that version"
                )));
            }
            if !WASI_KEYVALUE.contains(&interface) {
                unknown.push(import.as_str());
            }
        } else if let Some(interface) = path.strip_prefix("wasi:") {
            if !version.is_empty() && !is_wasi_02(version) {
                return Err(wrong_world(format!(
                    "it imports `{import}`, of WASI {version}, but this host provides WASI 0.2 \
                     (any 0.2.x release); build the plugin for WASI 0.2 (wasm32-wasip2)"
                )));
            }
            if !LINKED_WASI.contains(&interface) {
                unknown.push(import.as_str());
            }
        } else {
            unknown.push(import.as_str());
        }
    }
    if unknown.is_empty() {
        return Ok(kind);
    }
    let mut why = format!(
        "it imports {} that this host does not provide; it provides the `host` interface \
         of {WIT_PACKAGE} and the WASI 0.2 interfaces of wasi:io, wasi:clocks, wasi:random, \
         wasi:cli, wasi:filesystem, wasi:sockets and, for outbound requests, wasi:http/types \
         and wasi:http/outgoing-handler",
        unknown
            .iter()
            .map(|i| format!("`{i}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if unknown.iter().any(|i| i.starts_with("wasi:http/")) {
        why.push_str(
            "; componentize-js adds the wasi:http fetch event (an incoming handler, which a \
             task has no use for): build with `componentize-js -d fetch-event ...` (and \
             `-d http` too if the plugin makes no requests)",
        );
    }
    Err(wrong_world(why))
}

/// Compiles and validates a component. Blocking: call it on the blocking
/// pool.
pub(crate) fn compile(
    engine: &Engine,
    linker: &wasmtime::component::Linker<AttemptState>,
    origin: &str,
    bytes: &[u8],
) -> Result<Entry, LoadError> {
    check_header(origin, bytes)?;
    check_world(origin, bytes)?;
    let component = Component::new(engine, bytes).map_err(|e| LoadError::Invalid {
        origin: origin.to_owned(),
        why: error_chain(&e),
    })?;
    prepare(engine, linker, origin, &component)
}

/// Checks a compiled component's exports and links it (the step from a
/// component, compiled now or mapped from its artifact, to what attempts
/// instantiate).
pub(crate) fn prepare(
    engine: &Engine,
    linker: &wasmtime::component::Linker<AttemptState>,
    origin: &str,
    component: &Component,
) -> Result<Entry, LoadError> {
    let wrong_world = |why: String| LoadError::WrongWorld {
        origin: origin.to_owned(),
        why,
    };
    let ty = component.component_type();
    let exports: Vec<String> = ty
        .exports(engine)
        .map(|(name, _)| name.to_owned())
        .collect();
    // `check_world` has read the same names from the bytes; this is the
    // compiler's view of them, kept as a second line of defence.
    let kind = kind_of(&exports).map_err(wrong_world)?;
    let instance_pre = linker.instantiate_pre(component).map_err(|e| {
        wrong_world(format!(
            "it needs an import this host does not provide: {}",
            error_chain(&e)
        ))
    })?;
    match kind {
        ComponentKind::Plugin => bindings::TaskPluginPre::new(instance_pre)
            .map(Entry::Plugin)
            .map_err(|e| {
                wrong_world(format!(
                    "its exports do not match {WIT_PACKAGE}: {}",
                    error_chain(&e)
                ))
            }),
        ComponentKind::Command => wasmtime_wasi::p2::bindings::CommandPre::new(instance_pre)
            .map(Entry::Command)
            .map_err(|e| {
                wrong_world(format!(
                    "its `wasi:cli/run` does not match WASI 0.2's: {}",
                    error_chain(&e)
                ))
            }),
    }
}

/// What a WASI command is said to be: it has no `describe`, so it is named
/// `command` (its tasks `command-<id>` unless the submission names them),
/// with no resource (its slot is its task's name unless the submission
/// names one), the queue policy and no declared capabilities (its grants
/// are the submission's alone).
pub(crate) fn command_info() -> PluginInfo {
    PluginInfo {
        name: "command".to_owned(),
        version: String::new(),
        description: "a WASI command run as a task".to_owned(),
        resource: None,
        default_policy: Default::default(),
        capabilities: Vec::new(),
        capacity: None,
        kind: ComponentKind::Command,
    }
}

/// Calls `describe` in a fresh, tightly limited instance and validates the
/// answer.
pub(crate) async fn describe(
    engine: &Engine,
    env: &AttemptEnv,
    origin: &str,
    digest: Digest,
    size: usize,
    pre: Entry,
) -> Result<Plugin, LoadError> {
    let pre = match pre {
        Entry::Plugin(pre) => pre,
        // The same answer whoever compiled it first (a file's name is not
        // the daemon's to know): `command`.
        Entry::Command(_) => return Ok(Plugin::new(digest, size, command_info(), pre)),
    };
    let bad = |why: String| LoadError::BadDescribe {
        origin: origin.to_owned(),
        why,
    };
    let sandbox = Sandbox {
        max_memory: DESCRIBE_MAX_MEMORY,
        ..Sandbox::default()
    };
    let signals = StopSignals::default();
    let request = attempt::AttemptRequest {
        facts: Arc::new(AttemptFacts::default()),
        input: Arc::from(&[][..]),
        sandbox: Arc::new(sandbox),
        sink: Arc::new(NullSink),
        parking: None,
        record: None,
    };
    let (mut store, capture, _) = attempt::new_store(
        engine,
        env,
        &request,
        None,
        ComponentKind::Plugin,
        &signals,
        None,
    )
    .map_err(|e| bad(e.to_string()))?;
    let call = async {
        let instance = pre.instantiate_async(&mut store).await?;
        instance.call_describe(&mut store).await
    };
    // The guest yields at every epoch tick, so the timeout fires even for a
    // describe that spins; dropping the call drops its instance.
    let raw = match tokio::time::timeout(DESCRIBE_TIMEOUT, call).await {
        Err(_) => {
            return Err(bad(format!(
                "did not answer within {}ms; it must return at once, without side effects",
                DESCRIBE_TIMEOUT.as_millis()
            )));
        }
        Ok(Err(err)) => {
            // One line: the trap, what the guest said, the top of its
            // backtrace.
            let why = describe_trap(&err, None, capture.explanation());
            return Err(bad(format!("failed: {why}")));
        }
        Ok(Ok(raw)) => raw,
    };
    let declared = store.data().declared_capacity();
    drop(store);
    let mut info = validate_info(raw).map_err(bad)?;
    if let Some(capacity) = declared {
        if capacity == 0 || capacity > MAX_CAPACITY {
            return Err(bad(format!(
                "declared a capacity of {capacity}; a slot holds 1 to {MAX_CAPACITY} owners"
            )));
        }
        info.capacity = Some(capacity);
    }
    Ok(Plugin::new(digest, size, info, Entry::Plugin(pre)))
}

fn validate_info(raw: types::PluginInfo) -> Result<PluginInfo, String> {
    let short = |what: &str, value: &str, max: usize| {
        if value.len() > max {
            Err(format!(
                "returned a {what} of {} bytes; the limit is {max}",
                value.len()
            ))
        } else {
            Ok(())
        }
    };
    if raw.name.is_empty()
        || !raw
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "returned the name {:?}; a plugin name is non-empty ASCII letters, digits, `-`, `_` or `.`",
            raw.name.chars().take(MAX_NAME_LEN).collect::<String>()
        ));
    }
    short("name", &raw.name, MAX_NAME_LEN)?;
    short("version", &raw.version, MAX_NAME_LEN)?;
    short("description", &raw.description, MAX_TEXT_LEN)?;
    if raw.capabilities.len() > MAX_CAPABILITIES {
        return Err(format!(
            "declared {} capabilities; the limit is {MAX_CAPABILITIES}",
            raw.capabilities.len()
        ));
    }
    let resource = raw
        .resource
        .map(|r| ResourceTemplate::parse(&r))
        .transpose()
        .map_err(|e| format!("declared a bad resource: {e}"))?;
    let capabilities = raw
        .capabilities
        .into_iter()
        .map(|c| {
            let cap = match c {
                types::Capability::ReadDir(p) => Capability::ReadDir(p),
                types::Capability::WriteDir(p) => Capability::WriteDir(p),
                types::Capability::Env(n) => Capability::Env(n),
                types::Capability::Network => Capability::Network,
            };
            match &cap {
                Capability::ReadDir(s) | Capability::WriteDir(s) | Capability::Env(s) => {
                    short("capability", s, MAX_TEXT_LEN).map(|()| cap)
                }
                Capability::Network => Ok(cap),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(PluginInfo {
        name: raw.name,
        version: raw.version,
        description: raw.description,
        resource,
        default_policy: raw.default_policy.into(),
        capabilities,
        capacity: None,
        kind: ComponentKind::Plugin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_a_plugin_from_a_command() {
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            kind_of(&names(&["describe", "run"])),
            Ok(ComponentKind::Plugin)
        );
        assert_eq!(
            kind_of(&names(&["wasi:cli/run@0.2.3"])),
            Ok(ComponentKind::Command)
        );
        let refused = kind_of(&names(&["wasi:cli/run@0.3.0", "run"])).unwrap_err();
        assert!(refused.contains("wasi:cli/run"), "{refused}");
        assert!(kind_of(&names(&["wasi:cli/run"])).is_err());
    }

    #[test]
    fn recognises_headers() {
        assert!(matches!(
            check_header("x", b""),
            Err(LoadError::NotWasm { .. })
        ));
        assert!(matches!(
            check_header("x", b"hello world"),
            Err(LoadError::NotWasm { .. })
        ));
        assert!(matches!(
            check_header("x", b"\0asm\x01\0\0\0"),
            Err(LoadError::CoreModule { .. })
        ));
        assert!(check_header("x", b"\0asm\x0d\0\x01\0").is_ok());
    }
}
