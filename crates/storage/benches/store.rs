//! Storage benchmark: point writes, point reads, 100-row partition scans and
//! range deletes, with 2 KiB and 100 KiB values of real page HTML, on each engine
//! asked for, side by side in one run. Then one large partition of small rows
//! (200,000 at scale 1, the shape of a template's dependents), written in
//! batches and read back a page of 1,000 rows at a time with page tokens.
//!
//! ```text
//! cargo bench -p revstore-storage --bench store -- [--engines embedded,cassandra] [--scale F]
//! ```
//! The Cassandra engine uses the node at `$REVSTORE_CASSANDRA` (default
//! `127.0.0.1:9042`, as `deploy/cassandra/cassandra-local start` runs it), in a
//! keyspace of its own that is dropped afterwards.
//! `--scale` multiplies the operation counts (default 1.0; 0.1 for a quick look).
//! Values are windows of the Anarchism article's Parsoid HTML history from
//! `$REVSTORE_SHARED_DATA` (default `../shared/data` beside the checkout).
//! Output: a Markdown table for BENCHMARKS.md.

// The report on stdout is what this binary is for.
#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use revstore_schema::model::ColumnType::{BigInt, Blob, Text};
use revstore_schema::{Column as C, Compaction, Order, TableDef};
use revstore_storage::{
    CassandraEngine, CassandraOptions, Delete, EmbeddedEngine, EmbeddedOptions, ReadQuery, Slice, Store, Upsert, Value,
};

static BENCH_KV: TableDef = TableDef {
    name: "bench_kv",
    columns: &[C::partition("k", Text), C::regular("v", Blob)],
    default_ttl: None,
    compaction: Compaction::SizeTiered,
    comment: "storage benchmark",
};

static BENCH_ROWS: TableDef = TableDef {
    name: "bench_rows",
    columns: &[C::partition("p", Text), C::clustering("c", BigInt, Order::Asc), C::regular("v", Blob)],
    default_ttl: None,
    compaction: Compaction::SizeTiered,
    comment: "storage benchmark",
};

/// Many small rows in one partition, as the dependency graph keeps a
/// template's dependents.
static BENCH_WIDE: TableDef = TableDef {
    name: "bench_wide",
    columns: &[C::partition("p", Text), C::clustering("title", Text, Order::Asc), C::regular("kind", Text)],
    default_ttl: None,
    compaction: Compaction::SizeTiered,
    comment: "storage benchmark",
};

const CONCURRENCY: usize = 32;
const ROWS_PER_PARTITION: i64 = 100;
const WIDE_BATCH: usize = 100;
const WIDE_PAGE: u32 = 1000;

/// Real HTML, cut into values of one size at varying offsets.
struct Payloads(Vec<u8>);

impl Payloads {
    fn load() -> Payloads {
        Payloads(revstore_testdata::anarchism_html().concat().into_bytes())
    }

    fn value(&self, i: usize, size: usize) -> Vec<u8> {
        let start = (i.wrapping_mul(7919)) % (self.0.len() - size);
        self.0[start..start + size].to_vec()
    }
}

struct Measurement {
    engine: &'static str,
    operation: &'static str,
    value_size: usize,
    latencies: Vec<Duration>,
    elapsed: Duration,
    bytes: usize,
}

impl Measurement {
    fn row(&self) -> String {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        let pct = |p: f64| sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)].as_secs_f64() * 1e3;
        let secs = self.elapsed.as_secs_f64();
        format!(
            "| {} | {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.1} |",
            self.engine,
            self.operation,
            if self.value_size >= 1024 { format!("{} KiB", self.value_size / 1024) } else { format!("{} B", self.value_size) },
            sorted.len(),
            sorted.len() as f64 / secs,
            pct(0.50),
            pct(0.99),
            self.bytes as f64 / secs / 1e6
        )
    }
}

