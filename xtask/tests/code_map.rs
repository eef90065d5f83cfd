//! The code map cannot drift from the code: every folder of the crates
//! opens (in its `lib.rs` or `mod.rs`) with a table of exactly the files
//! and folders in it; TESTING.md names every test file; ARCHITECTURE.md
//! names every crate and every layer of the daemon. File lists live in
//! those tables, so ARCHITECTURE.md stays at module level.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The names a module file's doc table lists: the backticked names in the
/// first column of `//! | … | … |` rows, without `.rs` or a trailing `/`.
fn listed(module_file: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in read(module_file).lines() {
        let Some(row) = line.strip_prefix("//! |") else {
            continue;
        };
        let first = row.split('|').next().unwrap_or("");
        for part in first.split('`').skip(1).step_by(2) {
            let name = part.trim_end_matches('/').trim_end_matches(".rs");
            if !name.is_empty() && name != "mod" && name != "lib" {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// What a folder holds: its source files (stems) and sub-module folders,
/// and other files (such as an embedded page) by their whole name.
fn held(dir: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            names.insert(name);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if !["mod", "lib", "main"].contains(&stem) {
                names.insert(stem.to_owned());
            }
        } else {
            names.insert(name);
        }
    }
    names
}

fn folders(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            folders(&path, out);
        }
    }
}

#[test]
fn every_folder_lists_what_it_holds() {
    let root = root();
    let mut all = Vec::new();
    for crate_dir in ["crates/core", "crates/runtime", "crates/daemon"] {
        folders(&root.join(crate_dir).join("src"), &mut all);
    }
    folders(&root.join("host/src/cli"), &mut all);
    let mut wrong = Vec::new();
    for dir in all {
        let held = held(&dir);
        if held.is_empty() {
            continue;
        }
        let module = ["lib.rs", "mod.rs"]
            .iter()
            .map(|f| dir.join(f))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{} has no lib.rs or mod.rs", dir.display()));
        let listed = listed(&module);
        let missing: Vec<_> = held.difference(&listed).collect();
        let extra: Vec<_> = listed.difference(&held).collect();
        if !missing.is_empty() || !extra.is_empty() {
            wrong.push(format!(
                "{}: not in its table {missing:?}, in its table but not there {extra:?}",
                module.strip_prefix(&root).unwrap().display()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "module tables out of date:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn testing_md_names_every_test_file() {
    let root = root();
    let testing = read(&root.join("TESTING.md"));
    let mut files = vec![
        "crates/core/tests/supervisor/".to_owned(),
        "crates/core/tests/controller/".to_owned(),
        "crates/daemon/tests/cluster/".to_owned(),
        "tests/fuzz_protocol.rs".to_owned(),
        "host/tests/demo.rs".to_owned(),
    ];
    for entry in std::fs::read_dir(root.join("tests/e2e")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".rs") && name != "main.rs" {
            files.push(format!("tests/e2e/{name}"));
        }
    }
    for entry in std::fs::read_dir(root.join("xtask/tests")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        files.push(format!("xtask/tests/{name}"));
    }
    let missing: Vec<_> = files
        .iter()
        .filter(|f| !testing.contains(f.as_str()))
        .collect();
    assert!(missing.is_empty(), "TESTING.md does not name {missing:?}");
}

#[test]
fn architecture_md_names_every_crate_and_layer() {
    let root = root();
    let arch = read(&root.join("ARCHITECTURE.md"));
    let mut names: Vec<String> = vec![
        "crates/core".into(),
        "crates/runtime".into(),
        "crates/daemon".into(),
        "host/".into(),
        "guest-sdk/".into(),
        "xtask/".into(),
    ];
    for entry in std::fs::read_dir(root.join("crates/daemon/src")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            names.push(format!("{}/", path.file_name().unwrap().to_string_lossy()));
        }
    }
    let missing: Vec<_> = names
        .iter()
        .filter(|n| !arch.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md does not name {missing:?}"
    );
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules of the crate that `source` names as
/// `crate::<module>` (in paths and in `use crate::{…}` groups), among
/// `modules`.
fn named_modules(source: &str, modules: &[String]) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for (at, _) in source.match_indices("crate::") {
        let rest = &source[at + "crate::".len()..];
        let mut take = |path: &str| {
            let head: String = path
                .trim_start()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if modules.contains(&head) {
                named.insert(head);
            }
        };
        match rest.strip_prefix('{') {
            Some(group) => {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                group.split(',').for_each(&mut take);
            }
            None => take(rest),
        }
    }
    named
}

#[test]
fn each_daemon_layer_uses_only_those_below_it() {
    // The order is the table in the daemon's lib.rs, top to bottom.
    let src = root().join("crates/daemon/src");
    let lib = src.join("lib.rs");
    let order: Vec<String> = read(&lib)
        .lines()
        .filter_map(|l| l.strip_prefix("//! | `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect();
    let on_disk: BTreeSet<String> = held(&src).into_iter().filter(|n| n != "lib").collect();
    assert_eq!(
        order.iter().cloned().collect::<BTreeSet<_>>(),
        on_disk,
        "the daemon's lib.rs table must list each of its modules once"
    );
    let mut climbs = Vec::new();
    for (rank, module) in order.iter().enumerate() {
        let mut files = Vec::new();
        let dir = src.join(module);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        } else {
            files.push(src.join(format!("{module}.rs")));
        }
        for file in files {
            for used in named_modules(&read(&file), &order) {
                let above = order.iter().position(|m| *m == used).unwrap() < rank;
                if above {
                    let file = file.strip_prefix(&src).unwrap().display().to_string();
                    climbs.push(format!("{file} uses `{used}`, a layer above `{module}`"));
                }
            }
        }
    }
    assert!(
        climbs.is_empty(),
        "each layer of the daemon uses only those below it (lib.rs's table); these climb:\n{}",
        climbs.join("\n")
    );
}
