//! The process's `tracing` subscriber: log lines on stderr and, when asked
//! for, the task and attempt spans exported as OpenTelemetry traces over
//! OTLP/HTTP (protobuf).
//!
//! Asked for means `--otlp URL` (`host serve`, `host run`, or `otlp` in the
//! daemon's TOML), or the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_ENDPOINT` variables. Without any of them no exporter,
//! no thread and no extra layer exist: the subscriber is the plain log
//! formatter it always was, and the supervisor's debug spans stay disabled.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// How long the exporter waits for a collector per batch, and how long the
/// process waits at exit for the spans still buffered.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where spans go: the URL they are posted to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpTarget {
    /// The full URL of the traces endpoint (`…/v1/traces`).
    pub url: String,
    /// Whether the URL came from `--otlp` (set on the exporter) or from the
    /// environment (left to the exporter, which reads the same variables).
    from_flag: bool,
}

/// Decides whether traces are exported and where: the flag (or TOML key)
/// first, then the standard variables. An error names the setting and the fix.
pub fn otlp_target(flag: Option<&str>) -> Result<Option<OtlpTarget>, String> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let target = if let Some(flag) = flag.filter(|f| !f.trim().is_empty()) {
        OtlpTarget {
            url: traces_url(flag.trim()),
            from_flag: true,
        }
    } else {
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
        {
            return Ok(None);
        }
        let url = if let Some(url) = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            url
        } else if let Some(base) = env("OTEL_EXPORTER_OTLP_ENDPOINT") {
            traces_url(&base)
        } else {
            return Ok(None);
        };
        OtlpTarget {
            url,
            from_flag: false,
        }
    };
    if let Some(exporter) = env("OTEL_TRACES_EXPORTER")
        && !exporter.eq_ignore_ascii_case("otlp")
        && !exporter.eq_ignore_ascii_case("none")
    {
        return Err(format!(
            "OTEL_TRACES_EXPORTER={exporter}: only `otlp` (or `none`) is supported"
        ));
    }
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(protocol) = env(var)
            && protocol != "http/protobuf"
        {
            return Err(format!(
                "{var}={protocol}: this host exports traces over OTLP/HTTP with protobuf only; \
                 set it to http/protobuf (or unset it) and point the endpoint at the collector's \
                 HTTP port (4318 by default)"
            ));
        }
    }
    let scheme_ok = target
        .url
        .split_once("://")
        .is_some_and(|(scheme, rest)| scheme == "http" && !rest.is_empty());
    if !scheme_ok {
        let setting = if target.from_flag {
            "--otlp"
        } else {
            "the OTLP endpoint variable"
        };
        return Err(format!(
            "{setting}: `{}` is not an http:// URL; traces go to a collector over plain \
             OTLP/HTTP, such as http://127.0.0.1:4318 (https is not built in: run a collector \
             or agent next to the host and let it forward over TLS)",
            target.url
        ));
    }
    Ok(Some(target))
}

/// `BASE/v1/traces`, as the OTLP specification builds the traces URL from
/// `OTEL_EXPORTER_OTLP_ENDPOINT`; a URL already ending in `/v1/traces` is kept.
fn traces_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}

/// What must outlive the program's work: the tracer provider, which owns
/// the batch exporter's thread.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported (`--otlp` or the `OTEL_*` variables).
    pub fn exports(&self) -> bool {
        self.provider.is_some()
    }

    /// Sends the spans still buffered (waiting at most [`EXPORT_TIMEOUT`]).
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown_with_timeout(EXPORT_TIMEOUT)
        {
            eprintln!("warning: the last trace spans could not be exported: {e}");
        }
    }
}

/// Installs the process's subscriber. `default_level` is the log filter
/// unless `RUST_LOG` says otherwise; `json` writes JSON lines. With an OTLP
/// target, a second layer sees the crate's spans (at every level) and the
/// events at info and above inside them, whatever `RUST_LOG` says.
pub fn init(
    default_level: &str,
    json: bool,
    otlp: Option<&OtlpTarget>,
) -> Result<Telemetry, String> {
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level))
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let Some(target) = otlp else {
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter())
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .with_target(false);
        if json {
            builder.json().init();
        } else {
            builder.init();
        }
        return Ok(Telemetry { provider: None });
    };

    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_timeout(EXPORT_TIMEOUT);
    if target.from_flag {
        builder = builder.with_endpoint(target.url.clone());
    }
    let exporter = builder
        .build()
        .map_err(|e| format!("cannot set up the OTLP exporter for {}: {e}", target.url))?;
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("taskhost");
    }
    let resource = resource
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(Reporting::new(exporter, target.url.clone()))
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("taskhost");
    let spans = tracing_subscriber::filter::filter_fn(|meta| {
        meta.target().starts_with("taskhost")
            && (meta.is_span() || *meta.level() <= tracing::Level::INFO)
    });
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_threads(false)
        .with_filter(spans);
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false);
    let fmt = if json {
        fmt.json().with_filter(filter()).boxed()
    } else {
        fmt.with_filter(filter()).boxed()
    };
    tracing_subscriber::registry().with(fmt).with(otel).init();
    tracing::info!(endpoint = %target.url, "exporting task and attempt spans over OTLP");
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// The OTLP exporter, saying on the log when exports start failing and when
/// they work again (once each, not per batch): a collector that is down
/// costs spans, and the operator should know.
#[derive(Debug)]
struct Reporting {
    inner: opentelemetry_otlp::SpanExporter,
    url: String,
    failing: std::sync::atomic::AtomicBool,
}

impl Reporting {
    fn new(inner: opentelemetry_otlp::SpanExporter, url: String) -> Self {
        Self {
            inner,
            url,
            failing: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl SpanExporter for Reporting {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        use std::sync::atomic::Ordering;
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        match &result {
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(endpoint = %self.url, "OTLP export works again");
                }
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        endpoint = %self.url,
                        "OTLP export failed, {spans} spans dropped (said once until it works again): {e}"
                    );
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_url_follows_the_specification() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/v1/traces"),
            "http://collector:4318/v1/traces"
        );
    }

    #[test]
    fn a_flag_other_than_http_is_refused_with_the_fix() {
        let err = otlp_target(Some("https://collector:4318")).unwrap_err();
        assert!(
            err.contains("--otlp") && err.contains("http://127.0.0.1:4318"),
            "{err}"
        );
        let err = otlp_target(Some("collector:4318")).unwrap_err();
        assert!(err.contains("not an http:// URL"), "{err}");
        let ok = otlp_target(Some("http://127.0.0.1:4318")).unwrap().unwrap();
        assert_eq!(ok.url, "http://127.0.0.1:4318/v1/traces");
    }
}
