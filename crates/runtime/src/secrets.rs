//! Owns secrets by name: a submission names them ([`SecretRef`]: the
//! variable the guest sees and the secret's name), and the values are
//! looked up in a [`Secrets`] source when an attempt starts, so they are
//! never part of a request, a stored row, an event or a log. A daemon's
//! source is its operator's (a private directory with a file per secret,
//! and variables of its own environment it declares); `host run`'s is the
//! environment of the process, for the names it is given.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The longest secret name taken.
pub const MAX_SECRET_NAME: usize = 128;

/// The largest secret value read, in bytes.
pub const MAX_SECRET_BYTES: u64 = 64 << 10;

/// One secret a task's guest gets as an environment variable: the value of
/// secret `name`, looked up when each attempt starts, as variable `var`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct SecretRef {
    /// The environment variable the guest reads.
    pub var: String,
    /// The secret's name in the source.
    pub name: String,
}

impl SecretRef {
    /// Parses `--secret NAME` (the variable has the secret's name).
    pub fn parse_named(text: &str) -> Result<Self, SecretError> {
        check_name(text)?;
        Ok(Self {
            var: text.to_owned(),
            name: text.to_owned(),
        })
    }

    /// Parses `--env-secret VAR=NAME`.
    pub fn parse_env(text: &str) -> Result<Self, SecretError> {
        match text.split_once('=') {
            Some((var, name)) if !var.is_empty() => {
                check_name(name)?;
                Ok(Self {
                    var: var.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(SecretError::RefSyntax(text.to_owned())),
        }
    }
}

/// Refuses a secret name that could be anything but one file's name in the
/// secrets directory: letters, digits, `_`, `-` and `.`, not first.
pub fn check_name(name: &str) -> Result<(), SecretError> {
    let fine = !name.is_empty()
        && name.len() <= MAX_SECRET_NAME
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if fine {
        Ok(())
    } else {
        Err(SecretError::Name(name.to_owned()))
    }
}

/// A secret that could not be named, declared or resolved. No variant holds
/// a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// A name that is not one.
    #[error(
        "invalid secret name `{0}`: use up to 128 letters, digits, `_`, `-` or `.` (not first), \
         such as API_KEY"
    )]
    Name(String),
    /// `--env-secret` is not `VAR=NAME`.
    #[error("invalid --env-secret `{0}`: use VAR=NAME, such as --env-secret TOKEN=api-token")]
    RefSyntax(String),
    /// The source does not hold the secret.
    #[error("secret `{name}` is not defined here: {fix}")]
    Missing {
        /// The secret's name.
        name: String,
        /// Where the source looks, and how to add it.
        fix: String,
    },
    /// The secret exists but cannot be used.
    #[error("cannot read secret `{name}`: {why}")]
    Unreadable {
        /// The secret's name.
        name: String,
        /// What is wrong (never the value).
        why: String,
    },
    /// The source itself cannot be used.
    #[error("{0}")]
    Source(String),
}

/// Where secrets' values come from. Its `Debug` shows names, never values.
#[derive(Clone, Default)]
pub struct Secrets {
    /// A private directory with one file per secret, read at each lookup
    /// (so a changed file is used by the next attempt).
    dir: Option<PathBuf>,
    /// Values taken from the environment when the source was made.
    env: BTreeMap<String, String>,
    /// How to add a missing secret, for the error that names it.
    fix: String,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("dir", &self.dir)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Secrets {
    /// No secrets: every lookup fails, telling how to add one with `fix`.
    pub fn none(fix: impl Into<String>) -> Self {
        Self {
            dir: None,
            env: BTreeMap::new(),
            fix: fix.into(),
        }
    }

    /// A daemon's secrets: files in `dir` (which must be a directory of
    /// this user that no one else may enter), then the variables `env`
    /// names in this process's environment (each must be set). Fails
    /// naming the problem and its fix.
    pub fn for_daemon(dir: Option<&Path>, env: &[String]) -> Result<Self, SecretError> {
        let mut secrets = Self::none(
            "add a file of that name to the daemon's secrets directory (host serve \
             --secrets-dir DIR), or start the daemon with that variable in its environment \
             and --secret-env NAME",
        );
        if let Some(dir) = dir {
            check_private_dir(dir)?;
            secrets.dir = Some(dir.to_owned());
        }
        for name in env {
            check_name(name)?;
            let value = read_env(name)?.ok_or_else(|| {
                SecretError::Source(format!(
                    "--secret-env {name}: the daemon's environment has no variable `{name}`; \
                     set it before starting the daemon, or leave it out"
                ))
            })?;
            if let Some(dir) = &secrets.dir
                && dir.join(name).exists()
            {
                return Err(SecretError::Source(format!(
                    "secret `{name}` is declared twice: in the environment (--secret-env) and \
                     as a file in {}; keep one",
                    dir.display()
                )));
            }
            secrets.env.insert(name.clone(), value);
        }
        Ok(secrets)
    }

    /// `host run`'s secrets: the variables `names` names in this process's
    /// environment, read now. Unset ones fail at the attempt, naming them.
    pub fn from_environment<'a>(
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, SecretError> {
        let mut secrets = Self::none(
            "set an environment variable of that name for host run, such as export NAME=…",
        );
        for name in names {
            if let Some(value) = read_env(name)? {
                secrets.env.insert(name.to_owned(), value);
            }
        }
        Ok(secrets)
    }

    /// The names this source holds now (directory entries that are
    /// usable names, and the environment's), sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.env.keys().cloned().collect();
        if let Some(dir) = &self.dir
            && let Ok(entries) = std::fs::read_dir(dir)
        {
            for entry in entries.flatten() {
                if let Some(name) = entry.file_name().to_str()
                    && check_name(name).is_ok()
                {
                    names.push(name.to_owned());
                }
            }
        }
        names.sort();
        names.dedup();
        names
    }

