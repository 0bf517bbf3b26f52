//! The HTTP client revstore services call each other with.
//!
//! Every call carries the caller's W3C trace context (`traceparent`), so one
//! request can be followed across services, and has a timeout. Idempotent calls
//! (GET, HEAD, PUT, DELETE, OPTIONS) are retried with exponential backoff and
//! jitter when the connection fails, times out, or the server answers 502, 503
//! or 504 — no sooner than a 503's `Retry-After` asks (to a cap); a POST is
//! never retried. Error answers in `application/problem+json`
//! come back as [`ClientError::Status`] with the problem parsed.
//!
//! Typed clients of each service are thin layers over [`HttpClient`], and list
//! the routes they call (`ROUTES`) so tests can check them against the
//! service's OpenAPI document ([`undocumented_routes`]).

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use http::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

mod peers;
pub mod tokens;
pub use peers::{Archived, GraphClient, JanitorClient, OldStoreClient};

/// A problem document (RFC 9457) as revstore services send it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    pub request_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The service answered with an error status.
    #[error("{method} {url}: {status}{}", problem.as_ref().map(|p| format!(": {}", p.detail)).unwrap_or_default())]
    Status { method: Method, url: String, status: StatusCode, problem: Option<Box<Problem>>, retry_after: Option<Duration> },
    /// No answer: connection refused or reset, DNS, or the timeout.
    #[error("{method} {url}: {reason}")]
    Transport { method: Method, url: String, reason: String },
    /// An answer that is not what the call expects.
    #[error("{method} {url}: unreadable answer: {reason}")]
    Decode { method: Method, url: String, reason: String },
    /// A path that an HTTP client would rewrite (a `.` or `..` segment, also
    /// percent-encoded): sending it would reach another resource than meant.
    #[error("{method} {path}: refused to send a path with a dot segment")]
    DotSegment { method: Method, path: String },
    #[error("invalid client setting: {0}")]
    Config(String),
}

impl ClientError {
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the answer was a problem of this kind (`urn:revstore:problem:<kind>`):
    /// how a caller tells a refusal it acts on from any other error of the same status.
    pub fn is_problem(&self, kind: &str) -> bool {
        match self {
            ClientError::Status { problem: Some(problem), .. } => {
                problem.kind.strip_prefix("urn:revstore:problem:").is_some_and(|k| k == kind)
            }
            _ => false,
        }
    }

    /// How long the server asked to be left alone (`Retry-After` in seconds
    /// on a 503 or 429), as it said it.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ClientError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Worth trying again later (the other side was unreachable or overloaded).
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Transport { .. } => true,
            ClientError::Status { status, .. } => {
                matches!(*status, StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT)
            }
            _ => false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Per attempt.
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Retries after the first attempt (idempotent calls only).
    pub retries: usize,
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// Sent as `Authorization: Bearer …`.
    pub token: Option<String>,
    /// The largest successful answer read; a larger one is an error, never
    /// held whole. (An error answer is read to [`MAX_ERROR_ANSWER_BYTES`].)
    pub max_answer_bytes: usize,
    /// The longest `Retry-After` honoured before a retry: a server that asks
    /// for longer is waited on this long (the retry's own backoff, if longer,
    /// wins), so no answer can park a caller for hours.
    pub max_retry_after: Duration,
}

/// The most of an error answer read: a problem document is small, and what a
/// caller repeats of it (logs, the janitor's summary) stays small too.
pub const MAX_ERROR_ANSWER_BYTES: usize = 64 * 1024;

/// The most of a problem's detail kept.
const MAX_DETAIL_CHARS: usize = 1000;

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            retries: 3,
            min_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            token: None,
            max_answer_bytes: 256 * 1024 * 1024,
            max_retry_after: Duration::from_secs(30),
        }
    }
}

