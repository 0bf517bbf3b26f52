//! The connections a service accepts, and the limits that keep slow or idle
//! clients from holding it hostage (slowloris).
//!
//! Every accepted connection is registered with its phase:
//! - **waiting** for a request: since when, and when the first byte of the
//!   request arrived;
//! - **busy**: requests whose response body has not been sent yet.
//!
//! A watchdog closes a waiting connection when
//! - a request's headers are not complete [`ConnectionLimits::header_read_timeout`]
//!   after its first byte (trickled headers), or a new connection sends nothing
//!   for that long;
//! - a kept-alive connection stays idle longer than
//!   [`ConnectionLimits::idle_timeout`] after its last answer.
//!
//! Busy connections are never cut here (the request timeout bounds handlers).
//! At most [`ConnectionLimits::max_connections`] are open at once (lowered to
//! leave headroom below the process's file-descriptor limit); at the cap, when
//! a new connection waits in the listen backlog, the connection waiting
//! longest is closed to make room for it, so a flood of idle or slow
//! connections cannot lock out `/healthz` — but only one that has waited
//! longer than [`REUSE_GRACE`]: a kept-alive connection that has just answered
//! is the one its client sends the next request on, and closing it then is a
//! reset in the client's face (a flood past the cap closed thousands so, and
//! the clients' reconnections made it worse). When no connection is
//! evictable, accepting pauses: new connections wait in the listen backlog
//! until one frees, logged once per episode, never in a busy loop; running
//! out of file descriptors is handled the same way.
//!
//! Closing a kept-alive connection the client may be reusing at that moment
//! races it (a request sent as the close arrives fails with "server closed
//! idle connection", and clients retry only idempotent methods), so every
//! HTTP/1 response says how long an idle connection is kept (`Keep-Alive:
//! timeout=…`), and the idle timeout is longer than common clients' own (Go's
//! and reqwest's 90 s, curl's 118 s): those clients give idle connections up
//! first; and nothing is closed at the cap unless a newcomer waits for the
//! place. (Making room with `Connection: close` on busy connections' next
//! responses instead, which no client races, was measured and set aside:
//! with clients holding more connections than the cap it closed nine
//! responses' connections in ten and cost 13% of the throughput, where
//! closing idle ones failed 0-2 requests of 75,000.)
//!
//! hyper's own header-read timer is not used: it starts whenever a connection
//! waits, so it cannot tell a slow header from an idle keep-alive connection.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request};
use axum::middleware::Next;
use axum::response::Response;
use axum::serve::IncomingStream;
use futures_util::task::AtomicWaker;
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// How many connections, and how slow and idle they may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
}

/// How often the watchdog looks at the waiting connections.
const WATCHDOG_TICK: Duration = Duration::from_millis(200);
/// How long a connection must have waited (for its first request, or for the
/// next one on a kept-alive connection) before the cap may close it: one that
/// waited less is about to be used (a pooled connection its client is picking
/// up again, a new one whose request is on its way). Short, so that slow
/// connections still make room for a probe within a second or two.
pub const REUSE_GRACE: Duration = Duration::from_millis(250);
/// The header that says how long an idle connection is kept (RFC 9112 leaves
/// it to clients; Node's HTTP clients read it).
const KEEP_ALIVE: http::HeaderName = http::HeaderName::from_static("keep-alive");
/// File descriptors kept free for everything else (storage, outgoing calls, logs).
const MIN_FD_RESERVE: usize = 64;

impl ConnectionLimits {
    /// The connection cap actually used: the configured one, lowered when
    /// the process's file-descriptor limit would be reached first.
    pub fn effective_max_connections(&self) -> usize {
        match soft_fd_limit() {
            Some(fds) => self.max_connections.min(fds.saturating_sub(MIN_FD_RESERVE.max(fds / 4))).max(1),
            None => self.max_connections,
        }
    }
}

