//! Owns a token kept in a file, for both ends of the HTTP listener: read as
//! one word, from a file only its owner may read (the daemon's `--http-token-file`
//! and its own `http-token`, the client's `--token-file`), and why not.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why there is no token.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the token file `{}`: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the token file `{0}` is empty: put a secret in it (e.g. `(umask 077; openssl rand -hex 32 > {0})`)",
        .path.display()
    )]
    Empty { path: PathBuf },
    #[error(
        "the token file `{}` holds more than one word: the token is its one line",
        .path.display()
    )]
    NotOneWord { path: PathBuf },
    #[error(
        "the token file `{0}` is open to other users (mode {mode:o}, owner uid {uid}): \
         `chmod 600 {0}` if it is yours (the daemon makes its own http-token anew when \
         it is deleted)",
        .path.display()
    )]
    Exposed { path: PathBuf, mode: u32, uid: u32 },
    #[error("the token file `{}`, line {line}: {why}", .path.display())]
    Line {
        path: PathBuf,
        line: usize,
        why: String,
    },
    #[error("cannot make the HTTP token: reading /dev/urandom failed: {0}")]
    Random(std::io::Error),
    #[error("cannot write the HTTP token file `{}`: {source}", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Reads a file's one token (the daemon's own, a client's `--token-file`).
pub fn read_file(path: &Path) -> Result<String, TokenError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
        path: path.to_owned(),
        source,
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(TokenError::Empty {
            path: path.to_owned(),
        });
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(TokenError::NotOneWord {
            path: path.to_owned(),
        });
    }
    Ok(token.to_owned())
}

/// Refuses a token file that is not this user's, or that group or others
/// may read or write.
pub fn check_private(path: &Path) -> Result<(), TokenError> {
    let meta = std::fs::metadata(path).map_err(|source| TokenError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    let me = rustix::process::getuid().as_raw();
    if mode & 0o077 != 0 || meta.uid() != me {
        return Err(TokenError::Exposed {
            path: path.to_owned(),
            mode,
            uid: meta.uid(),
        });
    }
    Ok(())
}
