//! Owns the daemon's ceilings on what a submission may be granted, as
//! written in a flag or the file: directories (`allow_dirs`) and
//! environment variables (`allow_env`).

/// A directory under which submissions may be granted directories
/// (`host serve --allow-dir PATH[:ro]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirAllow {
    /// An absolute path on this host.
    pub path: std::path::PathBuf,
    /// Only read-only grants under it.
    pub read_only: bool,
}

impl DirAllow {
    /// Parses `PATH` or `PATH:ro`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (path, read_only) = match text.strip_suffix(":ro") {
            Some(path) => (path, true),
            None => (text, false),
        };
        let path = std::path::PathBuf::from(path);
        if !path.is_absolute() {
            return Err(format!(
                "invalid --allow-dir `{text}`: the directory must be an absolute path \
                 (PATH or PATH:ro)"
            ));
        }
        Ok(Self { path, read_only })
    }
}

impl std::fmt::Display for DirAllow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.path.display())?;
        if self.read_only {
            f.write_str(":ro")?;
        }
        Ok(())
    }
}

/// Refuses an `--allow-env` entry that is not a name or a prefix with `*`.
pub fn check_env_pattern(text: &str) -> Result<(), String> {
    let name = text.strip_suffix('*').unwrap_or(text);
    if name.contains(['=', '*', '\0']) || (name.is_empty() && text != "*") {
        return Err(format!(
            "invalid --allow-env `{text}`: use a variable's name, a prefix ending in `*` \
             (APP_*), or `*` for any"
        ));
    }
    Ok(())
}
