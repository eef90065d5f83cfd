//! `command-probe`: a plain `wasi:cli/command` program (no SDK, no WIT of
//! ours) that the host runs as a task. Its first argument says what it does:
//!
//! - `echo ARGS...`: prints `argv[0]` and then each argument on a line of
//!   standard output, then its standard input; logs `echo: N bytes of input`
//!   on standard error;
//! - `exit N`: says `exiting with N` on standard error and exits with N;
//! - `spin`: loops forever without calling the host (only a force-abort
//!   ends it);
//! - `flood MIB`: writes MIB MiB to standard output (past the output limit
//!   at 17);
//! - `cat PATH`: prints the file at PATH (a granted directory's);
//! - `env NAME`: prints the environment variable NAME.

use std::io::{Read, Write};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let verb = args.get(1).map(String::as_str).unwrap_or("echo");
    let rest = args.get(2..).unwrap_or_default();
    let mut out = std::io::stdout().lock();
    match verb {
        "echo" => {
            let mut input = Vec::new();
            std::io::stdin().read_to_end(&mut input).expect("stdin");
            eprintln!("echo: {} bytes of input", input.len());
            writeln!(out, "{}", args[0]).expect("stdout");
            for arg in rest {
                writeln!(out, "{arg}").expect("stdout");
            }
            out.write_all(&input).expect("stdout");
        }
        "exit" => {
            let code: i32 = rest.first().and_then(|c| c.parse().ok()).unwrap_or(1);
            eprintln!("exiting with {code}");
            std::process::exit(code);
        }
        "spin" => {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        "flood" => {
            let mib: usize = rest.first().and_then(|c| c.parse().ok()).unwrap_or(17);
            let chunk = vec![b'x'; 1 << 20];
            for _ in 0..mib {
                if out.write_all(&chunk).is_err() {
                    eprintln!("flood: standard output refused a write");
                    std::process::exit(2);
                }
            }
        }
        "cat" => {
            let path = rest.first().expect("cat PATH");
            match std::fs::read(path) {
                Ok(bytes) => out.write_all(&bytes).expect("stdout"),
                Err(e) => {
                    eprintln!("cat: {path}: {e}");
                    std::process::exit(1);
                }
            }
        }
        "env" => {
            let name = rest.first().expect("env NAME");
            match std::env::var(name) {
                Ok(value) => writeln!(out, "{value}").expect("stdout"),
                Err(_) => {
                    eprintln!("env: {name} is not set");
                    std::process::exit(1);
                }
            }
        }
        other => {
            eprintln!("command-probe: unknown verb `{other}`");
            std::process::exit(64);
        }
    }
}
