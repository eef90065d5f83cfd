//! `sandbox-probe`: tries what the sandbox should forbid unless granted, and
//! reports what happened as one JSON object:
//!
//! ```json
//! {"read":"ok:<contents>"|"denied:<error>","write":"ok"|"denied:<error>",
//!  "env":"ok:<value>"|"missing","env_count":N,"env_names":["A","B"],
//!  "socket":"ok"|"denied:<error>","config":{"KEY":"VALUE"}}
//! ```
//!
//! Params: `read` (default `/data/probe.txt`): a file to read; `write`
//! (default `/data/probe-write.txt`): a file to create; `var` (default
//! `PROBE_VAR`): an environment variable to read; `port` (default 9): a TCP
//! port on 127.0.0.1 to connect to; `list` (none by default): a directory
//! whose entries, in the order read, are reported as `"list":"ok:NAME/,NAME"`
//! (a `/` after a directory's name); `show` (default `value`): `digest`
//! reports the variable as `"digest:<FNV-1a 64 of its bytes, hex>:<length>"`
//! instead of its value, so a test can check a secret without the output
//! holding it.
//!
//! It declares no capabilities, so it can be submitted without any grant.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpStream};

use taskhost_guest::{Context, PluginInfo, Task, TaskError};

/// The entries of `dir`, in the order read: `ok:NAME/,NAME`, or why not.
fn list(dir: &str) -> String {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) => return format!("denied:{err}"),
    };
    let mut names = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => {
                let slash = entry.file_type().is_ok_and(|t| t.is_dir());
                let name = entry.file_name().to_string_lossy().into_owned();
                names.push(if slash { format!("{name}/") } else { name });
            }
            Err(err) => return format!("denied:{err}"),
        }
    }
    format!("ok:{}", names.join(","))
}

/// At most this many bytes of the read file are reported.
const MAX_READ: usize = 4096;

struct SandboxProbe;

impl Task for SandboxProbe {
    fn describe() -> PluginInfo {
        PluginInfo::new("sandbox-probe", "0.1.0").description(
            "Tries to read and write files, read the environment and open a socket; reports JSON",
        )
    }

    fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let read_path = ctx.param_or("read", "/data/probe.txt");
        let write_path = ctx.param_or("write", "/data/probe-write.txt");
        let var = ctx.param_or("var", "PROBE_VAR");
        let port: u16 = ctx.param_parse_or("port", 9)?;

        let read = match std::fs::read(read_path) {
            Ok(bytes) => {
                let shown = &bytes[..bytes.len().min(MAX_READ)];
                format!("ok:{}", String::from_utf8_lossy(shown))
            }
            Err(err) => format!("denied:{err}"),
        };
        let write = match std::fs::write(write_path, b"written by sandbox-probe\n") {
            Ok(()) => "ok".to_string(),
            Err(err) => format!("denied:{err}"),
        };
        let digest = ctx.param_or("show", "value") == "digest";
        let env = match std::env::var_os(var) {
            Some(value) if digest => {
                let bytes = value.as_encoded_bytes();
                format!("digest:{:016x}:{}", fnv1a(bytes), bytes.len())
            }
            Some(value) => format!("ok:{}", value.to_string_lossy()),
            None => "missing".to_string(),
        };
        let env_names: Vec<String> = std::env::vars_os()
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect();
        let socket = match TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port))) {
            Ok(_) => "ok".to_string(),
            Err(err) => format!("denied:{err}"),
        };

        let mut config = taskhost_guest::config::all()?;
        config.sort();

        let mut json = String::from("{");
        let _ = write!(json, "\"read\":{}", quote(&read));
        let _ = write!(json, ",\"write\":{}", quote(&write));
        let _ = write!(json, ",\"env\":{}", quote(&env));
        let _ = write!(json, ",\"env_count\":{}", env_names.len());
        let names: Vec<String> = env_names.iter().map(|n| quote(n)).collect();
        let _ = write!(json, ",\"env_names\":[{}]", names.join(","));
        let _ = write!(json, ",\"socket\":{}", quote(&socket));
        let pairs: Vec<String> = config
            .iter()
            .map(|(k, v)| format!("{}:{}", quote(k), quote(v)))
            .collect();
        let _ = write!(json, ",\"config\":{{{}}}", pairs.join(","));
        if let Some(dir) = ctx.param("list") {
            let _ = write!(json, ",\"list\":{}", quote(&list(dir)));
        }
        json.push('}');
        Ok(json.into_bytes())
    }
}

/// FNV-1a, 64 bits.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `text` as a JSON string literal.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

taskhost_guest::export_task!(SandboxProbe);
