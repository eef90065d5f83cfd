//! Compiled artifacts on disk (the cache directory of `host run` and
//! `host inspect`): a warm run maps the artifact this host wrote; a
//! truncated, corrupt, foreign or unprotected artifact is detected, deleted
//! and compiled again, never loaded; a plugin file changed in place is read
//! again, not taken for the version whose digest was remembered.

use crate::common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::Finished;

fn run_hello(cache: &Path) -> Finished {
    run_plugin(cache, &common::plugin("hello"))
}

fn run_plugin(cache: &Path, plugin: &Path) -> Finished {
    let out = common::host()
        .args(["run", "--cache-dir"])
        .arg(cache)
        .arg(plugin)
        .args(["--input", "hi"])
        .output()
        .expect("spawn host");
    let out = Finished {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "hi", "{}", out.stderr);
    out
}

/// The files of `dir` with this extension.
fn files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == extension))
        .collect();
    found.sort();
    found
}

/// A cache with the artifact of `hello`: its `.cwasm` and its bytes.
fn warm_cache() -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let root = tempfile::tempdir().unwrap();
    let cache = root.path().join("cache");
    let out = run_hello(&cache);
    assert!(!out.stderr.contains("unusable"), "{}", out.stderr);
    let cwasm = files(&cache, "cwasm");
    assert_eq!(cwasm.len(), 1, "one artifact: {cwasm:?}");
    assert_eq!(files(&cache, "meta").len(), 1);
    let bytes = std::fs::read(&cwasm[0]).unwrap();
    (root, cwasm[0].clone(), bytes)
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// The cache directory is created owner-only, its files readable and
/// writable by their owner only, and a second run uses the artifact
/// without writing it again.
#[test]
fn artifacts_are_private_and_reused() {
    let (root, cwasm, bytes) = warm_cache();
    let cache = root.path().join("cache");
    assert_eq!(mode(&cache), 0o700);
    assert_eq!(mode(&cwasm), 0o600);
    assert_eq!(mode(&cwasm.with_extension("meta")), 0o600);
    let written = std::fs::metadata(&cwasm).unwrap().modified().unwrap();
    let out = run_hello(&cache);
    assert!(!out.stderr.contains("unusable"), "{}", out.stderr);
    assert_eq!(
        std::fs::metadata(&cwasm).unwrap().modified().unwrap(),
        written,
        "a hit does not write the artifact again"
    );
    assert_eq!(std::fs::read(&cwasm).unwrap(), bytes);
}

/// Truncated, then corrupt in one byte: each is found, said, and replaced
/// by a fresh compile whose bytes are the original artifact's.
#[test]
fn a_truncated_or_corrupt_artifact_is_compiled_again() {
    let (root, cwasm, bytes) = warm_cache();
    let cache = root.path().join("cache");

    std::fs::File::options()
        .write(true)
        .open(&cwasm)
        .unwrap()
        .set_len(bytes.len() as u64 / 2)
        .unwrap();
    let out = run_hello(&cache);
    assert!(
        out.stderr.contains("compiled artifact is unusable") && out.stderr.contains("truncated"),
        "{}",
        out.stderr
    );
    assert_eq!(std::fs::read(&cwasm).unwrap(), bytes, "compiled again");

    let mut corrupt = bytes.clone();
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 0x40;
    std::fs::write(&cwasm, &corrupt).unwrap();
    let out = run_hello(&cache);
    assert!(
        out.stderr.contains("compiled artifact is unusable") && out.stderr.contains("corrupt"),
        "{}",
        out.stderr
    );
    assert_eq!(std::fs::read(&cwasm).unwrap(), bytes, "compiled again");

    // A record that is not the one written is not trusted either.
    let meta = cwasm.with_extension("meta");
    let mut record = std::fs::read(&meta).unwrap();
    let last = record.len() - 2;
    record[last] ^= 0x01;
    std::fs::write(&meta, &record).unwrap();
    let out = run_hello(&cache);
    assert!(
        out.stderr.contains("its record is corrupt"),
        "{}",
        out.stderr
    );
    assert_eq!(std::fs::read(&cwasm).unwrap(), bytes);
}