/// Runs `op(i)` for i in 0..n from `concurrency` tasks, timing each call.
async fn timed<F, Fut>(n: usize, concurrency: usize, op: F) -> (Vec<Duration>, Duration)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = t;
            while i < n {
                let begun = Instant::now();
                op(i).await;
                latencies.push(begun.elapsed());
                i += concurrency;
            }
            latencies
        }));
    }
    let mut all = Vec::with_capacity(n);
    for t in tasks {
        all.extend(t.await.expect("bench task"));
    }
    (all, started.elapsed())
}

async fn bench_engine(engine: &'static str, store: Store, payloads: Arc<Payloads>, scale: f64, out: &mut Vec<Measurement>) {
    store.ensure_tables(&[&BENCH_KV, &BENCH_ROWS, &BENCH_WIDE]).await.expect("tables");
    for value_size in [2 * 1024, 100 * 1024] {
        let n = |base: usize| ((base as f64 * scale) as usize).max(CONCURRENCY);
        let (writes, reads, partitions) = if value_size <= 4096 { (n(4000), n(20_000), n(200)) } else { (n(800), n(4000), n(40)) };
        let key = move |i: usize| Value::from(format!("{value_size}-{i}"));

        for (operation, concurrency, offset) in [("point write, 1 writer", 1, 0), ("point write, 32 writers", CONCURRENCY, writes)] {
            let (s, p) = (store.clone(), payloads.clone());
            let (latencies, elapsed) = timed(writes, concurrency, move |i| {
                let (s, v) = (s.clone(), p.value(i, value_size));
                async move { s.write(Upsert::new(&BENCH_KV, [key(offset + i)]).set("v", v)).await.expect("write") }
            })
            .await;
            out.push(Measurement { engine, operation, value_size, latencies, elapsed, bytes: writes * value_size });
        }
        for (operation, concurrency) in [("point read, 1 reader", 1), ("point read, 32 readers", CONCURRENCY)] {
            let s = store.clone();
            let (latencies, elapsed) = timed(reads, concurrency, move |i| {
                let s = s.clone();
                async move {
                    let k = (i.wrapping_mul(2_654_435_761)) % (2 * writes);
                    let row = s.get(&BENCH_KV, vec![key(k)], None).await.expect("read").expect("row exists");
                    assert_eq!(row.blob("v").map(<[u8]>::len), Some(value_size));
                }
            })
            .await;
            out.push(Measurement { engine, operation, value_size, latencies, elapsed, bytes: reads * value_size });
        }

        let part = move |i: usize| Value::from(format!("{value_size}-part-{i}"));
        for i in 0..partitions {
            let rows: Vec<_> = (0..ROWS_PER_PARTITION)
                .map(|c| {
                    Upsert::new(&BENCH_ROWS, [part(i), Value::from(c)]).set("v", payloads.value(i * 100 + c as usize, value_size)).into()
                })
                .collect();
            for chunk in rows.chunks(10) {
                store.apply(chunk.to_vec()).await.expect("setup batch");
            }
        }
        let s = store.clone();
        let (latencies, elapsed) = timed(partitions, 1, move |i| {
            let s = s.clone();
            async move {
                let page = s.read(&ReadQuery::new(&BENCH_ROWS, [part(i)])).await.expect("scan");
                assert_eq!(page.rows.len(), ROWS_PER_PARTITION as usize);
            }
        })
        .await;
        out.push(Measurement {
            engine,
            operation: "100-row partition scan",
            value_size,
            latencies,
            elapsed,
            bytes: partitions * ROWS_PER_PARTITION as usize * value_size,
        });
        let s = store.clone();
        let (latencies, elapsed) = timed(partitions, 1, move |i| {
            let s = s.clone();
            async move {
                let half = Slice::all().upper(std::ops::Bound::Excluded(Value::from(ROWS_PER_PARTITION / 2)));
                s.write(Delete::range(&BENCH_ROWS, [part(i)], half)).await.expect("range delete");
            }
        })
        .await;
        out.push(Measurement { engine, operation: "range delete, 50 of 100 rows", value_size, latencies, elapsed, bytes: 0 });
    }
    wide_partition(engine, store, scale, out).await;
}

