//! `revstore dump`: a whole domain's current renders, or its archived
//! revisions, as the HTML dumps wikis publish them — NDJSON, one object per
//! page (or revision), zstd-compressed, in shards fetched in parallel, with a
//! manifest.
//!
//! ```text
//! revstore dump --current --domain en.wikipedia.org --out dumps/ --parallel 4
//! revstore dump --history --domain en.wikipedia.org --out dumps/ --parallel 4 --parts html,wikitext
//! revstore dump --current --domain en.wikipedia.org --out dumps/ --parallel 4 --resume
//! ```
//! Shard K of N (`D-<date>-<kind>-<K>-of-<N>.ndjson.zst`, K from 0, kind
//! `current` or `history`) holds slice K/N of current-store's `/dump/current`
//! or old-store's `/dump/history`. Every `--checkpoint-every` lines a shard's
//! zstd frame is closed, the file synced, and the last line's cursor recorded
//! beside it (`….state.json`); a dump killed and run again with `--resume`
//! cuts each shard back to its last checkpoint and continues from that
//! cursor (zstd frames concatenate), so the shards hold every line once. A
//! stream cut short is resumed the same way, a few times, before the dump
//! gives up. At the end: the manifest (`D-<date>-<kind>-manifest.json`: per
//! shard its lines, bytes of NDJSON, bytes on disk and SHA-256) and a
//! summary line.
//!
//! `--format enterprise` also packs the complete shards into the layout of
//! the Wikimedia Enterprise HTML dumps (`crate::enterprise`): per namespace a
//! `<dbname>-NS<n>-<date>-ENTERPRISE-HTML.json.tar.gz` of article objects,
//! listed in the manifest.
//!
//! Exit status: 0 when every shard is complete; 1 when some could not be;
//! 64 on bad arguments (or shards of another run in the way without `--resume`).

use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, clap::Args)]
pub struct DumpArgs {
    /// Dump the latest render of every page (from current-store).
    #[arg(long, conflicts_with = "history", required_unless_present = "history")]
    pub current: bool,

    /// Dump every archived revision of every page (from old-store).
    #[arg(long)]
    pub history: bool,

    /// The wiki's domain.
    #[arg(long)]
    pub domain: String,

    /// The directory the shards and the manifest are written to.
    #[arg(long)]
    pub out: PathBuf,

    /// Slices dumped at once; also the number of shards.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: u32,

    /// Parts of each line: html, data-parsoid, section-offsets, wikitext (history only), comma-separated, or all [default: html; with --format enterprise, html,wikitext for --history].
    #[arg(long)]
    pub parts: Option<String>,

    /// What is written: ndjson, the NDJSON shards; enterprise, also the Enterprise layout (per namespace a .json.tar.gz of articles, built from the shards).
    #[arg(long, value_enum, default_value_t = Format::Ndjson, hide_possible_values = true)]
    pub format: Format,

    /// The wiki's database name in Enterprise articles and file names (default: from the domain, en.wikipedia.org: enwiki).
    #[arg(long)]
    pub dbname: Option<String>,

    /// The wiki's language code in Enterprise articles (default: from the domain, en.wikipedia.org: en).
    #[arg(long)]
    pub language: Option<String>,

    /// Continue the dump of the same domain, date and --parallel from its checkpoints.
    #[arg(long)]
    pub resume: bool,

    /// The date in the shards' names (default: today, UTC), YYYYMMDD.
    #[arg(long)]
    pub date: Option<String>,

    /// current-store's base URL (for --current).
    #[arg(long, env = "REVSTORE_CURRENT_STORE_URL", default_value = "http://127.0.0.1:8081")]
    pub current_store_url: String,

    /// old-store's base URL (for --history).
    #[arg(long, env = "REVSTORE_OLD_STORE_URL", default_value = "http://127.0.0.1:8082")]
    pub old_store_url: String,

    /// A file whose first token is sent as the read token (when reads need one).
    #[arg(long, env = "REVSTORE_READ_TOKEN_FILE")]
    pub read_token_file: Option<PathBuf>,

    /// Lines (pages or revisions) between checkpoints of a shard.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub checkpoint_every: u64,
}

