//! Owns a plugin's content digest ([`Digest`]): sha256 of its bytes, its
//! text form (`sha256:` and 64 hex digits), and computing it without holding
//! up an async worker ([`digest_of`]). Plugins are cached, stored and
//! named by it everywhere.

#![forbid(unsafe_code)]

use std::sync::Arc;

use sha2::{Digest as _, Sha256};

/// A plugin's sha256 content digest.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The digest of these bytes.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// The 64 lower-case hex digits.
    pub fn hex(&self) -> String {
        String::from_utf8_lossy(&self.hex_digits()).into_owned()
    }

    /// The 64 lower-case hex digits, as ASCII bytes: a task's span
    /// formats them at every submission.
    fn hex_digits(&self) -> [u8; 64] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 64];
        for (pair, byte) in out.chunks_exact_mut(2).zip(self.0) {
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0xf)];
        }
        out
    }
}

impl std::str::FromStr for Digest {
    type Err = String;

    /// 64 hex digits, with or without `sha256:` in front.
    fn from_str(s: &str) -> Result<Self, String> {
        let hex = s.strip_prefix("sha256:").unwrap_or(s);
        let bad = || format!("`{s}` is not a sha256 digest (64 hex digits)");
        if hex.len() != 64 || !hex.is_ascii() {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Self(out))
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("sha256:")?;
        f.write_str(&String::from_utf8_lossy(&self.hex_digits()))
    }
}

/// Inputs over this many bytes are hashed on a blocking thread.
const LARGE: usize = 1 << 20;

/// The digest of `bytes`; over [`LARGE`], computed on a blocking thread
/// (15 ms for an 18 MiB component would hold up every task waiting on
/// that async worker). The bytes stay allocated by the caller: a large
/// buffer allocated on a short-lived blocking thread stays in that
/// thread's malloc arena once freed (30 MiB more RSS over 20 Python
/// plugins in the daemon).
pub async fn digest_of(bytes: &Arc<[u8]>) -> Digest {
    if bytes.len() <= LARGE {
        return Digest::of(bytes);
    }
    let input = Arc::clone(bytes);
    tokio::task::spawn_blocking(move || Digest::of(&input))
        .await
        .unwrap_or_else(|_| Digest::of(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_print_as_sha256_hex() {
        let d = Digest::of(b"");
        assert_eq!(
            d.to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
