//! `http-get`: fetches a URL through the host's outbound HTTP and reports
//! what came back. It declares `network`, so it needs `--allow-http`.
//!
//! Params: `url` (else the input, as text), `method` (default `GET`; a
//! `POST` or `PUT` sends the input as its body), `max_redirects` (default 5),
//! `timeout_ms` (the first-byte timeout it asks for; default the host's).
//! It logs `requesting METHOD URL` before the request, so a test can wait for
//! it. Output: `HTTP <status>` and the body on the next line; a non-2xx status
//! is a retryable failure (`HTTP <status> from <url>`), a denied host a fatal
//! one, cancellation (also in the middle of a request) `canceled`.

use std::time::Duration;

use taskhost_guest::http::{Method, Request};
use taskhost_guest::{Capability, Context, PluginInfo, Task, TaskError};

struct HttpGet;

impl Task for HttpGet {
    fn describe() -> PluginInfo {
        PluginInfo::new("http-get", "1.0.0")
            .description("Fetches --param url=URL (or the input) and reports the status and body")
            .capability(Capability::Network)
    }

    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
        let url = match ctx.param("url") {
            Some(url) => url.to_owned(),
            None => String::from_utf8_lossy(&input).trim().to_owned(),
        };
        if url.is_empty() {
            return Err(taskhost_guest::fatal(
                "no URL: pass --param url=https://HOST/PATH or the URL as input",
            ));
        }
        let method = match ctx.param_or("method", "GET").to_ascii_uppercase().as_str() {
            "GET" => Method::Get,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "HEAD" => Method::Head,
            other => Method::Other(other.to_owned()),
        };
        let mut request = Request::new(method.clone(), url.clone())
            .max_redirects(ctx.param_parse_or("max_redirects", 5)?);
        if matches!(method, Method::Post | Method::Put) {
            request = request.body(input);
        }
        if let Some(ms) = ctx.param_parse::<u64>("timeout_ms")? {
            request = request.first_byte_timeout(Duration::from_millis(ms));
        }
        taskhost_guest::info!(ctx, "requesting {method} {url}");
        let response = request.send()?;
        taskhost_guest::info!(ctx, "{url}: HTTP {}", response.status());
        if !response.is_success() {
            return Err(taskhost_guest::fail(format!(
                "HTTP {} from {}",
                response.status(),
                response.url()
            )));
        }
        let mut out = format!("HTTP {}\n", response.status()).into_bytes();
        out.extend_from_slice(response.body());
        Ok(out)
    }
}

taskhost_guest::export_task!(HttpGet);