/// The layouts `revstore dump` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// zstd-compressed NDJSON shards, one per slice.
    Ndjson,
    /// The shards, then per namespace a tarball in the Wikimedia Enterprise HTML dump layout.
    Enterprise,
}

impl DumpArgs {
    /// The parts each line asks for.
    fn parts(&self) -> String {
        match (&self.parts, self.format, self.history) {
            (Some(parts), _, _) => parts.clone(),
            (None, Format::Enterprise, true) => "html,wikitext".to_owned(),
            (None, _, _) => "html".to_owned(),
        }
    }

    /// `current` or `history`, the service that serves it, and its dump URL.
    fn kind(&self) -> (&'static str, &'static str, String) {
        match self.history {
            true => ("history", "old-store", format!("{}/{}/v1/dump/history", self.old_store_url.trim_end_matches('/'), self.domain)),
            false => {
                ("current", "current-store", format!("{}/{}/v1/dump/current", self.current_store_url.trim_end_matches('/'), self.domain))
            }
        }
    }
}

/// What a shard's checkpoint records: enough to cut the file back to it and
/// go on from the page after it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
struct Checkpoint {
    /// The cursor of the last line written (`None`: from the slice's start).
    cursor: Option<String>,
    lines: u64,
    /// NDJSON bytes written (uncompressed).
    raw_bytes: u64,
    /// Bytes of the shard file at the checkpoint.
    file_bytes: u64,
    done: bool,
}

#[derive(Debug, Serialize)]
struct ManifestShard {
    file: String,
    slice: String,
    lines: u64,
    raw_bytes: u64,
    bytes: u64,
    sha256: String,
}

#[derive(Debug, Serialize)]
struct Manifest {
    domain: String,
    date: String,
    kind: &'static str,
    parts: String,
    slices: u32,
    lines: u64,
    raw_bytes: u64,
    bytes: u64,
    shards: Vec<ManifestShard>,
    /// With `--format enterprise`: the tarballs, one per namespace.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    enterprise: Vec<ManifestTarball>,
}

#[derive(Debug, Serialize)]
struct ManifestTarball {
    #[serde(flatten)]
    tarball: crate::enterprise::Tarball,
    bytes: u64,
    sha256: String,
}

/// A line of the service's dump stream, read for its cursor or end only.
#[derive(Debug, Deserialize)]
struct StreamLine {
    cursor: Option<String>,
    done: Option<bool>,
}

/// Attempts at a slice whose stream is cut short before the dump gives up.
const ATTEMPTS: u32 = 5;

// The summary line is the command's result: it goes to stdout, errors to stderr.
#[allow(clippy::print_stdout)]
pub async fn run(args: DumpArgs) -> ExitCode {
    match dump(&args).await {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(DumpError::Usage(e)) => {
            eprintln!("revstore dump: {e}");
            ExitCode::from(64)
        }
        Err(DumpError::Failed(e)) => {
            eprintln!("revstore dump: {e}");
            ExitCode::from(1)
        }
    }
}

#[derive(Debug)]
enum DumpError {
    Usage(String),
    Failed(String),
}

