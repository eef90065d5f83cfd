//! `not-a-task`: a plain `wasi:cli/command` program. It does not export the
//! `taskhost:plugin/task-plugin` world, so the host must refuse it.

fn main() {
    println!("not-a-task: I am a command, not a task plugin");
}
