//! `revstore-import-dump`: loads a MediaWiki XML history dump into old-store.
//!
//! ```text
//! revstore-import-dump --old-store-url http://127.0.0.1:8082 --token-file token aawiki-...-pages-meta-history.xml.7z
//! revstore-import-dump --old-store-url http://127.0.0.1:8082 --verify aawiki-...-pages-meta-history.xml.7z
//! ```
//! Exit status: 0 when every revision was archived (or, with `--verify`, read
//! back identical); 1 when some were not; 66 when the dump cannot be read;
//! 64 on bad arguments.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use revstore_client::{ClientOptions, HttpClient, OldStoreClient};
use revstore_dump_import::{ImportOptions, Mode, run_import};

#[derive(Debug, Parser)]
#[command(name = "revstore-import-dump", version, about = "Import a MediaWiki XML history dump (.xml or .7z) into old-store")]
struct Args {
    /// The dump: `pages-meta-history` XML, plain or in a 7z archive.
    dump: PathBuf,

    /// old-store's base URL.
    #[arg(long, env = "REVSTORE_OLD_STORE_URL", default_value = "http://127.0.0.1:8082")]
    old_store_url: String,

    /// File with a write token of old-store.
    #[arg(long, env = "REVSTORE_PEER_TOKEN_FILE")]
    token_file: Option<PathBuf>,

    /// The wiki's domain (default: from the dump's siteinfo).
    #[arg(long)]
    domain: Option<String>,

    /// Pages written at the same time.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=256))]
    writers: u64,

    /// Read every revision back and compare it with the dump, instead of importing.
    #[arg(long)]
    verify: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let token = match &args.token_file {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(t) => Some(t.trim().to_owned()),
            Err(e) => {
                eprintln!("revstore-import-dump: cannot read {}: {e}", path.display());
                return ExitCode::from(66);
            }
        },
        None => None,
    };
    let options = ClientOptions { token, timeout: Duration::from_secs(60), ..ClientOptions::default() };
    let client = match HttpClient::new(&args.old_store_url, options) {
        Ok(c) => OldStoreClient::new(c),
        Err(e) => {
            eprintln!("revstore-import-dump: --old-store-url: {e}");
            return ExitCode::from(64);
        }
    };
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {msg} [{bar:40}] {binary_bytes}/{binary_total_bytes} of XML, {binary_bytes_per_sec}, eta {eta}",
        )
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
    };
    let summary = match run_import(client, options, progress).await {
        Ok(s) => s,
        Err(e) => {
            bar.abandon();
            eprintln!("revstore-import-dump: {}: {e}", args.dump.display());
            return ExitCode::from(66);
        }
    };
    bar.finish_and_clear();
    eprintln!("{summary}");
    let bad = summary.failed.load(Ordering::Relaxed) + summary.mismatched.load(Ordering::Relaxed);
    if bad > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS }
}