    /// The value of secret `name` now.
    pub fn resolve(&self, name: &str) -> Result<String, SecretError> {
        check_name(name)?;
        if let Some(value) = self.env.get(name) {
            return Ok(value.clone());
        }
        let missing = || SecretError::Missing {
            name: name.to_owned(),
            fix: self.fix.clone(),
        };
        let Some(dir) = &self.dir else {
            return Err(missing());
        };
        let unreadable = |why: String| SecretError::Unreadable {
            name: name.to_owned(),
            why,
        };
        let path = dir.join(name);
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing()),
            Err(e) => return Err(unreadable(format!("{}: {e}", path.display()))),
        };
        if !meta.is_file() {
            return Err(unreadable(format!("{} is not a file", path.display())));
        }
        if meta.len() > MAX_SECRET_BYTES {
            return Err(unreadable(format!(
                "{} is over the limit of {MAX_SECRET_BYTES} bytes",
                path.display()
            )));
        }
        let bytes =
            std::fs::read(&path).map_err(|e| unreadable(format!("{}: {e}", path.display())))?;
        let mut text = String::from_utf8(bytes)
            .map_err(|_| unreadable(format!("{} is not UTF-8 text", path.display())))?;
        // `echo value > file` ends it with a newline no one means.
        if text.ends_with('\n') {
            text.pop();
            if text.ends_with('\r') {
                text.pop();
            }
        }
        Ok(text)
    }
}

/// The variable `name` of this process's environment, if set.
fn read_env(name: &str) -> Result<Option<String>, SecretError> {
    match std::env::var(name) {
        Ok(value) => Ok(Some(value)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(SecretError::Unreadable {
            name: name.to_owned(),
            why: "the environment variable is not UTF-8 text".into(),
        }),
    }
}

/// Refuses a secrets directory that is missing, someone else's, or open to
/// anyone but its owner.
fn check_private_dir(dir: &Path) -> Result<(), SecretError> {
    let shown = dir.display();
    let meta = std::fs::metadata(dir).map_err(|e| {
        SecretError::Source(format!("cannot use the secrets directory {shown}: {e}"))
    })?;
    if !meta.is_dir() {
        return Err(SecretError::Source(format!(
            "the secrets directory {shown} is not a directory"
        )));
    }
    let uid = rustix::process::getuid().as_raw();
    if meta.uid() != uid {
        return Err(SecretError::Source(format!(
            "the secrets directory {shown} belongs to user {} and this daemon runs as {uid}; \
             use a directory of the daemon's user",
            meta.uid()
        )));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(SecretError::Source(format!(
            "the secrets directory {shown} has mode {mode:o}, so other users may enter it; \
             run chmod 700 {shown}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_one_file_name() {
        assert!(check_name("API_KEY").is_ok());
        assert!(check_name("db.password-2").is_ok());
        for bad in ["", ".hidden", "a/b", "../x", "a b", &"x".repeat(129)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        let r = SecretRef::parse_env("TOKEN=api-token").unwrap();
        assert_eq!((r.var.as_str(), r.name.as_str()), ("TOKEN", "api-token"));
        assert!(SecretRef::parse_env("=x").is_err());
        assert!(SecretRef::parse_env("TOKEN=../x").is_err());
    }

    #[test]
    fn files_are_read_at_each_lookup_and_private() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let secrets = Secrets::for_daemon(Some(dir.path()), &[]).unwrap();
        let err = secrets.resolve("api").unwrap_err();
        assert!(err.to_string().contains("--secrets-dir"), "{err}");
        std::fs::write(dir.path().join("api"), "s3cret\n").unwrap();
        assert_eq!(secrets.resolve("api").unwrap(), "s3cret");
        std::fs::write(dir.path().join("api"), "rotated").unwrap();
        assert_eq!(secrets.resolve("api").unwrap(), "rotated");
        assert_eq!(secrets.names(), ["api"]);
        assert!(!format!("{secrets:?}").contains("rotated"));

        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
        let err = Secrets::for_daemon(Some(dir.path()), &[]).unwrap_err();
        assert!(err.to_string().contains("chmod 700"), "{err}");
    }
}
