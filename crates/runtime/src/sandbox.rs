//! Owns what a guest may touch: the grants of one task (preopened
//! directories, environment variables, outbound HTTP hosts, its memory
//! limit), parsing them from `--dir HOST::GUEST[:ro]` and `--env K=V`
//! (`--allow-http` is parsed in `http_grant`), checking them against the
//! capabilities a plugin declares, and turning them into a WASI context.
//! Nothing is granted by default: no files, no environment, no sockets, no
//! HTTP.

#![forbid(unsafe_code)]

use std::path::PathBuf;

use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder};

use super::contract::Capability;
use super::grant_error::GrantError;
use super::http_grant::HttpAllow;
use super::secrets::{SecretRef, Secrets};

/// The default memory limit of a guest: all its linear memories together.
pub const DEFAULT_MAX_MEMORY: u64 = 256 << 20;

/// One preopened directory.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirGrant {
    /// The directory on the host.
    pub host: PathBuf,
    /// Where the guest sees it, such as `/data`.
    pub guest: String,
    /// Whether the guest may only read.
    pub read_only: bool,
}

impl DirGrant {
    /// Parses `HOST::GUEST` or `HOST::GUEST:ro` (the `::` separator keeps
    /// Windows-style or colon-containing host paths unambiguous).
    pub fn parse(text: &str) -> Result<Self, GrantError> {
        let err = || GrantError::DirSyntax(text.to_owned());
        let (host, guest) = text.split_once("::").ok_or_else(err)?;
        let (guest, read_only) = match guest.strip_suffix(":ro") {
            Some(g) => (g, true),
            None => (guest.strip_suffix(":rw").unwrap_or(guest), false),
        };
        if host.is_empty() || guest.is_empty() {
            return Err(err());
        }
        Ok(Self {
            host: PathBuf::from(host),
            guest: guest.to_owned(),
            read_only,
        })
    }
}

/// Parses `NAME=VALUE`.
pub fn parse_env(text: &str) -> Result<(String, String), GrantError> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(GrantError::EnvSyntax(text.to_owned())),
    }
}

/// Everything one task's guest is granted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sandbox {
    /// Preopened directories.
    pub dirs: Vec<DirGrant>,
    /// Environment variables, in order.
    pub env: Vec<(String, String)>,
    /// Environment variables whose values are secrets, looked up by name
    /// when each attempt starts (set after `env`).
    pub secrets: Vec<SecretRef>,
    /// What `wasi:config/store` answers the guest, over the runtime's own
    /// values ([`RuntimeConfig::config`](super::RuntimeConfig::config)).
    pub config: Vec<(String, String)>,
    /// The shared `wasi:keyvalue` buckets the guest may open besides its
    /// slot's (`--kv NAME`).
    pub kv: Vec<String>,
    /// Where outbound HTTP requests may go (none: every request is denied).
    pub http: Vec<HttpAllow>,
    /// Largest size, in bytes, of all the guest's linear memories together
    /// (a component may have several).
    pub max_memory: u64,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self {
            dirs: Vec::new(),
            env: Vec::new(),
            secrets: Vec::new(),
            config: Vec::new(),
            kv: Vec::new(),
            http: Vec::new(),
            max_memory: DEFAULT_MAX_MEMORY,
        }
    }
}

/// What a WASI command's context adds: its arguments (`program` first, as
/// `argv[0]`) and its standard input.
pub(crate) struct CommandArgs<'a> {
    pub(crate) program: &'a str,
    pub(crate) args: &'a [String],
    pub(crate) stdin: &'a [u8],
}

