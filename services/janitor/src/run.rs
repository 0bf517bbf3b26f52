//! The driver: lease, tasks, pacing, retries, deadline.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use revstore_api::janitor::{LeaseRequest, StepReport, StepRequest, TableAudit, problems};
use revstore_client::ClientError;
use revstore_keys::TidGenerator;
use tokio_util::sync::CancellationToken;

use crate::settings::{Settings, Target, Task};
use crate::summary::{AuditedTable, Status, Summary, Swept, TaskSummary};

/// Attempts of a step that failed for a transient reason (the service
/// restarting, overloaded) before the task gives up on that service.
const STEP_ATTEMPTS: u32 = 4;

/// How a run ended, for the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    /// Every task completed: exit 0.
    Completed,
    /// Stopped early (deadline, signal, another run holds the lease): exit 75.
    Interrupted,
    /// A task failed: exit 1.
    Failed,
}

/// One run of the janitor.
#[derive(Debug)]
pub struct Janitor {
    settings: Settings,
    targets: Vec<Target>,
    skipped: Vec<String>,
    run_id: String,
}

/// Why the sweeping stopped before the end.
enum Stop {
    Deadline,
    Signal,
    LeaseLost(String),
}

impl Stop {
    fn reason(&self) -> String {
        match self {
            Stop::Deadline => "the deadline passed".into(),
            Stop::Signal => "stopped by a signal".into(),
            Stop::LeaseLost(why) => format!("the lease was lost: {why}"),
        }
    }
}

/// Paces steps to `ops_per_sec` partitions a second over the whole run.
struct Pace {
    since: Instant,
    visited: u64,
    per_sec: u32,
}

impl Pace {
    fn due(&mut self, partitions: u64) -> Option<Instant> {
        self.visited += partitions;
        (self.per_sec > 0).then(|| self.since + Duration::from_secs_f64(self.visited as f64 / f64::from(self.per_sec)))
    }
}

