//! `host inspect PLUGIN`: validates a plugin and shows what it declares.

use std::path::PathBuf;

use clap::Args;
use serde_json::json;
use taskhost::runtime::{ComponentKind, Runtime};
use taskhost::units::format_size;

use super::args::CacheArgs;
use super::exit::usage;
use super::report::{print_json, visible};

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The plugin: a WebAssembly component file (.wasm).
    #[arg(value_name = "PLUGIN")]
    plugin: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    cache: CacheArgs,
}

pub async fn inspect(args: InspectArgs) -> anyhow::Result<u8> {
    let config = args.cache.runtime_config()?;
    let runtime = Runtime::new(&config)?;
    let plugin = runtime.load_file(&args.plugin).await.map_err(usage)?;
    let info = plugin.info();
    let params: Vec<&str> = info
        .resource
        .as_ref()
        .map(|r| r.params().into_iter().collect())
        .unwrap_or_default();
    if args.json {
        let value = json!({
            "kind": match info.kind {
                ComponentKind::Plugin => "plugin",
                ComponentKind::Command => "command",
            },
            "name": info.name,
            "version": info.version,
            "description": info.description,
            "resource": info.resource.as_ref().map(|r| r.as_str()),
            "resource_params": params,
            "default_policy": info.default_policy.to_string(),
            "capacity": info.capacity,
            "capabilities": info.capabilities.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "digest": plugin.digest().to_string(),
            "size": plugin.size(),
        });
        print_json(&value);
        return Ok(0);
    }
    let resource = match &info.resource {
        Some(r) => format!(
            "{r}  (fill with {})",
            params
                .iter()
                .map(|p| format!("--param {p}=..."))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        None => "none (the task name is the slot)".to_owned(),
    };
    let capabilities = if info.capabilities.is_empty() {
        "none".to_owned()
    } else {
        info.capabilities
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let kind = match info.kind {
        ComponentKind::Plugin => "task plugin (exports describe and run of taskhost:plugin)",
        ComponentKind::Command => {
            "WASI command (exports wasi:cli/run): --arg and `-- ARGS` are its arguments, \
             --input its standard input, its standard output the task's output"
        }
    };
    let rows = [
        ("kind", kind.to_owned()),
        ("name", info.name.clone()),
        ("version", info.version.clone()),
        ("description", info.description.clone()),
        ("resource", resource),
        ("policy", info.default_policy.to_string()),
        (
            "capacity",
            match info.capacity {
                Some(n) => format!("{n} of its tasks may own one slot at once (a slot rule wins)"),
                None => "1 (one task per slot; a slot rule may say otherwise)".to_owned(),
            },
        ),
        ("capabilities", capabilities),
        ("digest", plugin.digest().to_string()),
        ("size", format_size(plugin.size() as u64)),
    ];
    // The name and description are the plugin's own words.
    for (key, value) in rows {
        println!("{key:<13}{}", visible(&value));
    }
    Ok(0)
}
