//! `revstore-janitor`: see the crate documentation and `--help`.
//!
//! Exit codes: 0 every task completed; 75 stopped early (deadline, SIGTERM,
//! or another run holds the lease): the next run goes on; 1 a task failed;
//! 64 bad settings. The last line of stdout is the run's JSON summary.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use revstore_janitor::{Janitor, RunOutcome, Settings, Summary};
use revstore_service::{JobOutcome, parse_args_or_exit, run_task, shutdown_signal};

#[tokio::main]
async fn main() -> ExitCode {
    let settings: Settings = parse_args_or_exit();
    let janitor = match Janitor::new(settings.clone()) {
        Ok(janitor) => janitor,
        Err(e) => {
            eprintln!("revstore-janitor: invalid settings: {e}");
            return ExitCode::from(64);
        }
    };
    let telemetry = match revstore_telemetry::init("janitor") {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("revstore-janitor: {e}");
            return ExitCode::from(70);
        }
    };
    let code = run_task("janitor", shutdown_signal(), |stop| async move {
        let (outcome, summary) = janitor.run(stop).await;
        export_metrics(&settings, &summary).await;
        #[allow(clippy::print_stdout)]
        {
            println!("{}", serde_json::to_string(&summary).unwrap_or_default());
        }
        match outcome {
            RunOutcome::Completed => Ok(JobOutcome::Completed),
            RunOutcome::Interrupted => Ok(JobOutcome::Interrupted),
            RunOutcome::Failed => Err(summary.stopped.clone().unwrap_or_else(|| "a task failed (see the summary)".into()).into()),
        }
    })
    .await;
    telemetry.shutdown();
    code
}

/// The run's metrics to a Pushgateway and/or a textfile; a failure is logged,
/// it does not change the run's outcome.
async fn export_metrics(settings: &Settings, summary: &Summary) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let text = summary.prometheus(now);
    if let Some(base) = &settings.metrics_push_url {
        // A group per scope: a routine run's push replaces the last routine
        // run's metrics, never the full run's counts.
        let url = format!("{}/metrics/job/revstore-janitor/scope/{}", base.trim_end_matches('/'), settings.scope.name());
        let pushed = reqwest::Client::new().put(&url).header("content-type", "text/plain; version=0.0.4").body(text.clone()).send().await;
        match pushed.map(|r| r.error_for_status()) {
            Ok(Ok(_)) => tracing::info!(url, "metrics pushed"),
            Ok(Err(e)) | Err(e) => tracing::error!(url, error = %e, "cannot push the run's metrics"),
        }
    }
    if let Some(path) = &settings.metrics_file {
        // Written aside and renamed, so a collector never reads half a file.
        let partial = path.with_extension("prom.partial");
        let written = std::fs::write(&partial, &text).and_then(|()| std::fs::rename(&partial, path));
        if let Err(e) = written {
            tracing::error!(path = %path.display(), error = %e, "cannot write the run's metrics");
        }
    }
}
