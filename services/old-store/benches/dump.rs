//! old-store's history dump beside what a client has without it
//! and beside the decode limit, on the embedded engine or Cassandra.
//!
//! ```text
//! cargo bench -p revstore-old-store --bench dump -- [--engine embedded|cassandra] [--titles N] [--slices N]
//! ```
//! It archives `--titles` copies (default 16) of the Anarchism HTML history
//! through the real `revstore-old-store` binary, waits until every block is
//! compacted, then measures, in MB/s of raw HTML out:
//! 1. **per-revision API**: every revision fetched one by one
//!    (`GET /archive/html/{title}/{rev}`), `--slices` clients, each over its
//!    share of the titles — what a client has without a dump;
//! 2. **history dump**: `GET /dump/history?slice=K/N` for N = `--slices`
//!    (default 2) at once, unpaced (`--dump-revisions-per-second 0`), with the
//!    service's peak RSS;
//! 3. **decode limit** (embedded only): the service stopped, every sealed
//!    block's zstd frame decoded in this process, one after the other;
//! 4. **readers beside a dump**: one client reading random revisions, p99
//!    alone and while a dump at the default pace runs.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{DOMAIN, Service, arg};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let engine = arg("--engine").unwrap_or_else(|| "embedded".into());
    let titles: usize = arg("--titles").map_or(16, |s| s.parse().expect("--titles"));
    let slices: u32 = arg("--slices").map_or(2, |s| s.parse().expect("--slices"));
    let html = Arc::new(revstore_testdata::anarchism_html());
    let html_bytes = (titles * html.iter().map(String::len).sum::<usize>()) as f64;
    let revisions = titles * html.len();
    let dir = tempfile::tempdir().unwrap();
    let keyspace = format!("bench_dump_{}", std::process::id());
    let node = std::env::var("REVSTORE_CASSANDRA").unwrap_or_else(|_| "127.0.0.1:9042".into());
    let mut extra = vec!["--dump-revisions-per-second", "0"];
    if engine == "cassandra" {
        extra.extend(["--cassandra", &node, "--keyspace", &keyspace, "--migrate-on-start", "true"]);
    }
    let service = Arc::new(Service::start(dir.path(), &extra).await);
    println!("engine: {engine}; {titles} titles x {} revisions of Anarchism HTML ({:.1} MB)\n", html.len(), html_bytes / 1e6);

    let started = Instant::now();
    common::archive_copies(&service, titles, &html).await;
    service.at_rest().await;
    println!("archived and compacted in {:.1} s\n", started.elapsed().as_secs_f64());
    // Each measurement starts from a fresh process: no block decoded yet.
    let restart = async |service: Arc<Service>| {
        Arc::into_inner(service).unwrap().stop();
        Arc::new(Service::start(dir.path(), &extra).await)
    };
    let service = restart(service).await;

    println!("| measurement | revisions | seconds | MB/s of HTML | peak service RSS |\n|---|---|---|---|---|");
    // 1. The per-revision API.
    let started = Instant::now();
    let fetched = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..slices as usize)
        .map(|c| {
            let (service, fetched, count) = (service.clone(), fetched.clone(), html.len());
            tokio::spawn(async move {
                for t in (c..titles).step_by(slices as usize) {
                    for rev in 1..=count {
                        let url = format!("{}/{DOMAIN}/v1/archive/html/Title_{t}/{rev}", service.base);
                        let body = service.http.get(url).send().await.unwrap().bytes().await.unwrap();
                        fetched.fetch_add(body.len() as u64, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(fetched.load(Ordering::Relaxed) as f64, html_bytes);
    println!("| per-revision API, {slices} clients | {revisions} | {seconds:.2} | {:.0} | |", html_bytes / 1e6 / seconds);

    // 2. The history dump, `slices` at once.
    let service = restart(service).await;
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = tokio::spawn({
        let (peak, pid) = (peak.clone(), service.pid());
        async move {
            loop {
                if let Some(kib) = revstore_bench::procfs::status_kib(pid, "VmRSS:") {
                    peak.fetch_max(kib, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let started = Instant::now();
    let streams: Vec<_> = (0..slices)
        .map(|k| {
            let service = service.clone();
            tokio::spawn(async move {
                let url = format!("{}/{DOMAIN}/v1/dump/history?slice={k}/{slices}", service.base);
                let mut answer = service.http.get(url).send().await.unwrap();
                assert_eq!(answer.status(), 200);
                let mut lines = 0u64;
                // Count lines only: parsing the JSON here would measure the load generator.
                while let Some(chunk) = answer.chunk().await.unwrap() {
                    lines += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
                }
                lines - 1
            })
        })
        .collect();
    let mut lines = 0;
    for s in streams {
        lines += s.await.unwrap();
    }
    let seconds = started.elapsed().as_secs_f64();
    sampler.abort();
    assert_eq!(lines, revisions as u64, "the dump holds every revision once");
    println!(
        "| history dump, {slices} slices | {lines} | {seconds:.2} | **{:.0}** | {:.0} MB |",
        html_bytes / 1e6 / seconds,
        peak.load(Ordering::Relaxed) as f64 / 1024.0
    );
    Arc::into_inner(service).unwrap().stop();

    // 4. Readers beside a dump at the default pace: one client reading
    // random revisions (warm cache), alone, then while a dump runs.
    let paced: Vec<&str> = extra.iter().copied().skip(2).collect();
    let service = Arc::new(Service::start(dir.path(), &paced).await);
    let pick = {
        let html: Arc<Vec<Arc<[u8]>>> = Arc::new(html.iter().map(|h| Arc::from(h.as_bytes())).collect());
        move || {
            let (t, i) = (rand::random_range(0..titles), rand::random_range(0..html.len()));
            (format!("/{DOMAIN}/v1/archive/html/Title_{t}/{}", 1 + i), html[i].clone())
        }
    };
    common::random_reads(&service, 1, 1000, pick.clone()).await;
    let alone = common::random_reads(&service, 1, 2000, pick.clone()).await;
    let dumping = tokio::spawn({
        let service = service.clone();
        async move {
            let url = format!("{}/{DOMAIN}/v1/dump/history", service.base);
            let mut answer = service.http.get(url).send().await.unwrap();
            while answer.chunk().await.unwrap().is_some() {}
        }
    });
    let beside = common::random_reads(&service, 1, 2000, pick).await;
    let dump_still_running = !dumping.is_finished();
    dumping.await.unwrap();
    let p99 = |r: &common::Reads| common::percentile(&r.latencies, 0.99);
    println!(
        "\nreaders (1 client, random revisions), p99 alone {:.2} ms, beside a dump at the default pace {:.2} ms: **{:.2}x**{}",
        p99(&alone),
        p99(&beside),
        p99(&beside) / p99(&alone),
        if dump_still_running { "" } else { " (the dump ended before the readers did)" }
    );
    Arc::into_inner(service).unwrap().stop();

    // 3. The decode limit: the sealed frames, decoded here one after the other.
    if engine == "embedded" {
        decode_limit(dir.path()).await;
    } else {
        let cassandra = revstore_storage::CassandraEngine::connect(revstore_storage::CassandraOptions::new([node], keyspace.clone()))
            .await
            .expect("connect");
        cassandra.session().query_unpaged(format!("DROP KEYSPACE \"{keyspace}\""), ()).await.expect("drop the bench keyspace");
    }
}

async fn decode_limit(data_dir: &std::path::Path) {
    use revstore_schema::tables::old_store::{ARCHIVE_BLOCKS, col};
    let settings = revstore_storage::StorageSettings::Embedded { data_dir: data_dir.to_owned(), options: Default::default() };
    let store = revstore_storage::open(settings).await.expect("open the data");
    let query = revstore_storage::ScanQuery::new(&ARCHIVE_BLOCKS, 100).statics([col::SEALED, col::BASE_BLOCK]);
    let partitions: Vec<_> = futures_util::TryStreamExt::try_collect(store.partitions(query)).await.expect("scan");
    let frames: Vec<Vec<u8>> = partitions
        .iter()
        .filter_map(|p| p.statics.as_ref())
        // Standing alone (undecided, or an anchor: -1); a block on a base needs its base's revision first.
        .filter(|s| s.bigint(col::BASE_BLOCK).is_none_or(|b| b < 0))
        .filter_map(|s| s.blob(col::SEALED).map(<[u8]>::to_vec))
        .collect();
    // Parsed and read as the archive reads a standing-alone block: the whole frame.
    let settings = revstore_codecs::BlockSettings::default();
    let started = Instant::now();
    let mut decoded = 0u64;
    for frame in &frames {
        let reader = revstore_codecs::BlockReader::parse(frame, &settings).expect("a block");
        decoded += reader.read_all().expect("decode").iter().map(|(_, content)| content.len() as u64).sum::<u64>();
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "| decode limit: {} sealed blocks decoded in-process, one after the other | | {seconds:.2} | {:.0} (block bytes: the HTML and each entry's part header) | |",
        frames.len(),
        decoded as f64 / 1e6 / seconds
    );
}
