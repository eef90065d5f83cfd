//! Owns the words of a refused grant ([`GrantError`]): a `--dir`, `--env`
//! or `--allow-http` that does not parse, a directory that is not there, a
//! secret that cannot be resolved, a variable granted twice, a capability
//! the plugin declares that nothing grants. Parsing and checking the
//! grants is the business of `sandbox` and `http_grant`.

#![forbid(unsafe_code)]

use super::secrets::SecretError;

/// A grant that could not be parsed or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    /// `--dir` is not `HOST::GUEST[:ro]`.
    #[error("invalid --dir `{0}`: use HOST::GUEST or HOST::GUEST:ro, such as ./data::/data:ro")]
    DirSyntax(String),
    /// The host directory does not exist or is not a directory.
    #[error("cannot grant directory `{path}`: {why}")]
    DirMissing {
        /// The host path.
        path: String,
        /// The OS error.
        why: String,
    },
    /// `--env` is not `K=V`.
    #[error("invalid --env `{0}`: use NAME=VALUE")]
    EnvSyntax(String),
    /// `--allow-http` is not `[http://]HOST[:PORT]`.
    #[error(
        "invalid --allow-http `{text}`: {why}; use HOST, HOST:PORT, *.DOMAIN or http://HOST:PORT, \
         such as --allow-http api.example.com"
    )]
    HttpSyntax {
        /// What was given.
        text: String,
        /// What is wrong with it.
        why: String,
    },
    /// A secret could not be resolved (never holds its value).
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// One environment variable granted twice.
    #[error(
        "the environment variable `{0}` is granted twice (by --env, --secret or --env-secret); \
         grant it once"
    )]
    Twice(String),
    /// A declared capability has no grant.
    #[error("the plugin needs {needed}, but this submission does not grant it: {fix}")]
    Missing {
        /// The capability, for people.
        needed: String,
        /// The flag that grants it.
        fix: String,
    },
}
