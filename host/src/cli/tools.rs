//! The verbs around the host rather than tasks: `version`, `completions`,
//! `man` and `new` (a plugin crate scaffold).

use std::path::{Path, PathBuf};

use clap::{Args, CommandFactory};
use serde_json::json;
use taskhost::daemon::protocol::PROTOCOL_VERSION;
use taskhost::daemon::{Client, ClientError, socket};

use super::Cli;
use super::args::SocketArg;
use super::exit::usage;

/// This build's version.
const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Print JSON: {"client": ..., "protocol": ..., "daemon": ... or null}.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub socket: SocketArg,
}

/// `host version`: this binary's version, and the daemon's if one answers
/// (without waiting for one to start).
pub async fn version(args: VersionArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    let remote = super::client::remote();
    let path = match remote {
        Some(remote) => PathBuf::from(&remote.url),
        None => socket::resolve(args.socket.socket.as_deref().or(before_verb.as_deref())),
    };
    let connected = match remote {
        Some(remote) => Client::connect_remote(remote).await,
        None => Client::connect(&path).await,
    };
    let daemon = match connected {
        Ok(client) => Ok(client.daemon_version().to_owned()),
        Err(err) => Err(err),
    };
    if args.json {
        let (version, protocol, error) = match &daemon {
            Ok(v) => (Some(v.clone()), Some(PROTOCOL_VERSION), None),
            Err(ClientError::VersionMismatch {
                daemon_protocol,
                daemon_version,
                ..
            }) => (Some(daemon_version.clone()), Some(*daemon_protocol), None),
            Err(err) => (None, None, Some(err.to_string())),
        };
        let daemon = version.map(|v| json!({ "version": v, "protocol": protocol, "socket": path }));
        println!(
            "{}",
            json!({ "client": VERSION, "protocol": PROTOCOL_VERSION, "daemon": daemon, "daemon_error": error })
        );
        return Ok(0);
    }
    println!("host {VERSION} (protocol {PROTOCOL_VERSION})");
    match daemon {
        Ok(v) => println!(
            "daemon {v} (protocol {PROTOCOL_VERSION}) at {}",
            path.display()
        ),
        Err(ClientError::VersionMismatch {
            daemon_protocol,
            daemon_version,
            ..
        }) => println!(
            "daemon {daemon_version} (protocol {daemon_protocol}, does not match) at {}",
            path.display()
        ),
        Err(err) => println!("daemon: none ({err})"),
    }
    Ok(0)
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// The whole command tree for the generators. The verbs' arguments are
/// built only when a verb is parsed (`defer`), so that a run does not build
/// every verb's. A generator needs them all, and the root's `help` verb
/// copies the verbs as they stand when the root is built: so the verbs are
/// built first, in a tree of their own, and put in place of the unbuilt
/// ones.
fn whole_command() -> clap::Command {
    let mut built = Cli::command();
    built.build();
    let mut cli = Cli::command();
    for verb in built.get_subcommands().filter(|v| v.get_name() != "help") {
        cli = cli.mut_subcommand(verb.get_name(), |_| verb.clone());
    }
    cli
}

/// `host completions SHELL`: the completion script on stdout.
pub fn completions(args: CompletionsArgs) -> anyhow::Result<u8> {
    clap_complete::generate(
        args.shell,
        &mut whole_command(),
        "host",
        &mut std::io::stdout(),
    );
    Ok(0)
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write one page per verb (host.1, host-run.1, ...) into this directory
    /// instead of printing host.1 on stdout.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
}

/// `host man`: man pages generated from the same definitions as `--help`.
pub fn man(args: ManArgs) -> anyhow::Result<u8> {
    match args.out_dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .map_err(|e| usage(format!("cannot create `{}`: {e}", dir.display())))?;
            clap_mangen::generate_to(whole_command(), &dir).map_err(|e| {
                usage(format!(
                    "cannot write man pages to `{}`: {e}",
                    dir.display()
                ))
            })?;
            eprintln!("man pages written to {}", dir.display());
        }
        None => clap_mangen::Man::new(whole_command()).render(&mut std::io::stdout())?,
    }
    Ok(0)
}