impl Janitor {
    pub fn new(settings: Settings) -> Result<Janitor, String> {
        let (targets, skipped) = settings.targets()?;
        let run_id = TidGenerator::new().next().to_string();
        Ok(Janitor { settings, targets, skipped, run_id })
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Runs every task; `stop` ends the run at the next step.
    pub async fn run(&self, stop: CancellationToken) -> (RunOutcome, Summary) {
        let started = Instant::now();
        let mut summary = Summary {
            run: self.run_id.clone(),
            dry_run: self.settings.dry_run,
            scope: self.settings.scope,
            skipped: self.skipped.clone(),
            ..Summary::default()
        };
        let outcome = match self.take_leases().await {
            Err((outcome, why)) => {
                summary.stopped = Some(why);
                outcome
            }
            Ok(()) => {
                let lost = CancellationToken::new();
                let renewal = tokio::spawn(self.clone_for_renewal().renew_leases(lost.clone()));
                let outcome = self.sweep(&stop, &lost, started, &mut summary).await;
                renewal.abort();
                self.give_back_leases().await;
                outcome
            }
        };
        summary.seconds = started.elapsed().as_secs_f64();
        summary.status = match outcome {
            RunOutcome::Completed => Status::Completed,
            RunOutcome::Interrupted => Status::Interrupted,
            RunOutcome::Failed => Status::Failed,
        };
        (outcome, summary)
    }

    fn clone_for_renewal(&self) -> Renewal {
        Renewal {
            targets: self.targets.clone(),
            holder: self.run_id.clone(),
            lease_secs: self.settings.lease_secs,
            scope: self.settings.scope,
        }
    }

    /// The lease of every service, in a fixed order (so two runs contend on
    /// the first); on a refusal the ones taken are given back.
    async fn take_leases(&self) -> Result<(), (RunOutcome, String)> {
        let request = LeaseRequest { holder: self.run_id.clone(), ttl_secs: self.settings.lease_secs, scope: self.settings.scope };
        for (i, target) in self.targets.iter().enumerate() {
            if let Err(e) = target.client.take_lease(&request).await {
                for taken in &self.targets[..i] {
                    let _ = taken.client.give_back_lease(&self.run_id, self.settings.scope).await;
                }
                return Err(if e.is_problem(problems::LEASE_HELD) {
                    (RunOutcome::Interrupted, format!("another janitor run is under way ({}): {e}", target.service.name()))
                } else {
                    (RunOutcome::Failed, format!("cannot take the lease of {}: {e}", target.service.name()))
                });
            }
        }
        tracing::info!(job = "janitor", run = %self.run_id, services = self.targets.len(), "lease taken");
        Ok(())
    }

    async fn give_back_leases(&self) {
        for target in &self.targets {
            if let Err(e) = target.client.give_back_lease(&self.run_id, self.settings.scope).await {
                tracing::warn!(service = target.service.name(), error = %e, "cannot give the lease back; it lapses by itself");
            }
        }
    }

    async fn sweep(&self, stop: &CancellationToken, lost: &CancellationToken, started: Instant, summary: &mut Summary) -> RunOutcome {
        let deadline = started + Duration::from_secs(self.settings.deadline_secs);
        let mut pace = Pace { since: Instant::now(), visited: 0, per_sec: self.settings.ops_per_sec };
        let mut worst = Status::Skipped;
        for task in self.settings.tasks() {
            let task_started = Instant::now();
            let mut result = TaskSummary { status: Status::Skipped, ..TaskSummary::default() };
            let mut stopped = None;
            for target in self.targets.iter().filter(|t| crate::settings::swept_by(task).contains(&t.service)) {
                let swept = match self.sweep_one(task, target, stop, lost, deadline, &mut pace, &mut result).await {
                    Ok(swept) => swept,
                    Err((swept, why)) => {
                        stopped = Some(why);
                        swept
                    }
                };
                result.status = if result.status == Status::Skipped { swept.status } else { result.status.worst(swept.status) };
                result.services.insert(target.service.name(), swept);
                if stopped.is_some() {
                    break;
                }
            }
            if task == Task::Retention && stopped.is_none() && result.status == Status::Completed {
                self.purge(&mut result).await;
            }
            if task == Task::Audit {
                result.total_audit();
            }
            worst = worst.worst(result.status);
            result.seconds = task_started.elapsed().as_secs_f64();
            summary.tasks.insert(task.name(), result);
            if let Some(why) = stopped {
                tracing::warn!(job = "janitor", run = %self.run_id, reason = %why.reason(), "run stopped early; the next run resumes");
                summary.stopped = Some(why.reason());
                return if matches!(why, Stop::LeaseLost(_)) { RunOutcome::Failed } else { RunOutcome::Interrupted };
            }
        }
        match worst {
            Status::Failed => RunOutcome::Failed,
            Status::Interrupted => RunOutcome::Interrupted,
            Status::Completed | Status::Skipped => RunOutcome::Completed,
        }
    }

    /// Steps one service's sweep of `task` until it is done, or until the run
    /// must stop (then `Err` with what was done so far and why).
    #[allow(clippy::too_many_arguments)]
    async fn sweep_one(
        &self,
        task: Task,
        target: &Target,
        stop: &CancellationToken,
        lost: &CancellationToken,
        deadline: Instant,
        pace: &mut Pace,
        result: &mut TaskSummary,
    ) -> Result<Swept, (Swept, Stop)> {
        let service = target.service.name();
        let progress = Progress::start(task.name(), service);
        let request = StepRequest {
            holder: self.run_id.clone(),
            budget: self.settings.step_partitions,
            dry_run: self.settings.dry_run,
            restart: false,
            scope: self.settings.scope,
        };
        let mut swept = Swept::default();
        loop {
            if lost.is_cancelled() {
                swept.status = Status::Failed;
                return Err((swept, Stop::LeaseLost("another run holds it now".into())));
            }
            if stop.is_cancelled() {
                swept.status = Status::Interrupted;
                return Err((swept, Stop::Signal));
            }
            if Instant::now() >= deadline {
                swept.status = Status::Interrupted;
                return Err((swept, Stop::Deadline));
            }
            let report = match self.step_with_retries(target, task, &request, stop).await {
                Ok(report) => report,
                Err(e) if e.is_problem(problems::LEASE_HELD) => {
                    swept.status = Status::Failed;
                    swept.error = Some(e.to_string());
                    return Err((swept, Stop::LeaseLost(e.to_string())));
                }
                Err(e) if e.is_problem(problems::TASK_NOT_OFFERED) => {
                    swept.status = Status::Skipped;
                    swept.error = Some(format!("{service} offers no {} sweep: {e}", task.name()));
                    progress.finish(&swept);
                    return Ok(swept);
                }
                Err(e) => {
                    tracing::error!(task = task.name(), service, error = %e, "step failed");
                    swept.status = Status::Failed;
                    swept.error = Some(e.to_string());
                    progress.finish(&swept);
                    return Ok(swept);
                }
            };
            if swept.steps == 0 {
                swept.resumed = report.resumed;
            }
            swept.steps += 1;
            swept.partitions += report.partitions;
            swept.rows += report.rows;
            swept.bytes += report.bytes;
            for (table, counts) in &report.tables {
                let key = format!("{service}/{table}");
                let entry = result.tables.entry(key).or_insert(AuditedTable::new(TableAudit::default()));
                entry.counts.add(counts);
                *entry = AuditedTable::new(entry.counts);
            }
            progress.step(&swept);
            if report.done {
                swept.status = Status::Completed;
                progress.finish(&swept);
                return Ok(swept);
            }
            if let Some(due) = pace.due(report.partitions) {
                tokio::select! {
                    _ = tokio::time::sleep_until(due.min(deadline).into()) => {}
                    _ = stop.cancelled() => {}
                }
            }
        }
    }

    /// One step, tried again after transient failures (a step is safe to
    /// repeat: it resumes from the checkpoint the last finished step left).
    async fn step_with_retries(
        &self,
        target: &Target,
        task: Task,
        request: &StepRequest,
        stop: &CancellationToken,
    ) -> Result<StepReport, ClientError> {
        let mut pause = Duration::from_secs(1);
        let mut attempt = 1;
        loop {
            match target.client.step(task, request).await {
                Err(e) if e.is_transient() && attempt < STEP_ATTEMPTS && !stop.is_cancelled() => {
                    tracing::warn!(task = task.name(), service = target.service.name(), error = %e, attempt, "step failed; trying again");
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = stop.cancelled() => {}
                    }
                    pause *= 2;
                    attempt += 1;
                }
                answer => return answer,
            }
        }
    }

