//! old-store on a disk that fills up, crashes, and gets space back: the real
//! binary on a small tmpfs (a real full disk, not a simulated one), so this
//! needs root to mount it. scripts/test runs it; as root CI does.
//!
//! The probe found that after a `kill -9` on a full disk the service refused
//! to start ("cannot open storage: … disk full", exit 1), which under
//! Kubernetes is a crash loop with reads down too.

mod process;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use process::Running;

use revstore_keys::Tid;
use serde_json::json;

const TOKEN: &str = "old-store-full-disk-token";

/// A tmpfs of `megabytes`, unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(megabytes: u32) -> SmallDisk {
        let dir = tempfile::tempdir().expect("tempdir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mounting a tmpfs failed: this test needs root (CI runs as root)");
        SmallDisk { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

fn start(data_dir: &Path) -> Running {
    let args = ["--data-dir", data_dir.to_str().expect("utf-8"), "--write-tokens", TOKEN, "--settle-secs", "1"];
    Running::start(&args.map(String::from))
}

fn incompressible_html(bytes: usize) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    let text: String = (0..bytes).map(|_| rng.random_range(b'!'..=b'~') as char).filter(|c| !matches!(c, '<' | '&')).collect();
    format!("<p>{text}</p>")
}

async fn archive(http: &reqwest::Client, s: &Running, title: &str, rev: u64, html: &str) -> reqwest::Response {
    let body = json!({ "html": html, "data-parsoid": {}, "section-offsets": {} });
    let url = s.url(&format!("/en.wikipedia.org/v1/archive/{title}/{rev}/{}", Tid::now()));
    http.put(url).bearer_auth(TOKEN).json(&body).send().await.expect("send")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root to mount a small tmpfs (a real full disk); scripts/test runs it"]
async fn after_a_crash_on_a_full_disk_old_store_starts_serves_reads_and_takes_writes_when_space_returns() {
    let disk = SmallDisk::mount(24);
    let data_dir: PathBuf = disk.path().join("old-store");
    // Space the operator can free later.
    let reserve = disk.path().join("reserve");
    std::fs::write(&reserve, vec![0u8; 3 << 20]).expect("reserve");
    let http = reqwest::Client::new();

    let s = start(&data_dir);
    s.ready(&http).await;
    assert_eq!(archive(&http, &s, "Kept", 1, "<p>first</p>").await.status(), 201);
    // Fill the disk: incompressible revisions until old-store refuses.
    let mut refused = None;
    for rev in 1..=400u64 {
        let answer = archive(&http, &s, &format!("Filler_{}", rev % 5), rev, &incompressible_html(200_000)).await;
        if answer.status() != 201 {
            refused = Some((answer.status(), answer.text().await.expect("body")));
            break;
        }
    }
    let (status, body) = refused.expect("the disk never filled");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("storage is full"), "{body}");
    assert!(!body.contains("database or disk is full"), "the cause is for the logs: {body}");
    // While full, reads go on; compactions fail and are retried, logged once.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let read = http.get(s.url("/en.wikipedia.org/v1/archive/html/Kept/1")).send().await.expect("send");
    assert_eq!(read.status(), 200);
    let warnings = s.logged().into_iter().filter(|l| l.contains("\"WARN\"") || l.contains("\"ERROR\"")).collect::<Vec<_>>();
    assert!(warnings.len() < 10, "a full disk floods the log: {} lines, e.g. {:?}", warnings.len(), &warnings[..3.min(warnings.len())]);
    s.kill_9();

    // Restarted on the full disk: it starts and serves reads.
    let s = start(&data_dir);
    s.ready(&http).await;
    let read = http.get(s.url("/en.wikipedia.org/v1/archive/html/Kept/1")).send().await.expect("send");
    assert_eq!((read.status().as_u16(), read.text().await.expect("body")), (200, "<p>first</p>".to_owned()));
    // Writes are refused with the same 503, and the condition is reported.
    let refused = archive(&http, &s, "Filler_0", 10_000, &incompressible_html(400_000)).await;
    assert_eq!(refused.status(), 503);
    assert_eq!(s.ready(&http).await["writes"], "refused: storage full");
    let metrics = http.get(s.url("/metrics")).send().await.expect("send").text().await.expect("text");
    assert!(metrics.contains("storage_full{service=\"old-store\",engine=\"embedded\"} 1"), "{metrics}");

    // Space returns: writes are taken again, with no restart.
    std::fs::remove_file(&reserve).expect("free the reserve");
    assert_eq!(archive(&http, &s, "After", 1, "<p>space again</p>").await.status(), 201);
    assert_eq!(s.ready(&http).await["writes"], "accepted");
    let read = http.get(s.url("/en.wikipedia.org/v1/archive/html/After/1")).send().await.expect("send");
    assert_eq!(read.status(), 200);
}
