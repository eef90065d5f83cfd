//! Owns the compiled artifacts this host writes to its cache directory and
//! maps back in: a plugin compiled once is loaded by the next process in
//! milliseconds, its native code mapped from the file, not copied, hashed or
//! decompressed, and its `describe` answer read from the artifact's record
//! instead of instantiating the plugin again.
//!
//! This is the one module of the workspace that may use `unsafe`, for one
//! call: [`Component::deserialize_file`], which trusts that the file is code
//! a compatible engine compiled. Everything before that call establishes it;
//! anything that does not check out is deleted and compiled again, never
//! loaded. It must not load a file it did not write, follow a link to one,
//! or load one while it could still change.
//!
//! Each plugin has two files in the directory, named by the component's
//! digest and the engine's identity (wasmtime's compatibility hash of the
//! engine's configuration, this host's version and the format):
//! `<digest>-<engine>.cwasm`, the serialized component, and
//! `<digest>-<engine>.meta`, a checksummed record of what the artifact is
//! (digest, engine, size and CRC-32 of the `.cwasm`, the plugin's size and
//! what its `describe` said). Both are written to a temporary file, synced
//! and renamed into place, the `.cwasm` first, so a record never names a
//! half-written artifact.

#![allow(unsafe_code)]

use std::fs::File;
use std::hash::{Hash as _, Hasher};
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::contract::PluginInfo;
use super::digest::Digest;
use super::file_digests;

/// The layout of the files; a change makes every older artifact foreign.
const FORMAT: u32 = 1;

/// Artifacts kept in one directory, in bytes of `.cwasm` files: past it the
/// oldest written go first.
pub(crate) const MAX_ARTIFACT_BYTES: u64 = 4 << 30;

/// The record beside an artifact.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Record {
    format: u32,
    engine: String,
    digest: Digest,
    /// Size of the plugin's component in bytes.
    size: usize,
    /// Size and CRC-32 of the `.cwasm` file.
    bytes: u64,
    crc32: u32,
    info: PluginInfo,
}

/// The artifact directory of one engine.
#[derive(Debug)]
pub(crate) struct Artifacts {
    dir: PathBuf,
    engine_id: String,
}