/// Another plugin's artifact and record under this plugin's name (as a
/// copy or a stale file would leave them) are refused: the record names
/// another digest.
#[test]
fn a_foreign_artifact_is_never_loaded() {
    let (root, cwasm, bytes) = warm_cache();
    let cache = root.path().join("cache");
    let other = root.path().join("other");
    let out = common::host()
        .args(["inspect", "--cache-dir"])
        .arg(&other)
        .arg(common::plugin("chatty"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let foreign = files(&other, "cwasm");
    assert_eq!(foreign.len(), 1);
    std::fs::copy(&foreign[0], &cwasm).unwrap();
    std::fs::copy(
        foreign[0].with_extension("meta"),
        cwasm.with_extension("meta"),
    )
    .unwrap();
    let out = run_hello(&cache);
    assert!(
        out.stderr
            .contains("its record is of another plugin or engine"),
        "{}",
        out.stderr
    );
    assert_eq!(std::fs::read(&cwasm).unwrap(), bytes, "compiled again");
}

/// An artifact another user could have written is not loaded, nor is a
/// directory others may write to used at all.
#[test]
fn artifacts_others_can_write_are_not_trusted() {
    let (root, cwasm, bytes) = warm_cache();
    let cache = root.path().join("cache");
    std::fs::set_permissions(&cwasm, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = run_hello(&cache);
    assert!(
        out.stderr.contains("is writable by other users"),
        "{}",
        out.stderr
    );
    assert_eq!(mode(&cwasm), 0o600, "written again, owner-only");
    assert_eq!(std::fs::read(&cwasm).unwrap(), bytes);

    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    let written = std::fs::metadata(&cwasm).unwrap().modified().unwrap();
    let out = run_hello(&cache);
    assert!(
        out.stderr
            .contains("compiled plugins are not cached on disk")
            && out.stderr.contains("writable by other users"),
        "{}",
        out.stderr
    );
    assert_eq!(
        std::fs::metadata(&cwasm).unwrap().modified().unwrap(),
        written,
        "the directory is not used"
    );
}

/// The digest a warm run remembers for a plugin file is forgotten when the
/// file is rewritten in place with other bytes of the same size: `inspect`
/// shows the new digest.
#[test]
fn a_plugin_rewritten_in_place_is_read_again() {
    let root = tempfile::tempdir().unwrap();
    let cache = root.path().join("cache");
    let hello = std::fs::read(common::plugin("hello")).unwrap();
    let variant =
        |n: u64| plugin_artifacts::with_custom_section(&hello, "taskhost-test", &n.to_le_bytes());
    let (first, second) = (variant(1), variant(2));
    assert_eq!(first.len(), second.len());
    let path = root.path().join("plugin.wasm");
    std::fs::write(&path, &first).unwrap();
    // A file is remembered only once it has been unchanged for 2 s; its
    // change time cannot be set back, so wait for it to age.
    let changed = std::fs::metadata(&path).unwrap().modified().unwrap();
    while SystemTime::now() < changed + Duration::from_millis(2100) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let digest = |out: Finished| -> String {
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        out.json()["digest"].as_str().unwrap().to_owned()
    };
    let inspect = || {
        let out = common::host()
            .args(["inspect", "--json", "--cache-dir"])
            .arg(&cache)
            .arg(&path)
            .output()
            .unwrap();
        Finished {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    };
    let one = digest(inspect());
    assert_eq!(
        files(&cache, "digest").len(),
        1,
        "the file's digest is remembered"
    );
    assert_eq!(digest(inspect()), one, "and used");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &second))
        .unwrap();
    let two = digest(inspect());
    assert_ne!(one, two, "the rewritten file is read again");
}
