//! Owns the Rust bindings generated from `wit/`, the single source of truth
//! for the plugin contract. Nothing else in the host spells WIT names.

#![forbid(unsafe_code)]

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "task-plugin",
    imports: {
        "taskhost:plugin/host.sleep": async | trappable,
        "taskhost:plugin/children.spawn": async | trappable,
        "taskhost:plugin/children.wait": async | trappable,
        default: trappable,
    },
    exports: { default: async },
});

/// `wasi:keyvalue` (0.2.0-draft), with buckets as [`KvBucket`](crate::kv::KvBucket).
pub mod keyvalue {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "wasi:keyvalue/imports@0.2.0-draft",
        imports: { default: async | trappable },
        with: { "wasi:keyvalue/store.bucket": crate::kv::KvBucket },
    });
}

/// The version of the WIT package this host implements.
pub const WIT_VERSION: &str = "0.1.2";
/// The WIT package (with version) that plugins are built against (an
/// earlier 0.1 is served too).
pub const WIT_PACKAGE: &str = "taskhost:plugin@0.1.2";
