//! Owns where the daemon's socket lives and who may use it: a per-user
//! default path, an owner-only (0700) directory, an owner-only (0600)
//! socket, refusing a directory that someone else owns or could write to,
//! and the client's checks before it sends anything: the same of the
//! directory, and that the process answering is this user's.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The environment variable that names the socket.
pub const SOCKET_ENV: &str = "TASKHOST_SOCKET";

/// This process's real user id, read from `/proc/self/status`.
pub fn current_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The per-user default socket: `$XDG_RUNTIME_DIR/taskhost/host.sock`, else
/// `/tmp/taskhost-<uid>/host.sock`.
pub fn default_socket() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
    {
        return dir.join("taskhost").join("host.sock");
    }
    let uid = current_uid().map_or_else(|| "user".to_owned(), |u| u.to_string());
    std::env::temp_dir()
        .join(format!("taskhost-{uid}"))
        .join("host.sock")
}

/// `--socket`, else `TASKHOST_SOCKET`, else the per-user default.
pub fn resolve(flag: Option<&Path>) -> PathBuf {
    flag.map(Path::to_path_buf)
        .or_else(|| {
            std::env::var_os(SOCKET_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(default_socket)
}

/// Creates the socket's directory owner-only, or checks that an existing one
/// belongs to us and that nobody else can write to it (so nobody can swap
/// the socket for their own).
pub fn prepare_dir(socket: &Path) -> Result<(), String> {
    let dir = socket_dir(socket);
    match std::fs::metadata(dir) {
        Ok(_) => check_dir(socket, "choose a --socket in a directory of your own"),
        Err(_) => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| {
                format!(
                    "cannot create the socket directory `{}`: {e}",
                    dir.display()
                )
            }),
    }
}

/// The client's check before it connects: the socket's directory belongs
/// to this user and nobody else can write to it, so nobody else can have
/// put a socket of theirs there (to receive plugins, inputs and env
/// values).
pub fn check_for_client(socket: &Path) -> Result<(), String> {
    check_dir(
        socket,
        "another user could have put it there; point --socket (or TASKHOST_SOCKET) at the \
         socket of your own daemon, in a directory only you can write to",
    )
}

/// The client's check once connected: the daemon answering is a process of
/// this user's (`SO_PEERCRED`).
pub fn check_peer(socket: &Path, peer_uid: u32) -> Result<(), String> {
    match current_uid() {
        Some(uid) if uid != peer_uid => Err(format!(
            "the process answering at `{}` runs as another user (uid {peer_uid}, you are \
             {uid}); nothing was sent to it. Point --socket (or TASKHOST_SOCKET) at your own \
             daemon",
            socket.display()
        )),
        _ => Ok(()),
    }
}

fn socket_dir(socket: &Path) -> &Path {
    socket
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// The directory of `socket` exists, is ours and nobody else may write to
/// it; otherwise why not, ending with `fix`.
fn check_dir(socket: &Path, fix: &str) -> Result<(), String> {
    let dir = socket_dir(socket);
    let meta = std::fs::metadata(dir)
        .map_err(|e| format!("cannot use the socket directory `{}`: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("`{}` is not a directory", dir.display()));
    }
    if current_uid().is_some_and(|uid| meta.uid() != uid) {
        return Err(format!(
            "the socket directory `{}` belongs to another user (uid {}); {fix}",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "the socket directory `{}` is writable by others (mode {:o}); {fix}",
            dir.display(),
            meta.mode() & 0o777
        ));
    }
    Ok(())
}

/// Makes the socket file owner-only.
pub fn restrict(socket: &Path) -> Result<(), String> {
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot restrict `{}` to its owner: {e}", socket.display()))
}
