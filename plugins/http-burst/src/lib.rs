//! `http-burst`: starts `count` (default 4) GET requests to `url` (plain
//! `http://HOST:PORT/PATH`) at once, before waiting for any, then waits for
//! each in turn. With `header=N`, each request carries an `x-pad` header of
//! N bytes (to test the host's cap on header bytes). It declares `network`.
//!
//! Output, when all of them answered: one line per request, `N: HTTP
//! STATUS`. When any failed, it fails with the same lines, a failed one as
//! `N: error CODE` (the WASI error code, such as
//! `connection-limit-reached`), joined by `; `.

use taskhost_guest::{Capability, Context, PluginInfo, Task, TaskError};
use wasip2::http::outgoing_handler;
use wasip2::http::types::{ErrorCode, Fields, OutgoingRequest, Scheme};

struct HttpBurst;

impl Task for HttpBurst {
    fn describe() -> PluginInfo {
        PluginInfo::new("http-burst", "0.1.0")
            .description("Starts --param count=N requests to --param url=URL at once")
            .capability(Capability::Network)
    }

    fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let url = ctx.param_required("url")?;
        let count: usize = ctx.param_parse_or("count", 4)?;
        let pad: usize = ctx.param_parse_or("header", 0)?;
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| taskhost_guest::fatal("url must start with http://"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let mut started = Vec::new();
        for _ in 0..count {
            let headers = if pad == 0 {
                Fields::new()
            } else {
                Fields::from_list(&[("x-pad".to_owned(), vec![b'a'; pad])])
                    .map_err(|e| taskhost_guest::fail(format!("header refused: {e:?}")))?
            };
            let request = OutgoingRequest::new(headers);
            let set = request
                .set_scheme(Some(&Scheme::Http))
                .and_then(|()| request.set_authority(Some(authority)))
                .and_then(|()| request.set_path_with_query(Some(path)));
            if set.is_err() {
                return Err(taskhost_guest::fatal(format!(
                    "the host refused the URL {url}"
                )));
            }
            started.push(outgoing_handler::handle(request, None));
        }
        let mut lines = Vec::new();
        let mut failed = false;
        // Every response is kept until the end, so none is dropped early.
        let mut kept = Vec::new();
        for (n, started) in started.into_iter().enumerate() {
            let n = n + 1;
            let answer = started.and_then(|future| {
                let got = loop {
                    match future.get() {
                        Some(got) => break got,
                        None => future.subscribe().block(),
                    }
                };
                match got {
                    Ok(answer) => answer,
                    Err(()) => Err(ErrorCode::InternalError(Some("taken twice".into()))),
                }
            });
            match answer {
                Ok(response) => {
                    lines.push(format!("{n}: HTTP {}", response.status()));
                    kept.push(response);
                }
                Err(code) => {
                    failed = true;
                    lines.push(format!("{n}: error {}", code_name(&code)));
                }
            }
        }
        if failed {
            return Err(taskhost_guest::fail(lines.join("; ")));
        }
        Ok(lines.join("\n").into_bytes())
    }
}

/// The WASI name of an error code (the ones a test looks for), else its
/// debug form.
fn code_name(code: &ErrorCode) -> String {
    match code {
        ErrorCode::ConnectionLimitReached => "connection-limit-reached".to_owned(),
        ErrorCode::HttpRequestDenied => "HTTP-request-denied".to_owned(),
        ErrorCode::ConnectionRefused => "connection-refused".to_owned(),
        other => format!("{other:?}"),
    }
}

taskhost_guest::export_task!(HttpBurst);
