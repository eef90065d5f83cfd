//! Owns the Rust bindings generated from `wit/`, the single source of truth
//! for the plugin contract. Nothing else in the host spells WIT names.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "task-plugin",
    imports: {
        "taskhost:plugin/host.sleep": async,
        default: trappable,
    },
    exports: { default: async },
});

/// The WIT package (with version) that plugins must be built against.
pub const WIT_PACKAGE: &str = "taskhost:plugin@0.1.0";
/// The name of the host interface a plugin imports, with its version.
pub const HOST_INTERFACE: &str = "taskhost:plugin/host@0.1.0";