async fn dump(args: &DumpArgs) -> Result<String, DumpError> {
    revstore_keys::Domain::parse(&args.domain).map_err(|e| DumpError::Usage(e.to_string()))?;
    let date = match &args.date {
        Some(d) if d.len() == 8 && d.bytes().all(|b| b.is_ascii_digit()) => d.clone(),
        Some(d) => return Err(DumpError::Usage(format!("--date {d:?} is not YYYYMMDD"))),
        None => revstore_keys::rfc3339(std::time::SystemTime::now())[..10].replace('-', ""),
    };
    let wiki = match args.format {
        Format::Enterprise => {
            Some(crate::enterprise::Wiki::of(&args.domain, args.dbname.as_deref(), args.language.as_deref()).map_err(DumpError::Usage)?)
        }
        Format::Ndjson => None,
    };
    let parts = args.parts();
    let token = match &args.read_token_file {
        Some(path) => Some(revstore_client::tokens::read_peer_token(path, "read token").map_err(|e| DumpError::Usage(e.to_string()))?),
        None => None,
    };
    std::fs::create_dir_all(&args.out).map_err(|e| DumpError::Usage(format!("{}: {e}", args.out.display())))?;
    let (kind, service, url) = args.kind();
    let base = format!("{}-{date}-{kind}", args.domain);
    let shard_name = |k: u32| format!("{base}-{k}-of-{}.ndjson.zst", args.parallel);
    if !args.resume {
        for k in 0..args.parallel {
            let path = args.out.join(shard_name(k));
            if path.exists() {
                return Err(DumpError::Usage(format!("{} exists: pass --resume to continue that dump", path.display())));
            }
        }
    }
    let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).build().map_err(|e| DumpError::Failed(e.to_string()))?;
    let progress = ProgressBar::new_spinner();
    progress.set_style(ProgressStyle::with_template("{spinner} {elapsed_precise} {pos} lines, {msg}").expect("a valid template"));
    progress.enable_steady_tick(Duration::from_millis(200));
    let totals = Arc::new(Totals::default());
    let started = Instant::now();
    let mut slices = tokio::task::JoinSet::new();
    for k in 0..args.parallel {
        let shard = Shard {
            path: args.out.join(shard_name(k)),
            slice: format!("{k}/{}", args.parallel),
            url: url.clone(),
            service,
            parts: parts.clone(),
            token: token.clone(),
            checkpoint_every: args.checkpoint_every,
        };
        let (http, totals, progress) = (http.clone(), totals.clone(), progress.clone());
        slices.spawn(async move { shard.run(&http, &totals, &progress).await.map_err(|e| format!("shard {}: {e}", shard.slice)) });
    }
    let mut failures = Vec::new();
    while let Some(done) = slices.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(e),
            Err(e) => failures.push(format!("a shard's task failed: {e}")),
        }
    }
    progress.finish_and_clear();
    if !failures.is_empty() {
        return Err(DumpError::Failed(format!("{} (run again with --resume to continue)", failures.join("; "))));
    }
    let mut shards = Vec::new();
    for k in 0..args.parallel {
        let path = args.out.join(shard_name(k));
        let checkpoint = read_checkpoint(&path).map_err(DumpError::Failed)?;
        let (bytes, sha256) = digest(&path).map_err(|e| DumpError::Failed(format!("{}: {e}", path.display())))?;
        shards.push(ManifestShard {
            file: shard_name(k),
            slice: format!("{k}/{}", args.parallel),
            lines: checkpoint.lines,
            raw_bytes: checkpoint.raw_bytes,
            bytes,
            sha256,
        });
    }
    let enterprise = match wiki {
        Some(wiki) => {
            let packaging = crate::enterprise::Packaging {
                wiki: &wiki,
                out: &args.out,
                date: &date,
                kind,
                shards: (0..args.parallel).map(|k| args.out.join(shard_name(k))).collect(),
            };
            let tarballs =
                tokio::task::block_in_place(|| packaging.write()).map_err(|e| DumpError::Failed(format!("the Enterprise layout: {e}")))?;
            let mut listed = Vec::with_capacity(tarballs.len());
            for tarball in tarballs {
                let path = args.out.join(&tarball.file);
                let (bytes, sha256) = digest(&path).map_err(|e| DumpError::Failed(format!("{}: {e}", path.display())))?;
                listed.push(ManifestTarball { tarball, bytes, sha256 });
            }
            listed
        }
        None => Vec::new(),
    };
    let manifest = Manifest {
        domain: args.domain.clone(),
        date,
        kind,
        parts,
        slices: args.parallel,
        lines: shards.iter().map(|s| s.lines).sum(),
        raw_bytes: shards.iter().map(|s| s.raw_bytes).sum(),
        bytes: shards.iter().map(|s| s.bytes).sum(),
        shards,
        enterprise,
    };
    let manifest_path = args.out.join(format!("{base}-manifest.json"));
    write_atomically(&manifest_path, &serde_json::to_vec_pretty(&manifest).unwrap_or_default()).map_err(DumpError::Failed)?;
    let seconds = started.elapsed().as_secs_f64().max(0.001);
    let noun = match (kind, manifest.lines == 1) {
        ("history", true) => "revision",
        ("history", false) => "revisions",
        (_, true) => "page",
        (_, false) => "pages",
    };
    let tarballs = match manifest.enterprise.len() {
        0 => String::new(),
        n => format!(
            ", and {n} Enterprise tarball{} ({:.1} MB)",
            if n == 1 { "" } else { "s" },
            manifest.enterprise.iter().map(|t| t.bytes).sum::<u64>() as f64 / 1e6
        ),
    };
    Ok(format!(
        "dumped {} {noun} of {} in {} shards: {:.1} MB of NDJSON, {:.1} MB compressed{tarballs}, in {seconds:.1} s ({:.0} lines/s this run); manifest {}",
        manifest.lines,
        manifest.domain,
        manifest.slices,
        manifest.raw_bytes as f64 / 1e6,
        manifest.bytes as f64 / 1e6,
        totals.lines.load(Ordering::Relaxed) as f64 / seconds,
        manifest_path.display()
    ))
}

