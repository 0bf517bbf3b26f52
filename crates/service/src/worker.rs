//! Background loops: one shape for all of them.
//!
//! A [`Worker`] does one step of work at a time and says what it found: more
//! to do ([`WorkerState::Busy`]), nothing for now ([`WorkerState::Idle`], and
//! [`Worker::wait_for_work`] then waits for some), or the end of its work
//! ([`WorkerState::Done`]). [`run_worker`] drives it until then or until the
//! stop token is cancelled, and is the one place that
//! - pauses after a failed step, longer after each failure in a row (from
//!   half a second up to a minute): when the storage itself fails (a full
//!   disk), every step would fail alike;
//! - logs such an episode twice, when it starts and when steps succeed again,
//!   not once per step;
//! - measures every worker alike: `worker_state{service,worker,state}` (1 for the
//!   state the worker is in, 0 for the others), `worker_steps_total{service,worker,outcome}`.
//!
//! A step should return soon after the stop token is cancelled; waiting
//! between steps is cancelled by the runner.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::BoxError;

/// What a worker's last step found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// There is more to do now: the next step runs at once.
    Busy,
    /// Nothing to do for now: the runner waits for [`Worker::wait_for_work`].
    Idle,
    /// The worker has finished for good (a job's worker, or a worker with
    /// nothing to serve); the runner returns.
    Done,
}

impl WorkerState {
    pub const ALL: [WorkerState; 3] = [WorkerState::Busy, WorkerState::Idle, WorkerState::Done];

    pub fn name(self) -> &'static str {
        match self {
            WorkerState::Busy => "busy",
            WorkerState::Idle => "idle",
            WorkerState::Done => "done",
        }
    }
}

/// A background loop, one step at a time.
pub trait Worker: Send + 'static {
    /// The worker's name, in logs and metric labels.
    fn name(&self) -> &'static str;

    /// Does one step of work. An error is retried (the step runs again) after
    /// a pause that grows with the failures in a row.
    fn work(&mut self, stop: &CancellationToken) -> impl Future<Output = Result<WorkerState, BoxError>> + Send;

    /// After an idle step: resolves when there may be work again (a wake-up,
    /// a due time, an interval). The runner cancels it on stop.
    fn wait_for_work(&mut self) -> impl Future<Output = ()> + Send;

    /// Once, when stopped from outside: gives back what others could use
    /// sooner than by waiting for it to lapse (a lease, say).
    fn stopped(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// The longest pause after failed steps.
pub const MAX_FAILURE_PAUSE: Duration = Duration::from_secs(60);

/// The pause before the next step after `failures` failed steps in a row.
pub fn failure_pause(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(500).saturating_mul(1 << (failures - 1).min(7)).min(MAX_FAILURE_PAUSE)
}

/// Where a running worker is: its state, and how many of its steps failed in
/// a row. Cheap to clone; read by `/readyz` and by tests.
#[derive(Debug, Clone)]
pub struct WorkerStatus {
    /// The service it works for, named in its log lines (several services
    /// share one process under `revstore up`).
    service: &'static str,
    name: &'static str,
    inner: Arc<Mutex<StatusInner>>,
}

#[derive(Debug, Clone, Copy)]
struct StatusInner {
    state: WorkerState,
    failures_in_a_row: u32,
}

impl WorkerStatus {
    fn new(service: &'static str, name: &'static str) -> Self {
        let status =
            WorkerStatus { service, name, inner: Arc::new(Mutex::new(StatusInner { state: WorkerState::Busy, failures_in_a_row: 0 })) };
        status.set_state(WorkerState::Busy);
        status
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn state(&self) -> WorkerState {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).state
    }

    pub fn failures_in_a_row(&self) -> u32 {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).failures_in_a_row
    }

    fn set_state(&self, state: WorkerState) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).state = state;
        for each in WorkerState::ALL {
            metrics::gauge!("worker_state", "service" => self.service, "worker" => self.name, "state" => each.name())
                .set(if each == state { 1.0 } else { 0.0 });
        }
    }

    fn set_failures(&self, failures: u32) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).failures_in_a_row = failures;
    }
}

/// Starts `worker` of `service` on the runtime; see [`run_worker`].
pub fn spawn_worker<W: Worker>(service: &'static str, worker: W, stop: CancellationToken) -> (WorkerStatus, tokio::task::JoinHandle<()>) {
    let status = WorkerStatus::new(service, worker.name());
    let handle = tokio::spawn(run_worker(worker, stop, status.clone()));
    (status, handle)
}