/// A client of one service, by base URL.
#[derive(Clone)]
pub struct HttpClient {
    http: reqwest::Client,
    base: String,
    options: ClientOptions,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("base", &self.base)
            .field("retries", &self.options.retries)
            .field("token", &self.options.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

fn is_idempotent(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS)
}

/// A response whose status was a success.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

impl HttpClient {
    pub fn new(base_url: &str, options: ClientOptions) -> Result<Self, ClientError> {
        let base = base_url.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ClientError::Config(format!("base URL {base_url:?} must start with http:// or https://")));
        }
        let http = reqwest::Client::builder()
            .timeout(options.timeout)
            .connect_timeout(options.connect_timeout)
            .build()
            .map_err(|e| ClientError::Config(e.to_string()))?;
        Ok(HttpClient { http, base, options })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Sends one call (retrying it when idempotent) and returns the answer of a
    /// success status, or the error.
    pub async fn send(&self, method: Method, path: &str, headers: http::HeaderMap, body: Option<Vec<u8>>) -> Result<Answer, ClientError> {
        if has_dot_segment(path) {
            return Err(ClientError::DotSegment { method, path: path.to_owned() });
        }
        let url = format!("{}{}", self.base, path);
        let attempt = || self.attempt(method.clone(), &url, headers.clone(), body.clone());
        if !is_idempotent(&method) || self.options.retries == 0 {
            return attempt().await;
        }
        let backoff = ExponentialBuilder::default()
            .with_min_delay(self.options.min_backoff)
            .with_max_delay(self.options.max_backoff)
            .with_max_times(self.options.retries)
            .with_jitter();
        let cap = self.options.max_retry_after;
        attempt
            .retry(backoff)
            .when(ClientError::is_transient)
            // A shedding server says when to come back: no sooner than that
            // (to its cap), else the jittered backoff. `None` is the backoff
            // exhausted, and stays so.
            .adjust(move |e, backoff| backoff.map(|b| e.retry_after().map_or(b, |asked| asked.min(cap).max(b))))
            .notify(|e, wait| tracing::debug!(error = %e, retry_in_ms = wait.as_millis() as u64, "retrying call"))
            .await
    }

    async fn attempt(&self, method: Method, url: &str, mut headers: http::HeaderMap, body: Option<Vec<u8>>) -> Result<Answer, ClientError> {
        revstore_telemetry::inject_context(&mut headers);
        let mut request = self.http.request(method.clone(), url).headers(headers);
        if let Some(token) = &self.options.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        let transport = |e: reqwest::Error| ClientError::Transport {
            method: method.clone(),
            url: url.to_owned(),
            reason: if e.is_timeout() { "timed out".to_owned() } else { e.to_string() },
        };
        let mut response = request.send().await.map_err(transport)?;
        let status = response.status();
        let headers = response.headers().clone();
        let succeeded = status.is_success() || status == StatusCode::NOT_MODIFIED;
        let cap = if succeeded { self.options.max_answer_bytes } else { MAX_ERROR_ANSWER_BYTES };
        // Read chunk by chunk to the cap: an answer's size is the server's to
        // choose, the memory it takes here is not.
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            if body.len() + chunk.len() > cap {
                if succeeded {
                    return Err(ClientError::Decode {
                        method,
                        url: url.to_owned(),
                        reason: format!("the answer is larger than the {cap} bytes this client reads"),
                    });
                }
                body.extend_from_slice(&chunk[..cap - body.len()]);
                break;
            }
            body.extend_from_slice(&chunk);
        }
        if succeeded {
            return Ok(Answer { status, headers, body });
        }
        let problem = serde_json::from_slice::<Problem>(&body).ok().map(|mut p| {
            if let Some((end, _)) = p.detail.char_indices().nth(MAX_DETAIL_CHARS) {
                p.detail = format!("{}… ({} bytes)", &p.detail[..end], p.detail.len());
            }
            Box::new(p)
        });
        let retry_after = headers
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        Err(ClientError::Status { method, url: url.to_owned(), status, problem, retry_after })
    }

    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let answer = self.send(Method::GET, path, http::HeaderMap::new(), None).await?;
        answer.json().map_err(|e| ClientError::Decode { method: Method::GET, url: format!("{}{path}", self.base), reason: e.to_string() })
    }

    pub async fn put_json<B: Serialize>(&self, path: &str, body: &B) -> Result<Answer, ClientError> {
        self.send_json(Method::PUT, path, body).await
    }

    pub async fn post_json<B: Serialize>(&self, path: &str, body: &B) -> Result<Answer, ClientError> {
        self.send_json(Method::POST, path, body).await
    }

    async fn send_json<B: Serialize>(&self, method: Method, path: &str, body: &B) -> Result<Answer, ClientError> {
        let bytes = serde_json::to_vec(body).map_err(|e| ClientError::Config(format!("cannot encode the body: {e}")))?;
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
        self.send(method, path, headers, Some(bytes)).await
    }
}

