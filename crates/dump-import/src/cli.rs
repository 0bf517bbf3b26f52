//! `revstore import`: the command line of an import, its token, its progress
//! bar and its exit status.
//!
//! ```text
//! revstore import aawiki-20260101-pages-meta-history.xml.7z
//! revstore import --verify aawiki-20260101-pages-meta-history.xml.7z
//! ```
//! Exit status: 0 when every revision and dependency set was written (or,
//! with `--verify`, read back identical); 1 when some were not; 66 when the
//! dump or the token cannot be read; 64 on bad arguments.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use revstore_client::{ClientOptions, GraphClient, HttpClient, OldStoreClient};

use crate::dump::{Limits, check_export};
use crate::{Dependencies, ImportOptions, Mode, run_import};

#[derive(Debug, Clone, clap::Args)]
pub struct ImportArgs {
    /// The dump: `pages-meta-history` XML, plain, in a 7z archive, or compressed with bzip2 or gzip.
    pub dump: PathBuf,

    /// old-store's base URL.
    #[arg(long, env = "REVSTORE_OLD_STORE_URL", default_value = "http://127.0.0.1:8082")]
    pub old_store_url: String,

    /// The dependency graph's base URL.
    #[arg(long, env = "REVSTORE_GRAPH_URL", default_value = "http://127.0.0.1:8083")]
    pub graph_url: String,

    /// Import revisions only: write no dependency sets to the graph.
    #[arg(long)]
    pub no_dependencies: bool,

    /// The priority of every page → template edge written (0 pull … 1000 push).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(0..=revstore_api::graph::MAX_PRIORITY))]
    pub template_priority: i64,

    /// Token file: the import sends its first token (else `REVSTORE_WRITE_TOKENS`' first
    /// token, else DATA_DIR/write-token as `revstore up` keeps it).
    #[arg(long, env = "REVSTORE_WRITE_TOKENS_FILE")]
    pub write_tokens_file: Option<PathBuf>,

    /// The data directory of `revstore up`, where its write token is.
    #[arg(long, env = "REVSTORE_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,

    /// The wiki's domain (default: from the dump's siteinfo).
    #[arg(long)]
    pub domain: Option<String>,

    /// The largest revision text taken, in bytes (old-store's body limit,
    /// REVSTORE_BODY_LIMIT_BYTES, 32 MiB by default, bounds what it accepts);
    /// a larger one is skipped, said, and never held whole.
    #[arg(long, default_value_t = 30 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1024..=1024 * 1024 * 1024))]
    pub max_revision_bytes: u64,

    /// The most templates one page's dependency set may have (the graph's
    /// REVSTORE_GRAPH_MAX_EDGES); a page with more keeps the first.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_edges: u64,

    /// Pages written at the same time.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub writers: u64,

    /// Read every revision and dependency set back and compare it with the dump, instead of importing.
    #[arg(long)]
    pub verify: bool,
}

/// The write token: the file named, else `REVSTORE_WRITE_TOKENS`' first, else
/// the data directory's; `None` when there is none (a read-only `--verify`).
fn write_token(args: &ImportArgs) -> Result<Option<String>, String> {
    use revstore_client::tokens::{parse_token_list, read_peer_token};
    if let Some(path) = &args.write_tokens_file {
        return read_peer_token(path, "write token").map(Some).map_err(|e| e.to_string());
    }
    if let Ok(list) = std::env::var("REVSTORE_WRITE_TOKENS")
        && let Some(token) = parse_token_list(&list, "write token").map_err(|e| e.to_string())?.into_iter().next()
    {
        return Ok(Some(token));
    }
    let kept = args.data_dir.join("write-token");
    if kept.exists() { read_peer_token(&kept, "write token").map(Some).map_err(|e| e.to_string()) } else { Ok(None) }
}

/// Runs `revstore import` and says how it went, as an exit status.
pub async fn run(args: ImportArgs) -> ExitCode {
    let token = match write_token(&args) {
        Ok(Some(token)) => Some(token),
        Ok(None) if args.verify => None,
        Ok(None) => {
            eprintln!(
                "revstore import: no write token: set REVSTORE_WRITE_TOKENS or --write-tokens-file, or pass the --data-dir of `revstore up`"
            );
            return ExitCode::from(66);
        }
        Err(e) => {
            eprintln!("revstore import: {e}");
            return ExitCode::from(66);
        }
    };
    let options = ClientOptions { token, timeout: Duration::from_secs(60), ..ClientOptions::default() };
    let client = |url: &str, name: &str| {
        HttpClient::new(url, options.clone()).map_err(|e| {
            eprintln!("revstore import: {name}: {e}");
            ExitCode::from(64)
        })
    };
    let old_store = match client(&args.old_store_url, "--old-store-url") {
        Ok(http) => OldStoreClient::new(http),
        Err(code) => return code,
    };
    let dependencies = if args.no_dependencies {
        None
    } else {
        match client(&args.graph_url, "--graph-url") {
            Ok(http) => {
                Some(Dependencies { graph: GraphClient::new(http), priority: args.template_priority, max_edges: args.max_edges as usize })
            }
            Err(code) => return code,
        }
    };
    // Before anything is sent: the dump is one, and the services answer. A
    // wrong file or a service down is one line now, not an hour of failures.
    let dump = args.dump.clone();
    match tokio::task::spawn_blocking(move || check_export(&dump)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            eprintln!("revstore import: {}: {e}", args.dump.display());
            return ExitCode::from(66);
        }
        Err(e) => {
            eprintln!("revstore import: {e}");
            return ExitCode::from(70);
        }
    }
    let mut services = vec![("old-store", old_store.base_url().to_owned())];
    if let Some(dependencies) = &dependencies {
        services.push(("dependency-graph", dependencies.graph.base_url().to_owned()));
    }
    for (name, url) in services {
        if let Err(e) = ready(&url).await {
            eprintln!("revstore import: {name} at {url} is not ready ({e}); start it first (revstore up)");
            return ExitCode::from(69);
        }
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{bar:40}] {binary_bytes}/{binary_total_bytes}, {binary_bytes_per_sec}, eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(if args.verify { "verifying" } else { "importing" });
    let progress_bar = bar.clone();
    let progress = move |read: u64, total: Option<u64>| {
        if let Some(total) = total {
            progress_bar.set_length(total);
        }
        progress_bar.set_position(read);
    };
    let options = ImportOptions {
        dump: args.dump.clone(),
        domain: args.domain.clone(),
        writers: args.writers as usize,
        mode: if args.verify { Mode::Verify } else { Mode::Import },
        dependencies,
        limits: Limits { max_text_bytes: args.max_revision_bytes as usize },
    };
    let summary = match run_import(old_store, options, progress).await {
        Ok(s) => s,
        Err(e) => {
            bar.abandon();
            eprintln!("revstore import: {}: {e}", args.dump.display());
            return ExitCode::from(66);
        }
    };
    bar.finish_and_clear();
    eprintln!("{summary}");
    let bad = summary.failed.load(Ordering::Relaxed) + summary.mismatched.load(Ordering::Relaxed);
    if bad > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS }
}

/// Whether the service at `url` answers `/readyz` with 200, within seconds.
async fn ready(url: &str) -> Result<(), String> {
    let options = ClientOptions { timeout: Duration::from_secs(10), retries: 1, ..ClientOptions::default() };
    let http = HttpClient::new(url, options).map_err(|e| e.to_string())?;
    http.send(http::Method::GET, "/readyz", http::HeaderMap::new(), None)
        .await
        .map(|_| ())
        .map_err(|e| crate::dump::cut(&e.to_string(), 300))
}
