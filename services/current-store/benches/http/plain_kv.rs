//! The yardstick current-store is held to on Cassandra: a plain key-value
//! service over HTTP, one statement per request and nothing else — `PUT
//! /kv/{key}` one INSERT of the body, `GET /kv/{key}` one SELECT of it —
//! through the same driver, at the same consistency, into the same node. The
//! bench starts it as a process of its own (this binary again, with
//! `--serve-plain-kv NODE --keyspace KEYSPACE`), so that it and current-store each pay
//! for their own HTTP stack and their CPU can be read apart.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

use super::Bench;

/// The service's statements.
struct Statements {
    session: Session,
    insert: PreparedStatement,
    select: PreparedStatement,
}

/// Serves until killed, on a free port of 127.0.0.1; says where on stderr in
/// the line `revstore_bench::start_service` waits for.
pub async fn serve(node: &str, keyspace: &str) {
    let session = super::writes::plain_kv(node, keyspace).await;
    let insert = session.prepare(format!("INSERT INTO \"{keyspace}\".plain_kv (key, value) VALUES (?, ?)")).await.expect("prepare");
    let select = session.prepare(format!("SELECT value FROM \"{keyspace}\".plain_kv WHERE key = ?")).await.expect("prepare");
    let statements = Arc::new(Statements { session, insert, select });
    let app =
        axum::Router::new().route("/kv/{key}", get(read).put(write)).route("/readyz", get(|| async { "ready" })).with_state(statements);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    eprintln!("{{\"fields\":{{\"message\":\"listening\",\"service\":\"plain-kv\",\"address\":\"{address}\"}}}}");
    axum::serve(listener, app).await.expect("serve");
}

async fn write(State(s): State<Arc<Statements>>, Path(key): Path<String>, body: Bytes) -> StatusCode {
    match s.session.execute_unpaged(&s.insert, (key, body.as_ref())).await {
        Ok(_) => StatusCode::CREATED,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

async fn read(State(s): State<Arc<Statements>>, Path(key): Path<String>) -> Result<Vec<u8>, StatusCode> {
    let result = s.session.execute_unpaged(&s.select, (key,)).await.map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    let rows = result.into_rows_result().map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    let value: Option<(Vec<u8>,)> = rows.maybe_first_row().map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    value.map(|(v,)| v).ok_or(StatusCode::NOT_FOUND)
}

/// The plain service beside the bench's current-store, loaded with the
/// bench's pages (each title's HTML, as the service's first render of it).
pub struct PlainKv {
    pub base: String,
    pub pid: u32,
    _process: revstore_bench::Process,
}

impl PlainKv {
    pub async fn start(bench: &Bench) -> PlainKv {
        let mut cmd = std::process::Command::new(std::env::current_exe().expect("this bench's path"));
        cmd.args(["--serve-plain-kv", &bench.node, "--keyspace", &bench.keyspace]);
        let log = bench.dir.path().join("plain-kv.log");
        let (process, addresses) = revstore_bench::start_service(cmd, &log, &["plain-kv"]).await;
        let plain = PlainKv { base: format!("http://{}", addresses[0]), pid: process.pid(), _process: process };
        for (i, title) in bench.titles.iter().enumerate() {
            let html = bench.html[i % bench.html.len()].clone();
            let r = bench.http.put(plain.url(title)).body(html).send().await.expect("load the plain service");
            assert_eq!(r.status(), 201);
        }
        plain
    }

    pub fn url(&self, key: &str) -> String {
        format!("{}/kv/{key}", self.base)
    }
}