/// Feeds [`Engine::precompile_compatibility_hash`] into SHA-256, so the
/// engine's identity is stable across processes (std's hashers are not).
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    /// Not used: the identity is the SHA-256 digest of what was written.
    fn finish(&self) -> u64 {
        0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// The identity of `engine`'s compiled code: 16 hex digits.
fn engine_id(engine: &Engine) -> String {
    let mut hasher = Sha256Hasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hasher.write(env!("CARGO_PKG_VERSION").as_bytes());
    hasher.write(&FORMAT.to_le_bytes());
    hasher.0.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Why a file cannot be trusted, for the log line.
fn untrusted(path: &Path, meta: &std::fs::Metadata) -> Option<String> {
    let euid = rustix::process::geteuid().as_raw();
    if meta.uid() != euid {
        return Some(format!(
            "{} is owned by uid {}, not by this process's uid {euid}",
            path.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Some(format!(
            "{} is writable by other users (mode {:o})",
            path.display(),
            meta.mode() & 0o7777
        ));
    }
    None
}

impl Artifacts {
    /// The artifacts of `engine` in `dir`, created owner-only if missing.
    /// `None`, with a warning that names the fix, when the directory cannot
    /// be created or is not private to this user: plugins then compile in
    /// every process.
    pub(crate) fn open(dir: &Path, engine: &Engine) -> Option<Self> {
        let refuse = |why: String| {
            tracing::warn!(
                "compiled plugins are not cached on disk: {why}; every process compiles \
                 them again (use a directory only you can write, or --no-cache)"
            );
            None
        };
        if let Err(err) = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
        {
            return refuse(format!("cannot create {}: {err}", dir.display()));
        }
        let meta = match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => meta,
            Ok(_) => return refuse(format!("{} is not a directory", dir.display())),
            Err(err) => return refuse(format!("cannot read {}: {err}", dir.display())),
        };
        if let Some(why) = untrusted(dir, &meta) {
            return refuse(why);
        }
        Some(Self {
            dir: dir.to_owned(),
            engine_id: engine_id(engine),
        })
    }

    /// The directory (owner-only, checked by [`Artifacts::open`]).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    fn paths(&self, digest: &Digest) -> (PathBuf, PathBuf) {
        let stem = format!("{}-{}", digest.hex(), self.engine_id);
        (
            self.dir.join(format!("{stem}.cwasm")),
            self.dir.join(format!("{stem}.meta")),
        )
    }

    /// The compiled component with this digest and what its `describe`
    /// said, if this host stored them and they check out. Anything else is
    /// deleted (with a warning unless simply absent). Blocking.
    pub(crate) fn load(
        &self,
        engine: &Engine,
        digest: &Digest,
        size: usize,
    ) -> Option<(Component, PluginInfo)> {
        let (cwasm, meta) = self.paths(digest);
        let record = match std::fs::read(&meta) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return None,
            Err(err) => return self.discard(digest, &format!("cannot read its record: {err}")),
        };
        let record = match parse_record(&record) {
            Ok(record) => record,
            Err(why) => return self.discard(digest, &why),
        };
        if record.format != FORMAT
            || record.engine != self.engine_id
            || record.digest != *digest
            || record.size != size
        {
            return self.discard(digest, "its record is of another plugin or engine");
        }
        if let Err(why) = check_file(&cwasm, record.bytes, record.crc32) {
            return self.discard(digest, &why);
        }
        // SAFETY: `deserialize_file` requires that the file holds code that
        // wasmtime serialized for an engine compatible with `engine`, and
        // that it does not change while mapped. This host wrote it itself
        // (`store`): into a directory `open` checked is owned by this user
        // and writable by no one else, as a regular file owned by this user
        // and writable by no one else (checked just now, without following
        // links), under a name and a record that carry the digest of the
        // component and the compatibility hash of this engine and host
        // version; and its size and CRC-32 match the record written after
        // it, so it is neither truncated nor corrupt. Files are only ever
        // replaced by renaming a new one into place, never written in
        // place, so a mapping never sees a change. wasmtime checks the
        // engine's compatibility again while deserializing.
        let loaded = unsafe { Component::deserialize_file(engine, &cwasm) };
        match loaded {
            Ok(component) => Some((component, record.info)),
            Err(err) => self.discard(
                digest,
                &format!("wasmtime refused it: {}", super::failure::error_chain(&err)),
            ),
        }
    }

    /// Deletes the artifact of `digest`, saying why.
    fn discard<T>(&self, digest: &Digest, why: &str) -> Option<T> {
        tracing::warn!("compiling {digest} again: its compiled artifact is unusable ({why})");
        let (cwasm, meta) = self.paths(digest);
        let _ = std::fs::remove_file(meta);
        let _ = std::fs::remove_file(cwasm);
        None
    }

    /// Writes the artifact of a freshly compiled and described plugin.
    /// Best effort: a failure costs the next process a compile, so it is
    /// logged, not returned. Blocking.
    pub(crate) fn store(
        &self,
        digest: &Digest,
        size: usize,
        component: &Component,
        info: &PluginInfo,
    ) {
        if let Err(err) = self.try_store(digest, size, component, info) {
            tracing::warn!("cannot cache the compiled {digest}: {err}");
        }
    }

    fn try_store(
        &self,
        digest: &Digest,
        size: usize,
        component: &Component,
        info: &PluginInfo,
    ) -> wasmtime::Result<()> {
        let code = component.serialize()?;
        let record = Record {
            format: FORMAT,
            engine: self.engine_id.clone(),
            digest: *digest,
            size,
            bytes: code.len() as u64,
            crc32: crc32fast::hash(&code),
            info: info.clone(),
        };
        let body = serde_json::to_vec(&record)?;
        let mut text = format!("{:08x}\n", crc32fast::hash(&body)).into_bytes();
        text.extend_from_slice(&body);
        let (cwasm, meta) = self.paths(digest);
        write_atomically(&cwasm, &code)?;
        write_atomically(&meta, &text)?;
        self.evict(MAX_ARTIFACT_BYTES);
        Ok(())
    }

    /// Deletes the oldest artifacts until those left take at most `max`
    /// bytes.
    fn evict(&self, max: u64) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let now = std::time::SystemTime::now();
        let stale = now - file_digests::STALE;
        let abandoned = now - std::time::Duration::from_secs(3600);
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let Some((len, modified)) = entry
                .metadata()
                .ok()
                .and_then(|m| Some((m.len(), m.modified().ok()?)))
            else {
                continue;
            };
            match path.extension().and_then(|x| x.to_str()) {
                Some("cwasm") => files.push((modified, len, path)),
                Some(file_digests::EXTENSION) if modified < stale => {
                    let _ = std::fs::remove_file(&path);
                }
                // Left by a writer that died before its rename.
                Some(x) if x.starts_with("tmp") && modified < abandoned => {
                    let _ = std::fs::remove_file(&path);
                }
                _ => {}
            }
        }
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, path) in files {
            if total <= max {
                break;
            }
            let _ = std::fs::remove_file(path.with_extension("meta"));
            let _ = std::fs::remove_file(&path);
            total = total.saturating_sub(len);
        }
    }
}

/// The record of `text` (its first line is the CRC-32 of the rest).
fn parse_record(text: &[u8]) -> Result<Record, String> {
    let newline = text
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("its record has no checksum line")?;
    let (line, body) = (&text[..newline], &text[newline + 1..]);
    let want = std::str::from_utf8(line)
        .ok()
        .and_then(|s| u32::from_str_radix(s, 16).ok())
        .ok_or("its record's checksum line is not a checksum")?;
    if crc32fast::hash(body) != want {
        return Err("its record is corrupt (checksum mismatch)".into());
    }
    serde_json::from_slice(body).map_err(|e| format!("its record does not parse: {e}"))
}

/// Checks that the `.cwasm` at `path` is a regular file of this user that
/// no one else can write, `bytes` long, with this CRC-32.
fn check_file(path: &Path, bytes: u64, crc32: u32) -> Result<(), String> {
    let mut file = File::options()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if let Some(why) = untrusted(path, &meta) {
        return Err(why);
    }
    if meta.len() != bytes {
        return Err(format!(
            "it is {} bytes, its record says {bytes} (truncated or replaced)",
            meta.len()
        ));
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = [0u8; 64 << 10];
    loop {
        let n = file.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    if hasher.finalize() != crc32 {
        return Err("its checksum does not match its record (corrupt)".into());
    }
    Ok(())
}

/// Writes `bytes` to `path` through a synced temporary file in the same
/// directory, readable and writable by this user only.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = file_digests::temporary_name(path);
    let result = (|| {
        let mut file = File::options()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