#[derive(Debug, Default)]
struct Totals {
    lines: AtomicU64,
    raw_bytes: AtomicU64,
}

/// One slice written to one shard file.
#[derive(Debug)]
struct Shard {
    path: PathBuf,
    slice: String,
    url: String,
    /// Which service serves `url`, for messages.
    service: &'static str,
    parts: String,
    token: Option<String>,
    checkpoint_every: u64,
}

impl Shard {
    async fn run(&self, http: &reqwest::Client, totals: &Totals, progress: &ProgressBar) -> Result<(), String> {
        let mut at = read_checkpoint(&self.path)?;
        let mut failed = 0;
        while !at.done {
            match self.stream_from(http, &mut at, totals, progress).await {
                Ok(()) => {}
                Err(Cut::Refused(e)) => return Err(e),
                Err(Cut::Broken(e)) if failed + 1 < ATTEMPTS => {
                    failed += 1;
                    tracing::warn!(slice = %self.slice, error = %e, "dump stream cut short; resuming from the last checkpoint");
                    tokio::time::sleep(Duration::from_secs(1 << failed)).await;
                    at = read_checkpoint(&self.path)?;
                }
                Err(Cut::Broken(e)) => return Err(e),
            }
        }
        Ok(())
    }

    /// Streams the slice from `at`, appending frames to the shard, until the
    /// stream's end line (or a failure: the file is then cut back at the next
    /// attempt). The shard is opened only once the service has said yes.
    async fn stream_from(&self, http: &reqwest::Client, at: &mut Checkpoint, totals: &Totals, progress: &ProgressBar) -> Result<(), Cut> {
        let mut url = format!("{}?slice={}&parts={}", self.url, query_value(&self.slice), query_value(&self.parts));
        if let Some(cursor) = &at.cursor {
            url.push_str(&format!("&after={}", query_value(cursor)));
        }
        let mut request = http.get(url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let mut answer = request.send().await.map_err(|e| Cut::Broken(e.to_string()))?;
        if !answer.status().is_success() {
            let status = answer.status();
            let body = answer.text().await.unwrap_or_default();
            let why = format!("{} answered {status}: {}", self.service, body.chars().take(300).collect::<String>());
            // A 4xx (a wrong token, a domain or cursor refused) is not changed by asking again.
            return Err(if status.is_client_error() && status != 429 { Cut::Refused(why) } else { Cut::Broken(why) });
        }
        let mut file = std::fs::OpenOptions::new().create(true).write(true).truncate(false).open(&self.path)?;
        // Whatever follows the last checkpoint was written by a run that did not record it.
        file.set_len(at.file_bytes)?;
        file.seek(std::io::SeekFrom::End(0))?;
        let mut frame = FrameWriter::new(file)?;
        // Lines written since the last checkpoint.
        let mut pending = false;
        let (mut buffer, mut since_checkpoint) = (Vec::new(), 0u64);
        let mut next = at.clone();
        while let Some(chunk) = answer.chunk().await.map_err(|e| Cut::Broken(e.to_string()))? {
            buffer.extend_from_slice(&chunk);
            let mut start = 0;
            while let Some(end) = buffer[start..].iter().position(|&b| b == b'\n').map(|i| start + i) {
                let line = &buffer[start..=end];
                start = end + 1;
                let parsed: StreamLine = serde_json::from_slice(line).map_err(|e| Cut::Broken(format!("a line that is not JSON: {e}")))?;
                if parsed.done.is_some() {
                    // The end line: the slice is complete (this request sets no limit).
                    next.done = parsed.done == Some(true);
                    *at = frame.checkpoint(&self.path, next.clone())?;
                    return match at.done {
                        true => Ok(()),
                        false => Err(Cut::Broken("the stream ended before its slice".into())),
                    };
                }
                frame.write(line)?;
                next.cursor = parsed.cursor;
                next.lines += 1;
                next.raw_bytes += line.len() as u64;
                since_checkpoint += 1;
                pending = true;
                totals.lines.fetch_add(1, Ordering::Relaxed);
                totals.raw_bytes.fetch_add(line.len() as u64, Ordering::Relaxed);
                progress.inc(1);
                if since_checkpoint >= self.checkpoint_every {
                    *at = frame.checkpoint(&self.path, next.clone())?;
                    (since_checkpoint, pending) = (0, false);
                }
            }
            buffer.drain(..start);
            progress.set_message(format!("{:.1} MB", totals.raw_bytes.load(Ordering::Relaxed) as f64 / 1e6));
        }
        if pending {
            *at = frame.checkpoint(&self.path, next)?;
        }
        Err(Cut::Broken("the stream was cut short".into()))
    }
}

/// Why a slice's stream stopped before its end.
#[derive(Debug)]
enum Cut {
    /// The service refused the request (4xx): asking again changes nothing.
    Refused(String),
    /// The connection, the service or the shard's file failed: worth resuming.
    Broken(String),
}

impl From<std::io::Error> for Cut {
    fn from(e: std::io::Error) -> Cut {
        Cut::Broken(e.to_string())
    }
}

impl From<String> for Cut {
    fn from(e: String) -> Cut {
        Cut::Broken(e)
    }
}

/// Appends zstd frames to a shard: each checkpoint ends one, so the file is
/// valid (and cut-able) at every checkpoint.
struct FrameWriter {
    encoder: Option<zstd::stream::write::Encoder<'static, std::fs::File>>,
}

impl FrameWriter {
    fn new(file: std::fs::File) -> Result<FrameWriter, String> {
        Ok(FrameWriter { encoder: Some(zstd::stream::write::Encoder::new(file, 3).map_err(|e| e.to_string())?) })
    }