/// One partition of `200,000 x scale` rows (a title and a short text, ~40
/// bytes): batches of 100 written by one writer, then the whole partition
/// read a page at a time, each page resuming from the previous one's token.
async fn wide_partition(engine: &'static str, store: Store, scale: f64, out: &mut Vec<Measurement>) {
    let rows = ((200_000.0 * scale) as usize).max(WIDE_BATCH);
    let row_bytes = 40;
    let title = |i: usize| format!("Dependent_page_{:09}", (i.wrapping_mul(2_654_435_761)) % 1_000_000_007);
    let s = store.clone();
    let (latencies, elapsed) = timed(rows / WIDE_BATCH, 1, move |b| {
        let s = s.clone();
        async move {
            let writes = (b * WIDE_BATCH..(b + 1) * WIDE_BATCH)
                .map(|i| Upsert::new(&BENCH_WIDE, [Value::from("template"), Value::from(title(i))]).set("kind", "transclusion").into())
                .collect();
            s.apply(writes).await.expect("wide batch");
        }
    })
    .await;
    out.push(Measurement {
        engine,
        operation: "wide partition: write a batch of 100 rows",
        value_size: row_bytes,
        latencies,
        elapsed,
        bytes: rows * row_bytes,
    });

    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut token = None;
    let mut seen = 0;
    loop {
        let begun = Instant::now();
        let page = store
            .read(&ReadQuery::new(&BENCH_WIDE, [Value::from("template")]).limit(WIDE_PAGE).page_token(token))
            .await
            .expect("wide page");
        latencies.push(begun.elapsed());
        seen += page.rows.len();
        token = page.next;
        if token.is_none() {
            break;
        }
    }
    assert_eq!(seen, rows, "paging lost or repeated rows");
    out.push(Measurement {
        engine,
        operation: "wide partition: read a page of 1000 rows",
        value_size: row_bytes,
        latencies,
        elapsed: started.elapsed(),
        bytes: rows * row_bytes,
    });
}

fn open_embedded() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = EmbeddedEngine::open(dir.path(), EmbeddedOptions::default()).expect("open embedded engine");
    (Store::new(Arc::new(engine)), dir)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let engines = flag("--engines").unwrap_or_else(|| "embedded".into());
    let scale: f64 = flag("--scale").map(|s| s.parse().expect("--scale takes a number")).unwrap_or(1.0);
    let payloads = Arc::new(Payloads::load());
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let mut results = Vec::new();
    runtime.block_on(async {
        for engine in engines.split(',') {
            match engine {
                "embedded" => {
                    let (store, _dir) = open_embedded();
                    bench_engine("embedded", store, payloads.clone(), scale, &mut results).await;
                }
                "cassandra" => {
                    let node = std::env::var("REVSTORE_CASSANDRA").unwrap_or_else(|_| "127.0.0.1:9042".into());
                    let keyspace = format!("bench_{}", std::process::id());
                    let engine = Arc::new(
                        CassandraEngine::connect(CassandraOptions::new([node.clone()], keyspace.clone()))
                            .await
                            .unwrap_or_else(|e| panic!("cannot reach Cassandra at {node}: {e}")),
                    );
                    bench_engine("cassandra", Store::new(engine.clone()), payloads.clone(), scale, &mut results).await;
                    engine.session().query_unpaged(format!("DROP KEYSPACE \"{keyspace}\""), ()).await.expect("drop the bench keyspace");
                }
                other => panic!("unknown engine {other:?}: choose from embedded, cassandra"),
            }
        }
    });
    let mut report =
        String::from("| engine | operation | value | ops | ops/s | p50 ms | p99 ms | MB/s |\n|---|---|---|---|---|---|---|---|\n");
    for m in &results {
        report.push_str(&m.row());
        report.push('\n');
    }
    print!("{report}");
}
