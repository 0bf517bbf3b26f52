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
//! leave headroom below the process's file-descriptor limit); at the cap, the
//! connection waiting longest is closed to make room, so a flood of idle or
//! slow connections cannot lock out `/healthz`. Only when every connection is
//! busy does accepting pause, logged once per episode, never in a busy loop;
//! running out of file descriptors is handled the same way.
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
}

impl Connection {
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
}

impl Registry {
    fn new(service: &'static str) -> Self {
        Registry { service, open: Mutex::default(), freed: Notify::new() }
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

    /// Closes the connection that has waited longest; false when all are busy.
    fn evict_longest_waiting(&self) -> bool {
        let victim = self
            .open()
            .values()
            .filter(|c| !c.close.is_cancelled())
            .filter_map(|c| match *c.phase() {
                Phase::Waiting { since, .. } => Some((since, c.clone())),
                Phase::Busy { .. } => None,
            })
            .min_by_key(|(since, _)| *since)
            .map(|(_, c)| c);
        match victim {
            Some(connection) => {
                self.close(&connection, CloseReason::Evicted);
                true
            }
            None => false,
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
    paused: AtomicBool,
}

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
        let registry = Arc::new(Registry::new(service));
        tokio::spawn(watchdog(Arc::downgrade(&registry), limits));
        LimitedListener { listener, max_connections, registry, next_id: AtomicU64::new(0), paused: AtomicBool::new(false) }
    }

    fn pause(&self, why: &str, error: Option<&io::Error>) {
        if !self.paused.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                reason = why,
                error = error.map(tracing::field::display),
                max_connections = self.max_connections,
                "not accepting connections for now"
            );
        }
    }

    fn resume(&self) {
        if self.paused.swap(false, Ordering::Relaxed) {
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
                if !self.registry.evict_longest_waiting() {
                    self.pause("the connection cap is reached and every connection is busy", None);
                }
                // A slot frees when a closed connection's stream is dropped.
                let _ = tokio::time::timeout(Duration::from_millis(100), self.registry.freed.notified()).await;
            }
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    self.resume();
                    let _ = stream.set_nodelay(true);
                    let connection = Arc::new(Connection {
                        id: self.next_id.fetch_add(1, Ordering::Relaxed),
                        phase: Mutex::new(Phase::Waiting { since: Instant::now(), first_byte: None, fresh: true }),
                        close: CancellationToken::new(),
                    });
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
        let before = buf.filled().len();
        let result = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.connection.saw_bytes();
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
        self.registry.open().remove(&self.connection.id);
        self.registry.freed.notify_one();
    }
}

/// The connection a request came on, for [`track_requests`].
#[derive(Debug, Clone)]
pub struct ConnectionHandle(Arc<Connection>);

impl axum::extract::connect_info::Connected<IncomingStream<'_, LimitedListener>> for ConnectionHandle {
    fn connect_info(stream: IncomingStream<'_, LimitedListener>) -> Self {
        ConnectionHandle(stream.io().connection.clone())
    }
}

/// Marks the connection busy from a request's start until its response body
/// is sent, so that neither timeout cuts a slow handler or a long stream.
pub async fn track_requests(ConnectInfo(connection): ConnectInfo<ConnectionHandle>, request: Request, next: Next) -> Response {
    let guard = connection.0.begin_request();
    let response = next.run(request).await;
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
        Arc::new(Connection { id: 0, phase: Mutex::new(phase), close: CancellationToken::new() })
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
            let registry = Registry::new("test");
            let c = connection(phase);
            registry.open().insert(0, c.clone());
            registry.enforce(&LIMITS, now);
            assert_eq!(c.close.is_cancelled(), closed, "{phase:?}");
        }
    }

    #[test]
    fn the_cap_evicts_the_longest_waiting_and_never_a_busy_one() {
        let now = Instant::now();
        let registry = Registry::new("test");
        let busy = connection(Phase::Busy { requests: 1 });
        let old = connection(Phase::Waiting { since: now - Duration::from_secs(5), first_byte: None, fresh: true });
        let young = connection(Phase::Waiting { since: now, first_byte: None, fresh: true });
        for (id, c) in [&busy, &old, &young].into_iter().enumerate() {
            registry.open().insert(id as u64, c.clone());
        }
        assert!(registry.evict_longest_waiting());
        assert!(old.close.is_cancelled() && !young.close.is_cancelled());
        assert!(registry.evict_longest_waiting());
        assert!(young.close.is_cancelled());
        assert!(!registry.evict_longest_waiting(), "a busy connection is never evicted");
        assert!(!busy.close.is_cancelled());
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
