//! The bench's churn phase, on Cassandra (`--churn-pages N`, with
//! `--churn-renders R`, default 60, at `--churn-rate`, default 200/s): N hot
//! pages each rendered R times through the service, a new revision every
//! third render; then (after `nodetool flush` when `--nodetool CMD` is given)
//! every page's reads traced — the latest, a superseded render by revision
//! and by tid — with the live rows and
//! tombstones each met, and each table's size on disk.

#![allow(clippy::print_stdout)]

use std::process::Command;
use std::sync::Arc;

use revstore_bench::{arg, open_loop};
use scylla::client::session::Session;

use super::trace::{ReadCost, traced_read};
use super::writes::plain_kv;
use super::{Bench, body, put_render, write_row};

/// The churn's row of the results table, and the rows of what the reads met
/// (none when the phase does not run: on the embedded engine, or without `--churn-pages`).
pub async fn measure(bench: &Bench) -> (Option<String>, Vec<String>) {
    let churn_pages: u64 = arg("--churn-pages").map_or(0, |n| n.parse().expect("--churn-pages"));
    if bench.engine != "cassandra" || churn_pages == 0 {
        return (None, Vec::new());
    }
    let per_page: u64 = arg("--churn-renders").map_or(60, |n| n.parse().expect("--churn-renders"));
    let churn_rate: u64 = arg("--churn-rate").map_or(200, |n| n.parse().expect("--churn-rate"));
    let titles: Arc<Vec<String>> = Arc::new((0..churn_pages).map(|i| format!("Churn_page_{i}")).collect());
    let writes = churn_pages * per_page;
    // Write i is render i / pages of page i % pages; every third render of a page is a new revision.
    let page_and_rev = move |i: u64| ((i % churn_pages) as usize, 1 + i / churn_pages / 3);
    let run = open_loop(churn_rate, writes.div_ceil(churn_rate), {
        let (http, base, titles, html) = (bench.http.clone(), bench.base.clone(), titles.clone(), bench.html.clone());
        move |i| {
            let (http, base, titles, html) = (http.clone(), base.clone(), titles.clone(), html.clone());
            async move {
                if i >= writes {
                    return true;
                }
                let (p, rev) = page_and_rev(i);
                put_render(&http, &base, &titles[p], rev, &body(&html[i as usize % html.len()], rev)).await
            }
        }
    })
    .await;
    let row = write_row(&bench.engine, &format!("churn: {churn_pages} pages x {per_page} renders, the service"), &run, "");
    let keyspace = &bench.keyspace;
    if let Some(nodetool) = arg("--nodetool") {
        let flushed = Command::new("sh").arg("-c").arg(format!("{nodetool} flush {keyspace}")).status().expect("nodetool");
        assert!(flushed.success(), "nodetool flush failed");
    }
    let session = plain_kv(&bench.node, keyspace).await;
    let mut traced = traced_reads(&session, keyspace, &titles).await;
    let disk = session
        .query_unpaged("SELECT table_name, mebibytes FROM system_views.disk_usage WHERE keyspace_name = ?", (keyspace,))
        .await
        .expect("disk usage");
    for table in disk.into_rows_result().expect("rows").rows::<(String, i64)>().expect("typed").flatten() {
        traced.push(format!("| on disk: {} | {} MiB (all pages of the bench) | | |", table.0, table.1));
    }
    if let Some(nodetool) = arg("--nodetool") {
        let out =
            Command::new("sh").arg("-c").arg(format!("{nodetool} tablehistograms {keyspace} page_renders")).output().expect("nodetool");
        println!("tablehistograms page_renders:\n{}", String::from_utf8_lossy(&out.stdout));
    }
    (Some(row), traced)
}

/// Prints what the churned pages' reads met.
pub fn print(traced: Vec<String>) {
    if traced.is_empty() {
        return;
    }
    println!(
        "\nreads after the churn, traced (per read: mean live rows; tombstones mean / max)\n| read | reads | live rows | tombstones |\n|---|---|---|---|"
    );
    for r in traced {
        println!("{r}");
    }
}

/// Every churned page's reads, traced, in `page_renders`: the latest render,
/// and the newest superseded render by revision and by tid (a write reads
/// nothing). A row per read: mean live rows, mean and max tombstones.
async fn traced_reads(session: &Session, keyspace: &str, titles: &[String]) -> Vec<String> {
    let prepare = |cql: String| async move { session.prepare(cql).await.expect("prepare a traced read") };
    let table = format!("\"{keyspace}\".page_renders");
    let latest = prepare(format!("SELECT tid, html FROM {table} WHERE domain = ? AND title = ? LIMIT 1")).await;
    let keys_of = prepare(format!("SELECT rev, tid FROM {table} WHERE domain = ? AND title = ? LIMIT 2")).await;
    let of_rev = prepare(format!("SELECT tid, html FROM {table} WHERE domain = ? AND title = ? AND rev = ? LIMIT 1")).await;
    let by_tid = prepare(format!("SELECT html FROM {table} WHERE domain = ? AND title = ? AND rev = ? AND tid = ?")).await;
    let kinds = ["latest", "superseded, by revision", "superseded, by tid"];
    let mut service = vec![Vec::<ReadCost>::new(); kinds.len()];
    let domain = "en.wikipedia.org";
    for title in titles {
        let keys = session.execute_unpaged(&keys_of, (domain, title)).await.expect("renders").into_rows_result().expect("rows");
        let keys: Vec<(i64, scylla::value::CqlTimeuuid)> = keys.rows().expect("typed").flatten().collect();
        if let Some(&(rev, tid)) = keys.get(1) {
            let costs = [
                traced_read(session, &latest, (domain, title)).await.expect("trace"),
                traced_read(session, &of_rev, (domain, title, rev)).await.expect("trace"),
                traced_read(session, &by_tid, (domain, title, rev, tid)).await.expect("trace"),
            ];
            for (k, cost) in costs.into_iter().enumerate() {
                service[k].push(cost);
            }
        }
    }
    kinds
        .iter()
        .zip(service.iter())
        .map(|(kind, costs)| {
            let n = costs.len().max(1) as f64;
            format!(
                "| {kind} | {} | {:.1} | {:.1} / {} |",
                costs.len(),
                costs.iter().map(|c| c.live_rows).sum::<u64>() as f64 / n,
                costs.iter().map(|c| c.tombstones).sum::<u64>() as f64 / n,
                costs.iter().map(|c| c.tombstones).max().unwrap_or(0)
            )
        })
        .collect()
}
