//! Telemetry, set up once per process: logs, traces, trace context, metrics.
//!
//! - **Logs**: `tracing` events as JSON lines on stderr when stderr is not a
//!   terminal (what log collectors read), as text on a terminal;
//!   `REVSTORE_LOG_FORMAT=json|text` overrides, `RUST_LOG` filters (default `info`).
//! - **Traces**: every `tracing` span is an OpenTelemetry span. They are
//!   exported over OTLP/HTTP only when the standard `OTEL_EXPORTER_OTLP_ENDPOINT`
//!   (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; `OTEL_SERVICE_NAME` and the
//!   other `OTEL_*` variables apply. Trace ids exist either way, so logs carry
//!   them and calls between services propagate them.
//! - **Trace context**: W3C `traceparent` is extracted from incoming requests
//!   ([`extract_context`]) and injected into outgoing ones ([`inject_context`]).
//! - **Metrics**: one Prometheus recorder per process ([`prometheus`]), which the
//!   `metrics` macros anywhere in the process report to.
//!
//! [`init`] returns a [`TelemetryGuard`]; dropping it (or calling
//! [`TelemetryGuard::shutdown`]) flushes spans not yet exported.

use std::io::IsTerminal;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot set up the OTLP exporter: {0}")]
    Exporter(String),
    #[error("telemetry was already set up in this process")]
    AlreadyInitialised,
}

/// Flushes traces when dropped.
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Exports what is buffered and stops the exporter. The OTLP exporter uses a
    /// blocking HTTP client, which must not run on an async runtime's thread: the
    /// flush runs on a thread of its own.
    pub fn shutdown(mut self) {
        self.flush();
    }

    fn flush(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = std::thread::spawn(move || {
                if let Err(e) = provider.shutdown() {
                    eprintln!("telemetry: flushing traces failed: {e}");
                }
            })
            .join();
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        self.flush();
    }
}

fn otlp_configured() -> bool {
    ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].iter().any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()))
}

/// Sets up the metrics recorder, logging, tracing and trace-context propagation for `service`.
pub fn init(service: &'static str) -> Result<TelemetryGuard, TelemetryError> {
    // The metrics recorder first: what a service records while it is built
    // (its counters exported at 0 from the start) must not go to the no-op one.
    prometheus();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let service_name = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| service.to_owned());
    let resource =
        Resource::builder().with_service_name(service_name).with_attribute(KeyValue::new("service.namespace", "revstore")).build();
    let mut builder = SdkTracerProvider::builder().with_resource(resource);
    if otlp_configured() {
        // The blocking HTTP client must be built off the async runtime.
        let exporter = std::thread::spawn(|| opentelemetry_otlp::SpanExporter::builder().with_http().build())
            .join()
            .map_err(|_| TelemetryError::Exporter("the exporter thread panicked".into()))?
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        builder = builder.with_batch_exporter(exporter);
    }
    let provider = builder.build();
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer(service)).with_filter(LevelFilter::INFO);
    // Each layer filters for itself: RUST_LOG chooses what is logged, never
    // what is traced, so quieter logs do not break trace propagation.
    let log_filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = match std::env::var("REVSTORE_LOG_FORMAT").as_deref() {
        Ok("json") => true,
        Ok("text") => false,
        _ => !std::io::stderr().is_terminal(),
    };
    let registry = tracing_subscriber::registry().with(otel);
    let result = if json {
        let logs = tracing_subscriber::fmt::layer().json().with_current_span(true).with_span_list(false).with_writer(std::io::stderr);
        registry.with(logs.with_filter(log_filter())).try_init()
    } else {
        registry.with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(log_filter())).try_init()
    };
    result.map_err(|_| TelemetryError::AlreadyInitialised)?;
    Ok(TelemetryGuard { provider: Some(provider) })
}

/// The process's Prometheus recorder, installed on first use. Every `metrics`
/// macro in the process reports to it.
pub fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets(&[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
            .expect("static bucket list is valid")
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be installed (a test harness); ours still renders what reaches it.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (http::HeaderName::from_bytes(key.as_bytes()), http::HeaderValue::from_str(&value)) {
            self.0.insert(name, value);
        }
    }
}

/// The trace context a request carries (W3C `traceparent`), or an empty one.
pub fn extract_context(headers: &http::HeaderMap) -> Context {
    opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)))
}

/// Adds the current span's trace context to outgoing headers.
pub fn inject_context(headers: &mut http::HeaderMap) {
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&context, &mut HeaderInjector(headers)));
}

/// The current span's W3C `traceparent`, to keep with work that continues
/// later (an outbox row); `None` outside any sampled trace context.
pub fn current_traceparent() -> Option<String> {
    let mut headers = http::HeaderMap::new();
    inject_context(&mut headers);
    headers.get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// The trace context a kept `traceparent` names (an empty one when it is malformed).
pub fn context_from_traceparent(traceparent: &str) -> Context {
    let mut headers = http::HeaderMap::new();
    if let Ok(value) = http::HeaderValue::from_str(traceparent) {
        headers.insert("traceparent", value);
    }
    extract_context(&headers)
}

/// Makes `span` a child of the remote context (when it has one) and returns the
/// span's trace id in hex.
pub fn adopt_remote_parent(span: &tracing::Span, remote: Context) -> Option<String> {
    if remote.span().span_context().is_valid() {
        let _ = span.set_parent(remote);
    }
    let id = span.context().span().span_context().trace_id();
    (id != opentelemetry::trace::TraceId::INVALID).then(|| id.to_string())
}
