//! `unknown-import`: a component that exports `describe` and `run` of
//! `taskhost:plugin@0.1.2` but also imports `example:missing/thing@0.1.0`, an
//! interface no taskhost provides. Built with wit-bindgen directly (the SDK's
//! world has no room for the extra import). The host must refuse it at load
//! time, naming the import.

wit_bindgen::generate!({
    inline: r#"
        package example:missing@0.1.0;

        /// Something no host provides.
        interface thing {
            poke: func() -> u32;
        }

        world unknown-import {
            include taskhost:plugin/task-plugin@0.1.2;
            import thing;
        }
    "#,
    path: "../../wit",
    world: "example:missing/unknown-import@0.1.0",
    generate_all,
});

use taskhost::plugin::types::Policy;

struct UnknownImport;

impl Guest for UnknownImport {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "unknown-import".into(),
            version: "0.1.0".into(),
            description: "Imports example:missing/thing, which no host provides".into(),
            resource: None,
            default_policy: Policy::Queue,
            capabilities: Vec::new(),
        }
    }

    fn run(input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        // Use the import, so that it stays in the component.
        if input == b"poke" {
            let n = example::missing::thing::poke();
            return Ok(n.to_string().into_bytes());
        }
        Ok(input)
    }
}

export!(UnknownImport);