pub use revstore_api::paths::path_segment;

/// Whether `path` has a segment that URL parsing resolves away: `.` or `..`,
/// in any mix of literal and percent-encoded dots (WHATWG URL treats `%2e` as
/// a dot). No encoding of such a segment survives, so the call is refused.
pub fn has_dot_segment(path: &str) -> bool {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    path.split('/').any(|segment| {
        let lower = segment.to_ascii_lowercase();
        matches!(lower.as_str(), "." | "%2e" | ".." | ".%2e" | "%2e." | "%2e%2e")
    })
}

/// The routes of `routes` (method, OpenAPI path template) that the OpenAPI
/// document `openapi` (as JSON) does not describe.
pub fn undocumented_routes(openapi: &serde_json::Value, routes: &[(Method, &str)]) -> Vec<String> {
    routes
        .iter()
        .filter(|(method, path)| {
            openapi
                .pointer(&format!("/paths/{}/{}", path.replace('~', "~0").replace('/', "~1"), method.as_str().to_ascii_lowercase()))
                .is_none()
        })
        .map(|(method, path)| format!("{method} {path}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_are_refused_before_sending() {
        // What the refusal guards against: the URL parser resolves these away.
        for path in ["/a/./b", "/a/%2E/b", "/a/../b", "/a/%2e%2E/b", "/a/.%2e/b"] {
            let url = reqwest::Url::parse(&format!("http://h{path}")).unwrap();
            assert!(url.path() == "/a/b" || url.path() == "/b", "{path} became {}", url.path());
            assert!(has_dot_segment(path), "{path}");
        }
        for path in ["/a/.../b", "/a/.b/c", "/a/b.", "/a/%2E%2E%2E", "/a/b?x=/../", "/en.wikipedia.org/v1/x"] {
            assert!(!has_dot_segment(path), "{path}");
        }
        assert!(has_dot_segment(&format!("/d/v1/archive/{}/1", path_segment(".."))));
    }

    #[tokio::test]
    async fn a_dot_segment_is_refused_as_permanent() {
        let client = HttpClient::new("http://127.0.0.1:9", ClientOptions::default()).unwrap();
        let err = client.send(Method::PUT, "/d/v1/archive/../1", http::HeaderMap::new(), None).await.unwrap_err();
        assert!(matches!(err, ClientError::DotSegment { .. }), "{err}");
        assert!(!err.is_transient());
    }

    /// One raw HTTP answer per connection, then the connection closed.
    async fn serve_once(status: &'static str, content_type: &'static str, body: Vec<u8>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = socket.read(&mut request).await;
            let head =
                format!("HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(&body).await;
        });
        format!("http://{address}")
    }

    /// A server shedding load answers 503 with `Retry-After`: the retry waits
    /// that long, not the 50 ms backoff, and then succeeds.
    #[tokio::test]
    async fn a_retry_waits_as_long_as_retry_after_asks() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let answered = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = answered.clone();
        tokio::spawn(async move {
            for answer in ["503 Service Unavailable\r\nretry-after: 1", "200 OK"] {
                let (mut socket, _) = listener.accept().await.unwrap();
                let _ = socket.read(&mut [0u8; 4096]).await;
                seen.lock().unwrap().push(std::time::Instant::now());
                let head = format!("HTTP/1.1 {answer}\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
                let _ = socket.write_all(head.as_bytes()).await;
            }
        });
        let client = HttpClient::new(&base, ClientOptions::default()).unwrap();
        let answer = client.send(Method::GET, "/x", http::HeaderMap::new(), None).await.expect("the retry succeeds");
        assert_eq!(answer.status, StatusCode::OK);
        let at = answered.lock().unwrap().clone();
        assert_eq!(at.len(), 2);
        assert!(at[1] - at[0] >= Duration::from_millis(950), "retried after {:?}", at[1] - at[0]);
        // A request for more than the cap waits the cap.
        let capped = ClientError::Status {
            method: Method::GET,
            url: base,
            status: StatusCode::SERVICE_UNAVAILABLE,
            problem: None,
            retry_after: Some(Duration::from_secs(86_400)),
        };
        assert_eq!(capped.retry_after(), Some(Duration::from_secs(86_400)));
        assert!(capped.is_transient());
    }

    /// The probe's janitor: a 300 MB answer it could not read was copied
    /// whole into its summary and log. Answers are read to a cap now, and what
    /// an error repeats of them is short.
    #[tokio::test]
    async fn what_an_answer_can_make_a_caller_hold_or_repeat_is_bounded() {
        let options = ClientOptions { retries: 0, max_answer_bytes: 1024 * 1024, ..ClientOptions::default() };
        let detail = "d".repeat(8 * 1024 * 1024);
        let problem = serde_json::json!({"type": "about:blank", "title": "x", "status": 500, "detail": detail, "request_id": null});
        let base = serve_once("500 Internal Server Error", "application/problem+json", serde_json::to_vec(&problem).unwrap()).await;
        let err = HttpClient::new(&base, options.clone()).unwrap().send(Method::GET, "/x", http::HeaderMap::new(), None).await.unwrap_err();
        assert!(err.to_string().len() < 2 * MAX_DETAIL_CHARS, "{} bytes of error", err.to_string().len());
        // A small problem comes through whole.
        let small = serde_json::json!({"type": "about:blank", "title": "x", "status": 409, "detail": "held by run 7", "request_id": null});
        let base = serve_once("409 Conflict", "application/problem+json", serde_json::to_vec(&small).unwrap()).await;
        let err = HttpClient::new(&base, options.clone()).unwrap().send(Method::GET, "/x", http::HeaderMap::new(), None).await.unwrap_err();
        assert!(err.to_string().ends_with(": held by run 7"), "{err}");
        // A success over the cap is an error, not 8 MB held.
        let base = serve_once("200 OK", "application/json", vec![b' '; 8 * 1024 * 1024]).await;
        let err = HttpClient::new(&base, options).unwrap().send(Method::GET, "/x", http::HeaderMap::new(), None).await.unwrap_err();
        assert!(matches!(err, ClientError::Decode { .. }) && err.to_string().contains("larger than the 1048576 bytes"), "{err}");
    }

    #[test]
    fn only_idempotent_methods_are_retried() {
        assert!(is_idempotent(&Method::PUT) && is_idempotent(&Method::GET) && is_idempotent(&Method::DELETE));
        assert!(!is_idempotent(&Method::POST) && !is_idempotent(&Method::PATCH));
    }

    #[test]
    fn undocumented_routes_are_named() {
        let doc = serde_json::json!({ "paths": { "/{domain}/v1/items/{key}": { "get": {}, "put": {} } } });
        assert!(undocumented_routes(&doc, &[(Method::GET, "/{domain}/v1/items/{key}")]).is_empty());
        assert_eq!(undocumented_routes(&doc, &[(Method::DELETE, "/{domain}/v1/items/{key}")]), vec!["DELETE /{domain}/v1/items/{key}"]);
    }
}