#[derive(Debug, Args)]
pub struct NewArgs {
    /// The plugin's name (also its crate name): lowercase letters, digits,
    /// `-` and `_`, starting with a letter.
    name: String,
    /// Where to create it [default: ./NAME].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// The guest SDK (`guest-sdk/` of a taskhost checkout) [default: the one
    /// this host was built from].
    #[arg(long, value_name = "DIR")]
    sdk: Option<PathBuf>,
}

/// The SDK next to the sources this binary was built from.
const BUILT_FROM_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../guest-sdk");

/// `host new NAME`: a plugin crate that builds and runs as it is.
pub fn new(args: NewArgs) -> anyhow::Result<u8> {
    let name = args.name;
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        return Err(usage(format!(
            "`{name}` is not a plugin name: use lowercase letters, digits, `-` and `_`, starting with a letter (for example `my-plugin`)"
        )));
    }
    let dir = args.dir.unwrap_or_else(|| PathBuf::from(&name));
    if std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some()) {
        return Err(usage(format!(
            "`{}` already exists and is not empty; pick another name or --dir",
            dir.display()
        )));
    }
    let sdk = match args.sdk {
        Some(sdk) => sdk,
        None => PathBuf::from(BUILT_FROM_SDK),
    };
    let sdk = std::fs::canonicalize(&sdk)
        .ok()
        .filter(|s| s.join("Cargo.toml").is_file())
        .ok_or_else(|| {
            usage(format!(
                "the guest SDK is not at `{}`; pass --sdk with the path of guest-sdk/ in a taskhost checkout",
                sdk.display()
            ))
        })?;
    write_scaffold(&dir, &name, &sdk)?;
    let wasm = dir
        .join("target/wasm32-wasip2/release")
        .join(format!("{}.wasm", name.replace('-', "_")));
    eprintln!("created plugin `{name}` in {}", dir.display());
    eprintln!("next:");
    eprintln!("  (cd {} && cargo build --release)", dir.display());
    eprintln!("  host run {} --input world", wasm.display());
    Ok(0)
}

fn write_scaffold(dir: &Path, name: &str, sdk: &Path) -> anyhow::Result<()> {
    let sdk = sdk.display().to_string();
    let files: [(&str, String); 6] = [
        (
            "Cargo.toml",
            format!(
                r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
taskhost-guest = {{ path = {sdk:?} }}

# Its own workspace, even when created inside another one.
[workspace]

[profile.release]
# Small components; the `name` section stays, so traps still show function
# names.
opt-level = "s"
debug = false
strip = "debuginfo"
"#
            ),
        ),
        (
            ".cargo/config.toml",
            "# Plugins are WebAssembly components: `cargo build` builds for WASI 0.2.\n\
             [build]\ntarget = \"wasm32-wasip2\"\n"
                .to_owned(),
        ),
        (
            "rust-toolchain.toml",
            "# The toolchain and target the plugin is built with (rustup installs them).\n\
             [toolchain]\nchannel = \"1.95.0\"\ntargets = [\"wasm32-wasip2\"]\nprofile = \"minimal\"\n"
                .to_owned(),
        ),
        (
            "src/lib.rs",
            format!(
                r#"//! `{name}`: a taskhost plugin. Build it with `cargo build --release`
//! and run it with
//! `host run target/wasm32-wasip2/release/{file}.wasm --input world`.

use taskhost_guest::{{Context, PluginInfo, Task, TaskError}};

struct Plugin;

impl Task for Plugin {{
    fn describe() -> PluginInfo {{
        PluginInfo::new("{name}", "0.1.0").description("Greets its input")
    }}

    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, TaskError> {{
        let who = String::from_utf8_lossy(&input);
        taskhost_guest::info!(ctx, "greeting {{who}}");
        Ok(format!("hello, {{who}}!").into_bytes())
    }}
}}

taskhost_guest::export_task!(Plugin);
"#,
                file = name.replace('-', "_")
            ),
        ),
        (".gitignore", "/target\n".to_owned()),
        // The versions the repository's own plugins are built with.
        (
            "Cargo.lock",
            include_str!("../../../plugins/Cargo.lock").to_owned(),
        ),
    ];
    for (file, contents) in files {
        let path = dir.join(file);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| usage(format!("cannot create `{}`: {e}", parent.display())))?;
        }
        std::fs::write(&path, contents)
            .map_err(|e| usage(format!("cannot write `{}`: {e}", path.display())))?;
    }
    Ok(())
}
