//! An open-loop HTTP/1.1 load generator cheap enough to share the machine with
//! the service it loads.
//!
//! Overload is measured here with the generator on the same two cores as the
//! service. A generator built on a full HTTP client (reqwest: a spawned task,
//! a pool lookup and a response object per request) spent about 70 µs of CPU
//! a request, so at 18,000 requests a second it took 1.3 of the 2 cores and
//! the measurement was of the generator. This one keeps a fixed set of
//! keep-alive connections, writes prepared request bytes and reads only the
//! status line, the framing headers and the body (httparse): a few µs a
//! request.
//!
//! Requests are sent on a schedule (request `i` at `start + i / rate`) by at
//! most `connections` connections at once, as a fleet of pooled clients or a
//! proxy would; a request that finds every connection busy waits on the
//! client side, and its latency counts from its scheduled time, so queueing
//! anywhere shows (no coordinated omission). Without a rate the run is closed
//! loop: each connection sends its next request as soon as it has an answer,
//! which measures saturation.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How one request ended, as the run's classifier sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Success,
    /// Refused by load shedding (503 with the `overloaded` problem).
    Shed,
    Failed,
}

impl Answer {
    /// The usual classes: `success` statuses succeed; a 503 whose body is the
    /// `overloaded` problem was shed; anything else failed.
    pub fn of(status: u16, body: &[u8], success: &[u16]) -> Answer {
        if success.contains(&status) {
            Answer::Success
        } else if status == 503 && contains(body, b"urn:revstore:problem:overloaded") {
            Answer::Shed
        } else {
            Answer::Failed
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// What a run offers and how.
#[derive(Debug, Clone)]
pub struct Plan {
    pub addr: SocketAddr,
    /// Requests a second, sent on schedule whatever the answers' pace; `None`
    /// runs closed loop, each connection sending its next request once answered.
    pub rate: Option<u64>,
    pub duration: Duration,
    /// The most connections (so requests) open at once.
    pub connections: usize,
    /// A request unanswered this long has failed (its connection is dropped).
    pub timeout: Duration,
}

/// One request's end.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Its index, as given to the request maker.
    pub index: u64,
    pub answer: Answer,
    /// 0 when no answer came.
    pub status: u16,
    /// From its scheduled time (open loop) or its send (closed loop) to its answer.
    pub latency: Duration,
    /// When its answer came, from the run's start.
    pub finished: Duration,
}

/// What a run saw.
#[derive(Debug, Default)]
pub struct Report {
    pub outcomes: Vec<Outcome>,
    pub elapsed: Duration,
    /// Failures by cause: a status, a connection error, a timeout.
    pub failures: BTreeMap<String, usize>,
}

impl Report {
    pub fn count(&self, answer: Answer) -> usize {
        self.outcomes.iter().filter(|o| o.answer == answer).count()
    }

    /// Answers of this class a second over the run.
    pub fn rate(&self, answer: Answer) -> f64 {
        self.count(answer) as f64 / self.elapsed.as_secs_f64()
    }

    /// Answers of this class in each second of the run: a collapse shows as
    /// seconds with few.
    pub fn per_second(&self, answer: Answer) -> Vec<usize> {
        let mut seconds = vec![0; self.elapsed.as_secs() as usize + 1];
        for o in self.outcomes.iter().filter(|o| o.answer == answer) {
            if let Some(n) = seconds.get_mut(o.finished.as_secs() as usize) {
                *n += 1;
            }
        }
        seconds
    }

    /// The `p` quantile (0-1) of the latencies of `answers` (all if `None`), in ms.
    pub fn quantile_ms(&self, answers: Option<Answer>, p: f64) -> f64 {
        let mut latencies: Vec<Duration> =
            self.outcomes.iter().filter(|o| answers.is_none_or(|a| o.answer == a)).map(|o| o.latency).collect();
        if latencies.is_empty() {
            return f64::NAN;
        }
        latencies.sort_unstable();
        latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)].as_secs_f64() * 1e3
    }
}