/// The soft `RLIMIT_NOFILE`, read from `/proc/self/limits` (Linux).
fn soft_fd_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Waiting { since: Instant, first_byte: Option<Instant>, fresh: bool },
    Busy { requests: usize },
}

/// One accepted connection's shared state.
#[derive(Debug)]
pub struct Connection {
    id: u64,
    phase: Mutex<Phase>,
    close: CancellationToken,
    /// The cap chose this connection to make room: it closes at its next
    /// read that would wait, or stays if a request is already there.
    evict: AtomicBool,
    /// The task reading the connection, woken to act on `evict`.
    reader: AtomicWaker,
}

impl Connection {
    fn new(id: u64, phase: Phase) -> Self {
        Connection {
            id,
            phase: Mutex::new(phase),
            close: CancellationToken::new(),
            evict: AtomicBool::new(false),
            reader: AtomicWaker::new(),
        }
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn saw_bytes(&self) {
        let mut phase = self.phase();
        if let Phase::Waiting { first_byte: first_byte @ None, .. } = &mut *phase {
            *first_byte = Some(Instant::now());
        }
    }

    fn begin_request(self: &Arc<Self>) -> RequestGuard {
        let mut phase = self.phase();
        *phase = match *phase {
            Phase::Busy { requests } => Phase::Busy { requests: requests + 1 },
            Phase::Waiting { .. } => Phase::Busy { requests: 1 },
        };
        RequestGuard(self.clone())
    }
}

/// Held until a request's response body is sent (or dropped).
#[derive(Debug)]
struct RequestGuard(Arc<Connection>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let mut phase = self.0.phase();
        *phase = match *phase {
            Phase::Busy { requests } if requests > 1 => Phase::Busy { requests: requests - 1 },
            _ => Phase::Waiting { since: Instant::now(), first_byte: None, fresh: false },
        };
    }
}

/// Why the watchdog or the cap closed a connection (a metric label).
#[derive(Debug, Clone, Copy)]
enum CloseReason {
    HeaderTimeout,
    IdleTimeout,
    Evicted,
}

impl CloseReason {
    fn label(self) -> &'static str {
        match self {
            CloseReason::HeaderTimeout => "header_timeout",
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::Evicted => "evicted",
        }
    }
}

#[derive(Debug)]
struct Registry {
    /// The service whose connections these are: its metrics' `service` label
    /// (several services can share a process under `revstore up`).
    service: &'static str,
    open: Mutex<HashMap<u64, Arc<Connection>>>,
    freed: Notify,
    /// Connections asked to make room that have not closed or stayed yet.
    evictions_pending: AtomicU64,
    /// `timeout=…` of the `Keep-Alive` header: the idle timeout in seconds.
    keep_alive: http::HeaderValue,
}

impl Registry {
    fn new(service: &'static str, limits: &ConnectionLimits) -> Self {
        Registry {
            service,
            open: Mutex::default(),
            freed: Notify::new(),
            evictions_pending: AtomicU64::new(0),
            keep_alive: http::HeaderValue::from_str(&format!("timeout={}", limits.idle_timeout.as_secs()))
                .unwrap_or(http::HeaderValue::from_static("timeout=60")),
        }
    }

    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Connection>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn close(&self, connection: &Connection, reason: CloseReason) {
        if !connection.close.is_cancelled() {
            connection.close.cancel();
            metrics::counter!("http_connections_closed_total", "service" => self.service, "reason" => reason.label()).increment(1);
        }
    }

    /// Closes the waiting connections that are past their deadline.
    fn enforce(&self, limits: &ConnectionLimits, now: Instant) {
        let overdue: Vec<(Arc<Connection>, CloseReason)> = self
            .open()
            .values()
            .filter_map(|c| match *c.phase() {
                Phase::Waiting { first_byte: Some(first), .. } if now - first > limits.header_read_timeout => {
                    Some((c.clone(), CloseReason::HeaderTimeout))
                }
                Phase::Waiting { since, first_byte: None, fresh: true } if now - since > limits.header_read_timeout => {
                    Some((c.clone(), CloseReason::HeaderTimeout))
                }
                Phase::Waiting { since, first_byte: None, fresh: false } if now - since > limits.idle_timeout => {
                    Some((c.clone(), CloseReason::IdleTimeout))
                }
                _ => None,
            })
            .collect();
        for (connection, reason) in overdue {
            self.close(&connection, reason);
        }
    }