impl Sandbox {
    /// Checks that every host directory exists, so a typo fails at
    /// submission instead of in every attempt.
    pub fn check_dirs(&self) -> Result<(), GrantError> {
        for dir in &self.dirs {
            let missing = |why: String| GrantError::DirMissing {
                path: dir.host.display().to_string(),
                why,
            };
            match std::fs::metadata(&dir.host) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => return Err(missing("it is not a directory".into())),
                Err(e) => return Err(missing(e.to_string())),
            }
        }
        Ok(())
    }

    /// Refuses a submission whose grants do not cover the plugin's declared
    /// capabilities, naming the first missing grant and the flag to add.
    pub fn check_capabilities(&self, capabilities: &[Capability]) -> Result<(), GrantError> {
        for cap in capabilities {
            let covered = match cap {
                Capability::ReadDir(path) => self.dirs.iter().any(|d| &d.guest == path),
                Capability::WriteDir(path) => {
                    self.dirs.iter().any(|d| &d.guest == path && !d.read_only)
                }
                Capability::Env(name) => {
                    self.env.iter().any(|(k, _)| k == name)
                        || self.secrets.iter().any(|s| &s.var == name)
                }
                Capability::Network => !self.http.is_empty(),
            };
            if !covered {
                let (needed, fix) = match cap {
                    Capability::ReadDir(p) => (
                        format!("read access to `{p}`"),
                        format!("add --dir HOST_DIR::{p}:ro"),
                    ),
                    Capability::WriteDir(p) => (
                        format!("write access to `{p}`"),
                        format!("add --dir HOST_DIR::{p}"),
                    ),
                    Capability::Env(n) => (
                        format!("environment variable `{n}`"),
                        format!("add --env {n}=VALUE, or --env-secret {n}=SECRET"),
                    ),
                    Capability::Network => (
                        "outbound HTTP".to_owned(),
                        "add --allow-http HOST[:PORT] for each host it calls, such as \
                         --allow-http api.example.com (https) or --allow-http http://127.0.0.1:8080"
                            .to_owned(),
                    ),
                };
                return Err(GrantError::Missing { needed, fix });
            }
        }
        Ok(())
    }

    /// Refuses a variable granted twice (by `--env` and a secret, or by
    /// two secrets): which value the guest saw would depend on the order.
    pub fn check_secrets(&self) -> Result<(), GrantError> {
        for (i, secret) in self.secrets.iter().enumerate() {
            let twice = self.env.iter().any(|(k, _)| k == &secret.var)
                || self.secrets[..i].iter().any(|s| s.var == secret.var);
            if twice {
                return Err(GrantError::Twice(secret.var.clone()));
            }
        }
        Ok(())
    }

    /// Builds the WASI context of one attempt: only the granted directories
    /// and variables (secrets resolved now from `secrets`), sockets and
    /// name lookup denied, stdout/stderr captured.
    pub(crate) fn wasi_ctx(
        &self,
        stdout: impl wasmtime_wasi::cli::StdoutStream + 'static,
        stderr: impl wasmtime_wasi::cli::StdoutStream + 'static,
        secrets: &Secrets,
        command: Option<CommandArgs<'_>>,
        taped: Option<crate::record::TapedWorld<'_>>,
    ) -> Result<WasiCtx, GrantError> {
        let mut builder = WasiCtxBuilder::new();
        if let Some(taped) = taped {
            crate::record::tape_world(&mut builder, taped);
        }
        builder
            .stdout(stdout)
            .stderr(stderr)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        if let Some(command) = command {
            builder.arg(command.program).args(command.args).stdin(
                wasmtime_wasi::p2::pipe::MemoryInputPipe::new(bytes::Bytes::copy_from_slice(
                    command.stdin,
                )),
            );
        }
        for (k, v) in &self.env {
            builder.env(k, v);
        }
        for secret in &self.secrets {
            builder.env(&secret.var, secrets.resolve(&secret.name)?);
        }
        for dir in &self.dirs {
            let perms = if dir.read_only {
                FsPerms::ReadOnly
            } else {
                FsPerms::ReadWrite
            };
            builder
                .preopened_dir(&dir.host, &dir.guest, perms)
                .map_err(|e| GrantError::DirMissing {
                    path: dir.host.display().to_string(),
                    why: e.to_string(),
                })?;
        }
        Ok(builder.build())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dir_grants() {
        let g = DirGrant::parse("./data::/data:ro").unwrap();
        assert_eq!(
            (g.host.to_str().unwrap(), g.guest.as_str(), g.read_only),
            ("./data", "/data", true)
        );
        let g = DirGrant::parse("/tmp/x::/x").unwrap();
        assert!(!g.read_only);
        assert!(DirGrant::parse("/tmp/x:/x").is_err());
        assert!(DirGrant::parse("::/x").is_err());
    }

    #[test]
    fn capabilities_need_matching_grants() {
        let sandbox = Sandbox {
            dirs: vec![DirGrant::parse("/tmp::/data:ro").unwrap()],
            env: vec![("TOKEN".into(), "x".into())],
            ..Sandbox::default()
        };
        assert!(
            sandbox
                .check_capabilities(&[Capability::ReadDir("/data".into())])
                .is_ok()
        );
        assert!(
            sandbox
                .check_capabilities(&[Capability::Env("TOKEN".into())])
                .is_ok()
        );
        let err = sandbox
            .check_capabilities(&[Capability::WriteDir("/data".into())])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the plugin needs write access to `/data`, but this submission does not grant it: \
             add --dir HOST_DIR::/data"
        );
        let err = sandbox
            .check_capabilities(&[Capability::Network])
            .unwrap_err();
        assert!(
            err.to_string().contains("add --allow-http HOST[:PORT]"),
            "{err}"
        );
        let granted = Sandbox {
            http: vec!["api.example.com".parse().unwrap()],
            ..Sandbox::default()
        };
        assert!(granted.check_capabilities(&[Capability::Network]).is_ok());
    }
}