/// Runs `worker` until it is done or `stop` is cancelled (see the module
/// documentation).
pub async fn run_worker<W: Worker>(mut worker: W, stop: CancellationToken, status: WorkerStatus) {
    let name = worker.name();
    let service = status.service;
    let mut failures: u32 = 0;
    loop {
        if stop.is_cancelled() {
            break;
        }
        let outcome = worker.work(&stop).await;
        if stop.is_cancelled() {
            break;
        }
        match outcome {
            Ok(state) => {
                metrics::counter!("worker_steps_total", "service" => service, "worker" => name, "outcome" => state.name()).increment(1);
                if failures > 0 {
                    tracing::info!(service, worker = name, failures, "worker steps succeed again");
                    failures = 0;
                    status.set_failures(0);
                }
                status.set_state(state);
                match state {
                    WorkerState::Busy => tokio::task::yield_now().await,
                    WorkerState::Idle => {
                        tokio::select! {
                            () = stop.cancelled() => break,
                            () = worker.wait_for_work() => {}
                        }
                    }
                    WorkerState::Done => return,
                }
            }
            Err(error) => {
                metrics::counter!("worker_steps_total", "service" => service, "worker" => name, "outcome" => "failed").increment(1);
                failures = failures.saturating_add(1);
                status.set_failures(failures);
                let pause = failure_pause(failures);
                if failures == 1 {
                    tracing::warn!(service, worker = name, error = %error, "worker step failed; retrying with a growing pause, logged again once steps succeed");
                } else {
                    tracing::debug!(service, worker = name, error = %error, pause_secs = pause.as_secs_f64(), "worker step failed again");
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
    // Stopped from outside: the worker's state stays what it was, but it no
    // longer runs.
    worker.stopped().await;
    status.set_state(WorkerState::Done);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails `fail` times, then is busy `busy` times, then idle until woken
    /// `idle` times, then done.
    struct Scripted {
        fail: u32,
        busy: u32,
        idle: u32,
        steps: Arc<Mutex<Vec<&'static str>>>,
        wake: Arc<tokio::sync::Notify>,
    }

    impl Worker for Scripted {
        fn name(&self) -> &'static str {
            "scripted"
        }

        async fn work(&mut self, _stop: &CancellationToken) -> Result<WorkerState, BoxError> {
            let (step, result): (&'static str, Result<WorkerState, BoxError>) = if self.fail > 0 {
                self.fail -= 1;
                ("failed", Err("storage unavailable".into()))
            } else if self.busy > 0 {
                self.busy -= 1;
                ("busy", Ok(WorkerState::Busy))
            } else if self.idle > 0 {
                self.idle -= 1;
                ("idle", Ok(WorkerState::Idle))
            } else {
                ("done", Ok(WorkerState::Done))
            };
            self.steps.lock().unwrap().push(step);
            result
        }

        async fn wait_for_work(&mut self) {
            self.wake.notified().await;
        }
    }

    fn scripted(fail: u32, busy: u32, idle: u32) -> (Scripted, Arc<Mutex<Vec<&'static str>>>, Arc<tokio::sync::Notify>) {
        let steps = Arc::new(Mutex::new(Vec::new()));
        let wake = Arc::new(tokio::sync::Notify::new());
        (Scripted { fail, busy, idle, steps: steps.clone(), wake: wake.clone() }, steps, wake)
    }

    #[test]
    fn pauses_grow_from_half_a_second_to_a_minute() {
        let pauses: Vec<u64> = (0..10).map(|n| failure_pause(n).as_millis() as u64).collect();
        assert_eq!(pauses, [0, 500, 1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000]);
    }

    /// Time is paused: the runner's pauses pass at once, and are measured
    /// exactly on the test's clock.
    #[tokio::test(start_paused = true)]
    async fn failures_pause_then_busy_steps_run_back_to_back_then_idle_waits_for_a_wake_up() {
        let (worker, steps, wake) = scripted(3, 2, 1);
        let started = tokio::time::Instant::now();
        let (status, handle) = spawn_worker("test", worker, CancellationToken::new());
        // Three failures: pauses of 0.5 + 1 + 2 s, then two busy steps and an idle one.
        while status.state() != WorkerState::Idle {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let paused = started.elapsed().as_millis();
        assert!((3500..=3600).contains(&paused), "paused {paused} ms");
        assert_eq!(status.failures_in_a_row(), 0);
        assert_eq!(*steps.lock().unwrap(), ["failed", "failed", "failed", "busy", "busy", "idle"]);
        // Idle until woken, however long that is.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(steps.lock().unwrap().len(), 6);
        wake.notify_one();
        handle.await.unwrap();
        assert_eq!(steps.lock().unwrap().last(), Some(&"done"));
        assert_eq!(status.state(), WorkerState::Done);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_pause_and_the_wait() {
        for (fail, idle) in [(5, 0), (0, 5)] {
            let (worker, steps, _wake) = scripted(fail, 0, idle);
            let stop = CancellationToken::new();
            let (status, handle) = spawn_worker("test", worker, stop.clone());
            tokio::time::sleep(Duration::from_millis(10)).await;
            stop.cancel();
            handle.await.unwrap();
            assert_eq!(steps.lock().unwrap().len(), 1, "one step, then the stop");
            assert_eq!(status.state(), WorkerState::Done);
        }
    }
}