/// The bytes of one HTTP/1.1 request on a keep-alive connection.
pub fn request(method: &str, addr: SocketAddr, path: &str, token: Option<&str>, json_body: Option<&[u8]>) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\n");
    if let Some(token) = token {
        head.push_str(&format!("authorization: Bearer {token}\r\n"));
    }
    let body = json_body.unwrap_or_default();
    if json_body.is_some() {
        head.push_str(&format!("content-type: application/json\r\ncontent-length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

struct Run<M, C> {
    plan: Plan,
    make: M,
    classify: C,
    next: AtomicU64,
    start: Instant,
}

/// Runs `plan`: request `i` is `make(i)`, its answer classed by
/// `classify(i, status, body)`.
pub async fn run<M, C>(plan: Plan, make: M, classify: C) -> Report
where
    M: Fn(u64) -> Vec<u8> + Send + Sync + 'static,
    C: Fn(u64, u16, &[u8]) -> Answer + Send + Sync + 'static,
{
    let start = Instant::now() + Duration::from_millis(50);
    let connections = plan.connections.max(1);
    let run = Arc::new(Run { plan, make, classify, next: AtomicU64::new(0), start });
    let workers: Vec<_> = (0..connections).map(|_| tokio::spawn(worker(run.clone()))).collect();
    let mut report = Report::default();
    for w in workers {
        let (outcomes, failures) = w.await.expect("a load worker panicked");
        report.outcomes.extend(outcomes);
        for (why, n) in failures {
            *report.failures.entry(why).or_default() += n;
        }
    }
    report.elapsed = start.elapsed();
    report.outcomes.sort_unstable_by_key(|o| o.index);
    report
}

/// One connection's worth of requests, taken in schedule order.
async fn worker<M, C>(run: Arc<Run<M, C>>) -> (Vec<Outcome>, BTreeMap<String, usize>)
where
    M: Fn(u64) -> Vec<u8> + Send + Sync + 'static,
    C: Fn(u64, u16, &[u8]) -> Answer + Send + Sync + 'static,
{
    let plan = &run.plan;
    let total = plan.rate.map(|rate| (rate as f64 * plan.duration.as_secs_f64()) as u64);
    let end = run.start + plan.duration;
    let (mut outcomes, mut failures) = (Vec::new(), BTreeMap::<String, usize>::new());
    let mut connection: Option<Connection> = None;
    loop {
        let index = run.next.fetch_add(1, Ordering::Relaxed);
        let scheduled = match (plan.rate, total) {
            (Some(rate), Some(total)) => {
                if index >= total {
                    break;
                }
                run.start + Duration::from_nanos(index * 1_000_000_000 / rate)
            }
            _ => {
                let now = Instant::now().max(run.start);
                if now >= end {
                    break;
                }
                now
            }
        };
        tokio::time::sleep_until(scheduled.into()).await;
        let request = (run.make)(index);
        let exchange = tokio::time::timeout(plan.timeout, exchange(&mut connection, plan.addr, &request)).await;
        let (answer, status) = match exchange {
            Ok(Ok((status, body))) => {
                let answer = (run.classify)(index, status, &body);
                if answer == Answer::Failed {
                    *failures.entry(format!("status {status}")).or_default() += 1;
                }
                (answer, status)
            }
            Ok(Err(e)) => {
                connection = None;
                *failures.entry(format!("{:?}: {e}", e.kind()).chars().take(100).collect()).or_default() += 1;
                (Answer::Failed, 0)
            }
            Err(_) => {
                connection = None;
                *failures.entry("timeout".to_owned()).or_default() += 1;
                (Answer::Failed, 0)
            }
        };
        outcomes.push(Outcome { index, answer, status, latency: scheduled.elapsed(), finished: run.start.elapsed() });
    }
    (outcomes, failures)
}

/// A keep-alive connection and its read buffer.
struct Connection {
    stream: TcpStream,
    buffer: Vec<u8>,
}

/// Sends `request` on the connection (opening one if there is none) and reads
/// the answer: its status and body. The connection is dropped when the
/// server says it closes it.
async fn exchange(connection: &mut Option<Connection>, addr: SocketAddr, request: &[u8]) -> io::Result<(u16, Vec<u8>)> {
    if connection.is_none() {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        *connection = Some(Connection { stream, buffer: Vec::with_capacity(64 * 1024) });
    }
    let Some(c) = connection.as_mut() else { unreachable!("a connection was just opened") };
    c.stream.write_all(request).await?;
    let (status, body, close) = read_response(c).await?;
    if close {
        *connection = None;
    }
    Ok((status, body))
}

/// The response head's parts that framing needs.
struct Head {
    length: usize,
    status: u16,
    content_length: Option<usize>,
    chunked: bool,
    close: bool,
}

fn parse_head(bytes: &[u8]) -> io::Result<Option<Head>> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let length = match response.parse(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Ok(None),
    };
    let mut head = Head { length, status: response.code.unwrap_or(0), content_length: None, chunked: false, close: false };
    for h in response.headers.iter() {
        let value = std::str::from_utf8(h.value).unwrap_or("").trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            head.content_length = Some(value.parse().map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad content-length"))?);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            head.chunked = value.eq_ignore_ascii_case("chunked");
        } else if h.name.eq_ignore_ascii_case("connection") {
            head.close = value.eq_ignore_ascii_case("close");
        }
    }
    Ok(Some(head))
}

/// Reads more of the stream into the buffer; EOF is an error (the server
/// closed the connection before its answer was whole).
async fn fill(c: &mut Connection) -> io::Result<()> {
    c.buffer.reserve(16 * 1024);
    if c.stream.read_buf(&mut c.buffer).await? == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed before the answer was whole"));
    }
    Ok(())
}

async fn read_response(c: &mut Connection) -> io::Result<(u16, Vec<u8>, bool)> {
    c.buffer.clear();
    let head = loop {
        if let Some(head) = parse_head(&c.buffer)? {
            break head;
        }
        fill(c).await?;
    };
    let no_body = head.status < 200 || head.status == 204 || head.status == 304;
    let body = if no_body {
        Vec::new()
    } else if let Some(length) = head.content_length {
        while c.buffer.len() < head.length + length {
            fill(c).await?;
        }
        c.buffer[head.length..head.length + length].to_vec()
    } else if head.chunked {
        read_chunked(c, head.length).await?
    } else {
        // Neither length nor chunks: the body runs to the end of the stream.
        while c.stream.read_buf(&mut c.buffer).await? > 0 {}
        return Ok((head.status, c.buffer[head.length..].to_vec(), true));
    };
    Ok((head.status, body, head.close))
}

/// A chunked body from `at` on (trailers are read past and ignored).
async fn read_chunked(c: &mut Connection, mut at: usize) -> io::Result<Vec<u8>> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(i) = c.buffer[at..].windows(2).position(|w| w == b"\r\n") {
                break at + i;
            }
            fill(c).await?;
        };
        let line = std::str::from_utf8(&c.buffer[at..line_end]).map_err(|_| invalid("bad chunk size"))?;
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16).map_err(|_| invalid("bad chunk size"))?;
        at = line_end + 2;
        if size == 0 {
            // Trailers, if any, end with an empty line.
            loop {
                if let Some(i) = c.buffer[at..].windows(2).position(|w| w == b"\r\n") {
                    if i == 0 {
                        return Ok(body);
                    }
                    at += i + 2;
                } else {
                    fill(c).await?;
                }
            }
        }
        while c.buffer.len() < at + size + 2 {
            fill(c).await?;
        }
        body.extend_from_slice(&c.buffer[at..at + size]);
        at += size + 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use axum::Router;
    use axum::routing::get;

    /// A server that answers `/ok` with a fixed body, `/stream` chunked,
    /// `/shed` as a shed request and `/close` with a closing connection.
    async fn server() -> SocketAddr {
        let app = Router::new()
            .route("/ok", get(|| async { "hello" }))
            .route(
                "/stream",
                get(|| async {
                    let chunks = futures_util::stream::iter(["ab", "cde", "f"].map(|s| Ok::<_, io::Error>(axum::body::Bytes::from(s))));
                    axum::body::Body::from_stream(chunks)
                }),
            )
            .route(
                "/shed",
                get(|| async { (axum::http::StatusCode::SERVICE_UNAVAILABLE, r#"{"type":"urn:revstore:problem:overloaded"}"#) }),
            )
            .route("/close", get(|| async { ([(axum::http::header::CONNECTION, "close")], "bye") }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        addr
    }

    #[tokio::test]
    async fn answers_are_read_whole_and_classed_whatever_their_framing() {
        let addr = server().await;
        let paths = ["/ok", "/stream", "/shed", "/close", "/missing"];
        let plan = Plan { addr, rate: Some(200), duration: Duration::from_secs(1), connections: 4, timeout: Duration::from_secs(60) };
        let report = run(
            plan,
            move |i| request("GET", addr, paths[i as usize % paths.len()], None, None),
            move |i, status, body| {
                let expected: &[u8] = match paths[i as usize % paths.len()] {
                    "/ok" => b"hello",
                    "/stream" => b"abcdef",
                    "/close" => b"bye",
                    _ => return Answer::of(status, body, &[200]),
                };
                if body == expected { Answer::Success } else { Answer::Failed }
            },
        )
        .await;
        assert_eq!(report.outcomes.len(), 200, "every scheduled request was sent: {:?}", report.failures);
        let by_path = |path: &str, answer: Answer| {
            report.outcomes.iter().filter(|o| paths[o.index as usize % paths.len()] == path && o.answer == answer).count()
        };
        for path in ["/ok", "/stream", "/close"] {
            assert_eq!(by_path(path, Answer::Success), 40, "{path}: {:?}", report.failures);
        }
        assert_eq!(by_path("/shed", Answer::Shed), 40);
        assert_eq!(by_path("/missing", Answer::Failed), 40);
        assert_eq!(report.failures.get("status 404"), Some(&40), "{:?}", report.failures);
        assert_eq!(report.failures.len(), 1, "no connection failed: {:?}", report.failures);
    }

    #[tokio::test]
    async fn a_closed_loop_run_stops_at_its_duration_and_a_refused_connection_fails() {
        let addr = server().await;
        let plan = Plan { addr, rate: None, duration: Duration::from_millis(300), connections: 2, timeout: Duration::from_secs(60) };
        let report = run(plan, move |_| request("GET", addr, "/ok", None, None), |_, status, body| Answer::of(status, body, &[200])).await;
        assert!(report.count(Answer::Success) > 0);
        assert_eq!(report.count(Answer::Success), report.outcomes.len(), "{:?}", report.failures);

        // Nothing listens on a port just freed.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
        let plan =
            Plan { addr: closed, rate: Some(10), duration: Duration::from_secs(1), connections: 1, timeout: Duration::from_secs(60) };
        let report =
            run(plan, move |_| request("GET", closed, "/ok", None, None), |_, status, body| Answer::of(status, body, &[200])).await;
        assert_eq!(report.count(Answer::Failed), 10);
        assert!(report.failures.keys().all(|k| k.starts_with("ConnectionRefused")), "{:?}", report.failures);
    }
}