    fn write(&mut self, line: &[u8]) -> Result<(), String> {
        self.encoder.as_mut().ok_or("the shard is closed")?.write_all(line).map_err(|e| e.to_string())
    }

    /// Ends the frame, syncs the file, then records `at` with the file's length.
    fn checkpoint(&mut self, path: &Path, mut at: Checkpoint) -> Result<Checkpoint, String> {
        let encoder = self.encoder.take().ok_or("the shard is closed")?;
        let file = encoder.finish().map_err(|e| e.to_string())?;
        file.sync_data().map_err(|e| e.to_string())?;
        at.file_bytes = file.metadata().map_err(|e| e.to_string())?.len();
        write_atomically(&state_path(path), &serde_json::to_vec(&at).unwrap_or_default())?;
        self.encoder = Some(zstd::stream::write::Encoder::new(file, 3).map_err(|e| e.to_string())?);
        Ok(at)
    }
}

fn state_path(shard: &Path) -> PathBuf {
    let mut name = shard.file_name().unwrap_or_default().to_os_string();
    name.push(".state.json");
    shard.with_file_name(name)
}

/// A shard's last checkpoint; none yet: from the start.
fn read_checkpoint(shard: &Path) -> Result<Checkpoint, String> {
    match std::fs::read(state_path(shard)) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", state_path(shard).display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Checkpoint::default()),
        Err(e) => Err(format!("{}: {e}", state_path(shard).display())),
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let temporary = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_data()?;
        std::fs::rename(&temporary, path)
    };
    write().map_err(|e| format!("{}: {e}", path.display()))
}

fn digest(path: &Path) -> std::io::Result<(u64, String)> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let (mut hasher, mut buffer, mut bytes) = (Sha256::new(), vec![0u8; 1 << 20], 0u64);
    loop {
        match file.read(&mut buffer)? {
            0 => return Ok((bytes, hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())),
            n => {
                hasher.update(&buffer[..n]);
                bytes += n as u64;
            }
        }
    }
}

/// A query value as it may stand in a URL (cursors are base64url already).
fn query_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b.is_ascii_alphanumeric() || b"-_.~,/".contains(&b) {
            true => (b as char).to_string(),
            false => format!("%{b:02X}"),
        })
        .collect()
}