    /// Retention's last part: expired data the engines still keep. Not in a
    /// dry run (it would change something).
    async fn purge(&self, result: &mut TaskSummary) {
        if self.settings.dry_run {
            return;
        }
        for target in &self.targets {
            match target.client.purge().await {
                Ok(report) => {
                    result.purged.insert(target.service.name(), report);
                }
                Err(e) => {
                    tracing::error!(service = target.service.name(), error = %e, "purge failed");
                    result.status = result.status.worst(Status::Failed);
                    let swept = result.services.entry(target.service.name()).or_default();
                    swept.status = Status::Failed;
                    swept.error = Some(format!("purge: {e}"));
                }
            }
        }
    }
}

/// The lease renewal, on its own task for the length of the run.
struct Renewal {
    targets: Vec<Target>,
    holder: String,
    lease_secs: u64,
    scope: revstore_api::janitor::Scope,
}

impl Renewal {
    async fn renew_leases(self, lost: CancellationToken) {
        let request = LeaseRequest { holder: self.holder.clone(), ttl_secs: self.lease_secs, scope: self.scope };
        let mut every = tokio::time::interval(Duration::from_secs(self.lease_secs / 3));
        every.tick().await;
        loop {
            every.tick().await;
            for target in &self.targets {
                match target.client.take_lease(&request).await {
                    Ok(_) => {}
                    Err(e) if e.is_problem(problems::LEASE_HELD) => {
                        tracing::error!(service = target.service.name(), error = %e, "lease lost");
                        lost.cancel();
                        return;
                    }
                    // Unreachable for now: the lease lasts three periods; the next tick tries again.
                    Err(e) => tracing::warn!(service = target.service.name(), error = %e, "cannot renew the lease"),
                }
            }
        }
    }
}

/// A spinner on a terminal; otherwise a log line every ten seconds and at the end.
struct Progress {
    bar: Option<ProgressBar>,
    task: &'static str,
    service: &'static str,
    last_log: std::cell::Cell<Instant>,
}

impl Progress {
    fn start(task: &'static str, service: &'static str) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {prefix}: {msg} [{elapsed}]").unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.set_prefix(format!("{task} {service}"));
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Progress { bar, task, service, last_log: std::cell::Cell::new(Instant::now()) }
    }

    fn message(swept: &Swept) -> String {
        format!("{} partitions, {} rows, {} bytes, {} steps", swept.partitions, swept.rows, swept.bytes, swept.steps)
    }

    fn step(&self, swept: &Swept) {
        match &self.bar {
            Some(bar) => bar.set_message(Self::message(swept)),
            None if self.last_log.get().elapsed() >= Duration::from_secs(10) => {
                self.last_log.set(Instant::now());
                tracing::info!(task = self.task, service = self.service, partitions = swept.partitions, rows = swept.rows, "sweeping");
            }
            None => {}
        }
    }

    fn finish(&self, swept: &Swept) {
        if let Some(bar) = &self.bar {
            bar.finish_with_message(format!("{} ({})", Self::message(swept), swept.status.name()));
        }
        tracing::info!(
            task = self.task,
            service = self.service,
            status = swept.status.name(),
            partitions = swept.partitions,
            rows = swept.rows,
            bytes = swept.bytes,
            steps = swept.steps,
            "sweep ended"
        );
    }
}
