//! `not-a-task`: a component of another world. It exports
//! `example:other/greeter@0.1.0`, neither `describe` and `run` of our
//! package nor `wasi:cli/run`, so the host must refuse it at load, saying
//! what a task plugin and a WASI command export.

wit_bindgen::generate!({
    inline: r#"
        package example:other@0.1.0;

        /// Something no task host calls.
        interface greeter {
            greet: func(name: string) -> string;
        }

        world not-a-task {
            export greeter;
        }
    "#,
    world: "example:other/not-a-task@0.1.0",
});

struct NotATask;

impl exports::example::other::greeter::Guest for NotATask {
    fn greet(name: String) -> String {
        format!("hello, {name}")
    }
}

export!(NotATask);
