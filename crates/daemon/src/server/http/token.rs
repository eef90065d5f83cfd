//! Owns the HTTP listener's bearer token: the operator's
//! (`--http-token-file`, one line), or, on a loopback bind without one, the
//! daemon's own: 32 random bytes from the OS in hex, kept in
//! `<state dir>/http-token` (owner-only, written whole under a temporary
//! name and linked into place, so a half-written or replaced file is never
//! read) and reused by later starts. Also reading `Authorization: Bearer`
//! and comparing in constant time.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use axum::http::{HeaderMap, header};

use crate::server::scope::{Credential, Reach, Scope};
use crate::service::namespace::Ns;
pub use crate::wire::token_file::{TokenError, check_private, read_file};

/// The name of the daemon's own token file in its state directory.
pub(crate) const OWN_TOKEN_FILE: &str = "http-token";

/// Random bytes in a token the daemon makes.
const TOKEN_BYTES: usize = 32;

/// The tokens the listener accepts, kept as SHA-256 digests with their
/// scopes and namespaces.
#[derive(Debug, Clone)]
pub(crate) struct Tokens {
    entries: Vec<([u8; 32], Credential)>,
}

impl Tokens {
    /// One token with `admin` scope of every namespace (the daemon's own).
    pub(crate) fn admin(token: &str) -> Tokens {
        Tokens {
            entries: vec![(digest(token), Credential::operator())],
        }
    }

    /// The credential of `given`, if it is one of these tokens (the first
    /// line that names it). Every entry is compared, each in constant
    /// time, so the time taken says nothing of which (or how much of one)
    /// matched.
    pub(crate) fn credential_of(&self, given: &str) -> Option<Credential> {
        let given = digest(given);
        self.entries
            .iter()
            .fold(None, |found, (entry, credential)| {
                if same(&given, entry) && found.is_none() {
                    Some(credential.clone())
                } else {
                    found
                }
            })
    }
}

fn digest(token: &str) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(token.as_bytes()).into()
}

/// Reads the operator's token file: one `SCOPE TOKEN [NAMESPACE]` line per
/// token (scope `read`, `submit` or `admin`; the namespace it reaches, `*`
/// or none for every one), a line with only a token meaning `admin` of
/// every namespace; blank lines and lines starting with `#` are skipped.
/// Refused when other users could read it.
pub(crate) fn read_tokens(path: &Path) -> Result<Tokens, TokenError> {
    check_private(path)?;
    let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut entries = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let line_error = |why: String| TokenError::Line {
            path: path.to_owned(),
            line: number + 1,
            why,
        };
        let reach = match words[..] {
            [_, _, "*"] | [_, _] | [_] => Reach::Every,
            [_, _, namespace] => {
                crate::wire::protocol::check_namespace_name(namespace).map_err(line_error)?;
                Reach::One(Ns::named(Some(namespace)))
            }
            _ => Reach::Every,
        };
        let (scope, token) = match words[..] {
            [token] => (Scope::Admin, token),
            [scope, token] | [scope, token, _] => match Scope::parse(scope) {
                Some(scope) => (scope, token),
                None => {
                    return Err(TokenError::Line {
                        path: path.to_owned(),
                        line: number + 1,
                        why: format!(
                            "`{}` is not a scope: one of read, submit, admin",
                            scope.escape_debug()
                        ),
                    });
                }
            },
            _ => {
                return Err(TokenError::Line {
                    path: path.to_owned(),
                    line: number + 1,
                    why: "a line is `SCOPE TOKEN [NAMESPACE]` or a bare token (admin of every \
                          namespace)"
                        .into(),
                });
            }
        };
        if token.chars().any(char::is_control) {
            return Err(TokenError::Line {
                path: path.to_owned(),
                line: number + 1,
                why: "the token holds a control character".into(),
            });
        }
        entries.push((digest(token), Credential { scope, reach }));
    }
    if entries.is_empty() {
        return Err(TokenError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(Tokens { entries })
}

/// The daemon's own token in `state_dir`: the one there (if only its owner
/// can read it), else a new one written there.
pub(crate) fn own(state_dir: &Path) -> Result<(String, PathBuf), TokenError> {
    let path = state_dir.join(OWN_TOKEN_FILE);
    match read_own(&path) {
        Ok(token) => return Ok((token, path)),
        Err(TokenError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err),
    }
    let token = random_hex()?;
    let temporary = state_dir.join(format!(".{OWN_TOKEN_FILE}.{}", std::process::id()));
    let write = |source| TokenError::Write {
        path: path.clone(),
        source,
    };
    // A leftover of a crashed start with this pid is ours to replace.
    let _ = std::fs::remove_file(&temporary);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)
        .and_then(|mut file| {
            file.write_all(format!("{token}\n").as_bytes())?;
            file.sync_all()
        });
    if let Err(source) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(write(source));
    }
    // A link never replaces a file: a daemon that made one meanwhile wins,
    // and both use its token.
    let linked = std::fs::hard_link(&temporary, &path);
    let _ = std::fs::remove_file(&temporary);
    match linked {
        Ok(()) => Ok((token, path)),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
            read_own(&path).map(|token| (token, path))
        }
        Err(source) => Err(write(source)),
    }
}

/// Reads the daemon's own token file, refusing one others could read.
fn read_own(path: &Path) -> Result<String, TokenError> {
    check_private(path)?;
    read_file(path)
}

/// `TOKEN_BYTES` bytes from the OS's random source, in lowercase hex.
fn random_hex() -> Result<String, TokenError> {
    let mut bytes = [0u8; TOKEN_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .map_err(TokenError::Random)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The token of an `Authorization: Bearer <token>` header (the scheme's
/// case aside), if there is one.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Compares in time independent of where the bytes differ.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_own_token_is_made_once_owner_only_and_reused() {
        let dir = std::env::temp_dir().join(format!("taskhost-token-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (first, path) = own(&dir).unwrap();
        assert_eq!(first.len(), 2 * TOKEN_BYTES);
        assert!(first.chars().all(|c| c.is_ascii_hexdigit()), "{first}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (again, _) = own(&dir).unwrap();
        assert_eq!(again, first, "reused");
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, [OWN_TOKEN_FILE], "no temporary file is left");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = own(&dir).unwrap_err().to_string();
        assert!(err.contains("is open to other users (mode 644"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn bearer_tokens_are_read_and_compared() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer(&headers), None);
        headers.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&headers), Some("abc"));
        headers.insert(header::AUTHORIZATION, "bearer  abc ".parse().unwrap());
        assert_eq!(bearer(&headers), Some("abc"));
        headers.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&headers), None);
        headers.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer(&headers), None);
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
    }
}
