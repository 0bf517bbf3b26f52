//! What an operator sets: which tasks, which services, how fast, how long.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use clap::builder::TypedValueParser as _;
pub use revstore_api::janitor::{Scope, Task};
use revstore_client::{ClientOptions, HttpClient, JanitorClient};

/// The services whose sweeps of `task` a run drives. The tasks themselves
/// (`revstore_api::janitor::Task`) are declared in the order a run does them
/// (the audit last, so that it measures what the others left).
pub fn swept_by(task: Task) -> &'static [ServiceName] {
    match task {
        // current-store's superseded renders; the graph's fragment changes
        // older than its change retention (graph_changes grows otherwise).
        Task::Retention => &[ServiceName::CurrentStore, ServiceName::Graph],
        Task::Archive => &[ServiceName::CurrentStore],
        // Each store's deleted pages and suppressed revisions.
        Task::Hidden => &[ServiceName::CurrentStore, ServiceName::OldStore],
        Task::Graph => &[ServiceName::Graph],
        Task::Audit => &ServiceName::ALL,
    }
}

/// The scope named on the command line.
fn scope_arg() -> impl clap::builder::TypedValueParser<Value = Scope> {
    clap::builder::PossibleValuesParser::new([Scope::All.name(), Scope::Changed.name()])
        .map(|name| if name == Scope::Changed.name() { Scope::Changed } else { Scope::All })
}

/// Whether a task has sweeps of `scope`. The graph's repair and the
/// hidden task read every row they check (the latter from every site), so
/// they run with the full scope only.
pub fn offered_in(task: Task, scope: Scope) -> bool {
    scope == Scope::All || !matches!(task, Task::Graph | Task::Hidden)
}

/// A task named on the command line.
fn task_arg() -> impl clap::builder::TypedValueParser<Value = Task> {
    clap::builder::PossibleValuesParser::new(Task::ALL.map(Task::name)).try_map(|name| name.parse::<Task>())
}

/// The services a run may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceName {
    CurrentStore,
    OldStore,
    Graph,
}

impl ServiceName {
    pub const ALL: [ServiceName; 3] = [ServiceName::CurrentStore, ServiceName::OldStore, ServiceName::Graph];

    pub fn name(self) -> &'static str {
        match self {
            ServiceName::CurrentStore => "current-store",
            ServiceName::OldStore => "old-store",
            ServiceName::Graph => "dependency-graph",
        }
    }

    fn url_setting(self) -> &'static str {
        match self {
            ServiceName::CurrentStore => "REVSTORE_CURRENT_STORE_URL",
            ServiceName::OldStore => "REVSTORE_OLD_STORE_URL",
            ServiceName::Graph => "REVSTORE_GRAPH_URL",
        }
    }
}

/// `revstore-janitor [--dry-run] [TASK]...`
#[derive(Debug, Clone, Parser)]
#[command(
    name = "revstore-janitor",
    version,
    about = "Retention, repair and the storage audit of a revstore deployment, run to completion"
)]
pub struct Settings {
    /// Tasks to run, in this order whatever order they are named in (all when none is named).
    #[arg(value_parser = task_arg())]
    pub tasks: Vec<Task>,

    /// Report what would change, change nothing (dry runs keep their own checkpoints).
    #[arg(long)]
    pub dry_run: bool,

    /// `changed`: a routine run, its work what changed since the last
    /// (retention and the hand-off check of the pages the services' journals
    /// show written since, the audit from the nodes' own figures); `all`:
    /// every page of every table, the graph's repair and the audit's full
    /// count (daily, and after a restore).
    #[arg(long, env = "REVSTORE_JANITOR_SCOPE", default_value = "all", value_parser = scope_arg())]
    pub scope: Scope,

    /// current-store's base URL (not set: its tasks are skipped, and the summary says so).
    #[arg(long, env = "REVSTORE_CURRENT_STORE_URL")]
    pub current_store_url: Option<String>,

    /// old-store's base URL.
    #[arg(long, env = "REVSTORE_OLD_STORE_URL")]
    pub old_store_url: Option<String>,

    /// dependency-graph's base URL.
    #[arg(long, env = "REVSTORE_GRAPH_URL")]
    pub graph_url: Option<String>,

    /// Token file: the janitor presents its first token (a write token of the services).
    #[arg(long, env = "REVSTORE_PEER_TOKEN_FILE")]
    pub peer_token_file: Option<PathBuf>,

    /// Partitions visited per second across all services (0: no limit). The
    /// default keeps a run's load small beside the services' own.
    #[arg(long, env = "REVSTORE_JANITOR_OPS_PER_SEC", default_value_t = Settings::DEFAULT_OPS_PER_SEC)]
    pub ops_per_sec: u32,

    /// Partitions one step visits (1 to 10,000).
    #[arg(long, env = "REVSTORE_JANITOR_STEP_PARTITIONS", default_value_t = Settings::DEFAULT_STEP_PARTITIONS)]
    pub step_partitions: u32,

