//! The Python and JavaScript examples (`py-hello`, `js-hello`) for the
//! benches that run them (the suite's `host-run` rows, the daemon bench's
//! guest attempts): built once by `plugins/guests/build.sh` into the
//! target's temporary directory and reused.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The two examples' paths, building them first if needed; `None` (said on
/// stderr, naming `who` wants them) when a toolchain is missing.
pub fn examples(who: &str) -> Option<[PathBuf; 2]> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("guests-bench");
    let paths = [dir.join("py-hello.wasm"), dir.join("js-hello.wasm")];
    if paths.iter().all(|p| p.exists()) {
        return Some(paths);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/guests/build.sh");
    let built = Command::new("bash").arg(script).arg(&dir).status();
    if built.is_ok_and(|s| s.success()) && paths.iter().all(|p| p.exists()) {
        Some(paths)
    } else {
        eprintln!(
            "{who}: cannot build the Python and JavaScript examples (see \
             plugins/guests/build.sh); they are left out"
        );
        None
    }
}