    /// Asks the connection that has waited longest (past [`REUSE_GRACE`]) to
    /// make room; false when none has (all busy or just used). It closes only
    /// if no request is waiting to be read on it (see [`TrackedStream`]).
    fn evict_longest_waiting(&self, now: Instant) -> bool {
        let victim = self
            .open()
            .values()
            .filter(|c| !c.close.is_cancelled() && !c.evict.load(Ordering::Relaxed))
            .filter_map(|c| match *c.phase() {
                Phase::Waiting { since, .. } if now.saturating_duration_since(since) > REUSE_GRACE => Some((since, c.clone())),
                Phase::Waiting { .. } | Phase::Busy { .. } => None,
            })
            .min_by_key(|(since, _)| *since)
            .map(|(_, c)| c);
        match victim {
            Some(connection) => {
                self.evictions_pending.fetch_add(1, Ordering::Relaxed);
                connection.evict.store(true, Ordering::Relaxed);
                connection.reader.wake();
                true
            }
            None => false,
        }
    }

    /// An eviction asked of `connection` is settled: it closed, or a request was there.
    fn eviction_settled(&self, connection: &Connection) {
        if connection.evict.swap(false, Ordering::Relaxed) {
            self.evictions_pending.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A TCP listener that registers, limits and watches its connections; serve
/// it with [`axum::serve`] and a router wrapped by [`track_requests`].
#[derive(Debug)]
pub struct LimitedListener {
    listener: TcpListener,
    max_connections: usize,
    registry: Arc<Registry>,
    next_id: AtomicU64,
    /// Set while accepting is paused (cap reached with every connection busy, or no fds).
    paused: bool,
    /// When a pause was last logged, and the pauses since (a flood pauses
    /// and resumes many times a second: one line per [`PAUSE_LOG_EVERY`]).
    pause_logged_at: Option<Instant>,
    pauses_unlogged: u64,
}

/// At most one "not accepting connections" line per this long.
const PAUSE_LOG_EVERY: Duration = Duration::from_secs(10);

impl LimitedListener {
    /// The listener of `service` (the label of its connection metrics).
    pub fn new(listener: TcpListener, limits: ConnectionLimits, service: &'static str) -> Self {
        let max_connections = limits.effective_max_connections();
        if max_connections < limits.max_connections {
            tracing::info!(
                configured = limits.max_connections,
                used = max_connections,
                "connection cap lowered to stay below the file-descriptor limit"
            );
        }
        let registry = Arc::new(Registry::new(service, &limits));
        tokio::spawn(watchdog(Arc::downgrade(&registry), limits));
        LimitedListener {
            listener,
            max_connections,
            registry,
            next_id: AtomicU64::new(0),
            paused: false,
            pause_logged_at: None,
            pauses_unlogged: 0,
        }
    }

    fn pause(&mut self, why: &str, error: Option<&io::Error>) {
        if std::mem::replace(&mut self.paused, true) {
            return;
        }
        self.pauses_unlogged += 1;
        let now = Instant::now();
        if self.pause_logged_at.is_none_or(|at| now - at >= PAUSE_LOG_EVERY) {
            tracing::warn!(
                reason = why,
                error = error.map(tracing::field::display),
                max_connections = self.max_connections,
                pauses = self.pauses_unlogged,
                "not accepting connections for now"
            );
            self.pause_logged_at = Some(now);
            self.pauses_unlogged = 0;
        }
    }

    /// Whether a connection waits in the listen backlog (the listening
    /// socket is readable), asked without waiting and without accepting it.
    fn a_connection_waits(&self) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let mut fds = [PollFd::new(&self.listener, PollFlags::IN)];
        // On an error, assume one does: the cap then acts as it would in a flood.
        poll(&mut fds, Some(&Timespec { tv_sec: 0, tv_nsec: 0 })).map_or(true, |ready| ready > 0)
    }

    fn resume(&mut self) {
        if std::mem::replace(&mut self.paused, false) && self.pauses_unlogged == 0 {
            // The pause that was logged is over (later ones are summed into the next line).
            tracing::info!("accepting connections again");
        }
    }
}

async fn watchdog(registry: Weak<Registry>, limits: ConnectionLimits) {
    let mut tick = tokio::time::interval(WATCHDOG_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(registry) = registry.upgrade() else { return };
        registry.enforce(&limits, Instant::now());
        metrics::gauge!("http_open_connections", "service" => registry.service).set(registry.open().len() as f64);
    }
}

impl axum::serve::Listener for LimitedListener {
    type Io = TrackedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let mut backoff = Duration::from_millis(50);
        loop {
            while self.registry.open().len() >= self.max_connections {
                // Only for a client that is there (a connection waits in the
                // listen backlog): closing an idle connection may race its
                // client reusing it. One eviction at a time: a connection
                // asked may turn out to be in use.
                let asking = self.registry.evictions_pending.load(Ordering::Relaxed) > 0;
                if !asking && self.a_connection_waits() && !self.registry.evict_longest_waiting(Instant::now()) {
                    self.pause("the connection cap is reached and every connection is busy or was just used", None);
                }
                // A slot frees when a closed connection's stream is dropped.
                let _ = tokio::time::timeout(Duration::from_millis(100), self.registry.freed.notified()).await;
            }
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    self.resume();
                    let _ = stream.set_nodelay(true);
                    let connection = Arc::new(Connection::new(
                        self.next_id.fetch_add(1, Ordering::Relaxed),
                        Phase::Waiting { since: Instant::now(), first_byte: None, fresh: true },
                    ));
                    self.registry.open().insert(connection.id, connection.clone());
                    let closed = Box::pin(connection.close.clone().cancelled_owned());
                    return (TrackedStream { stream, connection, registry: self.registry.clone(), closed }, addr);
                }
                // The peer gave up before we took it: nothing to report.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionRefused
                    ) => {}
                // Out of file descriptors (EMFILE, ENFILE) or another accept failure:
                // say so once, wait (longer each time) instead of spinning.
                Err(e) => {
                    self.pause("accepting failed (out of file descriptors?)", Some(&e));
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// An accepted TCP stream that reports its reads to its connection's state
/// and ends when the watchdog or the cap closes it.
///
/// The cap's close is decided here, at a read: a connection asked to make
/// room closes only when reading it would wait. A kept-alive connection on
/// which the client has just sent its next request (or a new one whose
/// request is in the socket) is read instead, and stays: closing it would
/// reset a request the client has already sent.
#[derive(Debug)]
pub struct TrackedStream {
    stream: TcpStream,
    connection: Arc<Connection>,
    registry: Arc<Registry>,
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl TrackedStream {
    fn poll_closed(&mut self, cx: &mut Context<'_>) -> bool {
        self.closed.as_mut().poll(cx).is_ready()
    }
}

fn closed_error() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connection closed: too slow, idle too long, or evicted at the connection cap")
}

impl AsyncRead for TrackedStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.poll_closed(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        self.connection.reader.register(cx.waker());
        let before = buf.filled().len();
        let result = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.connection.saw_bytes();
        }
        if self.connection.evict.load(Ordering::Relaxed) {
            let in_use = matches!(*self.connection.phase(), Phase::Busy { .. }) || !matches!(result, Poll::Pending);
            self.registry.eviction_settled(&self.connection);
            if !in_use {
                self.registry.close(&self.connection, CloseReason::Evicted);
                return Poll::Ready(Err(closed_error()));
            }
        }
        result
    }
}

impl AsyncWrite for TrackedStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.poll_closed(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        if self.poll_closed(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl Drop for TrackedStream {
    fn drop(&mut self) {
        self.registry.eviction_settled(&self.connection);
        self.registry.open().remove(&self.connection.id);
        self.registry.freed.notify_one();
    }
}

/// The connection a request came on, for [`track_requests`].
#[derive(Debug, Clone)]
pub struct ConnectionHandle {
    connection: Arc<Connection>,
    registry: Arc<Registry>,
}

impl axum::extract::connect_info::Connected<IncomingStream<'_, LimitedListener>> for ConnectionHandle {
    fn connect_info(stream: IncomingStream<'_, LimitedListener>) -> Self {
        ConnectionHandle { connection: stream.io().connection.clone(), registry: stream.io().registry.clone() }
    }
}

/// Marks the connection busy from a request's start until its response body
/// is sent, so that neither timeout cuts a slow handler or a long stream;
/// tells the client how long the connection is kept idle (HTTP/1; HTTP/2
/// has no such header).
pub async fn track_requests(ConnectInfo(handle): ConnectInfo<ConnectionHandle>, request: Request, next: Next) -> Response {
    let guard = handle.connection.begin_request();
    let http1 = request.version() < http::Version::HTTP_2;
    let mut response = next.run(request).await;
    if http1 && !response.headers().contains_key(http::header::CONNECTION) {
        response.headers_mut().insert(KEEP_ALIVE, handle.registry.keep_alive.clone());
    }
    response.map(|body| {
        axum::body::Body::new(body.map_frame(move |frame| {
            let _held_until_the_body_is_done = &guard;
            frame
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection(phase: Phase) -> Arc<Connection> {
        Arc::new(Connection::new(0, phase))
    }

    const LIMITS: ConnectionLimits =
        ConnectionLimits { max_connections: 4, header_read_timeout: Duration::from_secs(10), idle_timeout: Duration::from_secs(60) };

    #[test]
    fn deadlines_follow_the_phase() {
        let now = Instant::now();
        let ago = |s: u64| now - Duration::from_secs(s);
        let cases = [
            (Phase::Waiting { since: ago(11), first_byte: None, fresh: true }, true),
            (Phase::Waiting { since: ago(9), first_byte: None, fresh: true }, false),
            (Phase::Waiting { since: ago(30), first_byte: None, fresh: false }, false),
            (Phase::Waiting { since: ago(61), first_byte: None, fresh: false }, true),
            (Phase::Waiting { since: ago(50), first_byte: Some(ago(11)), fresh: false }, true),
            (Phase::Waiting { since: ago(50), first_byte: Some(ago(9)), fresh: false }, false),
            (Phase::Busy { requests: 1 }, false),
        ];
        for (phase, closed) in cases {
            let registry = Registry::new("test", &LIMITS);
            let c = connection(phase);
            registry.open().insert(0, c.clone());
            registry.enforce(&LIMITS, now);
            assert_eq!(c.close.is_cancelled(), closed, "{phase:?}");
        }
    }

    #[test]
    fn the_cap_evicts_the_longest_waiting_and_never_a_busy_or_just_used_one() {
        let now = Instant::now();
        let registry = Registry::new("test", &LIMITS);
        let busy = connection(Phase::Busy { requests: 1 });
        let old = connection(Phase::Waiting { since: now - Duration::from_secs(5), first_byte: None, fresh: true });
        let young = connection(Phase::Waiting { since: now - Duration::from_secs(2), first_byte: None, fresh: false });
        // Answered a moment ago: its client is about to send the next request on it.
        let just_used = connection(Phase::Waiting { since: now - Duration::from_millis(10), first_byte: None, fresh: false });
        for (id, c) in [&busy, &old, &young, &just_used].into_iter().enumerate() {
            registry.open().insert(id as u64, c.clone());
        }
        let asked = |c: &Connection| c.evict.load(Ordering::Relaxed);
        assert!(registry.evict_longest_waiting(now));
        assert!(asked(&old) && !asked(&young));
        assert!(registry.evict_longest_waiting(now));
        assert!(asked(&young));
        assert!(!registry.evict_longest_waiting(now), "a busy or just-used connection is never evicted");
        assert!(!asked(&busy) && !asked(&just_used));
        // Once it has waited past the grace, it may go.
        assert!(registry.evict_longest_waiting(now + REUSE_GRACE + Duration::from_millis(1)));
        assert!(asked(&just_used));
        assert_eq!(registry.evictions_pending.load(Ordering::Relaxed), 3);
        for c in [&old, &young, &just_used] {
            registry.eviction_settled(c);
        }
        assert_eq!(registry.evictions_pending.load(Ordering::Relaxed), 0);
    }

    /// A server-side stream tracked by `registry`, and its client end.
    async fn tracked_pair(registry: &Arc<Registry>) -> (TrackedStream, tokio::net::TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = tokio::net::TcpStream::connect(listener.local_addr().expect("addr")).await.expect("connect");
        let (stream, _) = listener.accept().await.expect("accept");
        let connection = Arc::new(Connection::new(7, Phase::Waiting { since: Instant::now(), first_byte: None, fresh: false }));
        registry.open().insert(7, connection.clone());
        let closed = Box::pin(connection.close.clone().cancelled_owned());
        (TrackedStream { stream, connection, registry: registry.clone(), closed }, client)
    }

    #[tokio::test]
    async fn a_connection_asked_to_make_room_stays_when_its_client_has_already_sent_a_request() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let registry = Arc::new(Registry::new("test", &LIMITS));
        let (mut server, mut client) = tracked_pair(&registry).await;
        // The client reuses the kept-alive connection just as the cap picks it.
        client.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").await.expect("write");
        tokio::time::timeout(Duration::from_secs(60), server.stream.readable()).await.expect("the request arrives").expect("readable");
        server.connection.evict.store(true, Ordering::Relaxed);
        registry.evictions_pending.store(1, Ordering::Relaxed);
        let mut buf = [0u8; 64];
        let n = server.read(&mut buf).await.expect("the request is read, not refused");
        assert!(buf[..n].starts_with(b"GET /healthz"));
        assert!(!server.connection.close.is_cancelled(), "a connection with a request on it is not closed");
        assert_eq!(registry.evictions_pending.load(Ordering::Relaxed), 0, "the eviction is settled");

        // Nothing sent: the next read that would wait closes it.
        let (mut idle, _idle_client) = tracked_pair(&registry).await;
        idle.connection.evict.store(true, Ordering::Relaxed);
        registry.evictions_pending.store(1, Ordering::Relaxed);
        let error = idle.read(&mut buf).await.expect_err("an idle connection asked to make room closes");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(idle.connection.close.is_cancelled());
        assert_eq!(registry.evictions_pending.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_request_keeps_the_connection_busy_until_its_body_is_done() {
        let c = connection(Phase::Waiting { since: Instant::now(), first_byte: Some(Instant::now()), fresh: true });
        let first = c.begin_request();
        let second = c.begin_request();
        drop(first);
        assert!(matches!(*c.phase(), Phase::Busy { requests: 1 }));
        drop(second);
        assert!(matches!(*c.phase(), Phase::Waiting { first_byte: None, fresh: false, .. }));
    }

    #[test]
    fn the_cap_stays_below_the_fd_limit() {
        let limits = ConnectionLimits { max_connections: usize::MAX, ..LIMITS };
        if let Some(fds) = soft_fd_limit() {
            assert!(limits.effective_max_connections() < fds, "{} of {fds}", limits.effective_max_connections());
        }
        assert_eq!(ConnectionLimits { max_connections: 3, ..LIMITS }.effective_max_connections(), 3);
    }
}