    /// Seconds after which the run stops at the next step and exits 75 (the
    /// next run resumes). Keep it below the CronJob's schedule interval.
    #[arg(long, env = "REVSTORE_JANITOR_DEADLINE_SECS", default_value_t = Settings::DEFAULT_DEADLINE_SECS)]
    pub deadline_secs: u64,

    /// Seconds the lease lasts unless renewed (renewed every third of it):
    /// how long a crashed run blocks the next one.
    #[arg(long, env = "REVSTORE_JANITOR_LEASE_SECS", default_value_t = Settings::DEFAULT_LEASE_SECS)]
    pub lease_secs: u64,

    /// Seconds one admin call may take (a purge of a large embedded store is the longest).
    #[arg(long, env = "REVSTORE_JANITOR_CALL_TIMEOUT_SECS", default_value_t = Settings::DEFAULT_CALL_TIMEOUT_SECS)]
    pub call_timeout_secs: u64,

    /// A Prometheus Pushgateway's base URL: the run's metrics are pushed
    /// there at the end (a CronJob's pod is gone before a scrape would come).
    #[arg(long, env = "REVSTORE_JANITOR_METRICS_PUSH_URL")]
    pub metrics_push_url: Option<String>,

    /// A file to write the run's metrics to, in the text format (for a node
    /// exporter's textfile collector on one machine).
    #[arg(long, env = "REVSTORE_JANITOR_METRICS_FILE")]
    pub metrics_file: Option<PathBuf>,
}

/// A service the run calls.
#[derive(Debug, Clone)]
pub struct Target {
    pub service: ServiceName,
    pub client: JanitorClient,
}

impl Default for Settings {
    /// Every task, no service, the defaults of the command line; none read
    /// from the environment (what `revstore up` starts from).
    fn default() -> Self {
        revstore_service::command_line_defaults()
    }
}

impl Settings {
    pub const DEFAULT_OPS_PER_SEC: u32 = 500;
    pub const DEFAULT_STEP_PARTITIONS: u32 = 100;
    pub const DEFAULT_DEADLINE_SECS: u64 = 3300;
    pub const DEFAULT_LEASE_SECS: u64 = 300;
    pub const DEFAULT_CALL_TIMEOUT_SECS: u64 = 120;

    /// The tasks to run, in run order, each once. A routine run (scope
    /// `changed`) has no graph repair: it reads every edge, whatever changed.
    pub fn tasks(&self) -> Vec<Task> {
        let mut tasks = match (self.tasks.is_empty(), self.scope) {
            (true, Scope::All) => Task::ALL.to_vec(),
            (true, Scope::Changed) => Task::ALL.into_iter().filter(|t| offered_in(*t, Scope::Changed)).collect(),
            (false, _) => self.tasks.clone(),
        };
        tasks.sort();
        tasks.dedup();
        tasks
    }

    /// The services with a URL set, as clients; and what is skipped, said for the summary.
    pub fn targets(&self) -> Result<(Vec<Target>, Vec<String>), String> {
        if let Some(task) = self.tasks.iter().find(|t| !offered_in(**t, self.scope)) {
            return Err(format!("the {task} task reads every edge: it runs with --scope all only"));
        }
        if !(1..=revstore_api::janitor::MAX_STEP_PARTITIONS).contains(&self.step_partitions) {
            return Err(format!("--step-partitions must be within 1-{}", revstore_api::janitor::MAX_STEP_PARTITIONS));
        }
        if !(3..=revstore_api::janitor::MAX_LEASE_SECS).contains(&self.lease_secs) {
            return Err(format!("--lease-secs must be within 3-{}", revstore_api::janitor::MAX_LEASE_SECS));
        }
        if self.deadline_secs == 0 || self.call_timeout_secs == 0 {
            return Err("--deadline-secs and --call-timeout-secs must be positive".into());
        }
        let token = match &self.peer_token_file {
            Some(path) => Some(revstore_client::tokens::read_peer_token(path, "peer token").map_err(|e| e.to_string())?),
            None => None,
        };
        // Step reports are small: an answer a step cannot be is refused at 1 MiB.
        let options = ClientOptions {
            token,
            timeout: Duration::from_secs(self.call_timeout_secs),
            retries: 0,
            max_answer_bytes: 1024 * 1024,
            ..ClientOptions::default()
        };
        let mut targets = Vec::new();
        let mut skipped = Vec::new();
        for (service, url) in [
            (ServiceName::CurrentStore, &self.current_store_url),
            (ServiceName::OldStore, &self.old_store_url),
            (ServiceName::Graph, &self.graph_url),
        ] {
            match url {
                Some(url) => {
                    let http = HttpClient::new(url, options.clone()).map_err(|e| format!("{}: {e}", service.url_setting()))?;
                    targets.push(Target { service, client: JanitorClient::new(http) });
                }
                None => skipped.push(format!("{}: {} is not set", service.name(), service.url_setting())),
            }
        }
        if targets.is_empty() {
            return Err("no service to sweep: set REVSTORE_CURRENT_STORE_URL, REVSTORE_OLD_STORE_URL or REVSTORE_GRAPH_URL".into());
        }
        Ok((targets, skipped))
    }
}
