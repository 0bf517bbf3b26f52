//! The soak's targets and the verdicts that fail it (`benches/soak.rs`).
//!
//! The targets are fixed before a run: a verdict is met, missed, or not
//! judged, and a target the run should have judged but could not (too few
//! samples, a node figure that could not be read, no full janitor run) fails
//! the run like a missed one. Only a target whose window the run's length,
//! known before it started, cannot hold (a janitor task's days 9-11 in a
//! week) is left to the longer runs, and the report says which.

use std::fmt::Write as _;
use std::time::Duration;

/// The fewest samples a p99 is read from: below it, a p99 is the slowest one
/// or two samples.
pub const MIN_P99_SAMPLES: usize = 100;

/// How much a figure may grow over a run: 1.2x.
pub const GROWTH_ALLOWED: f64 = 1.2;

/// The days (0-based) of the latency baseline: simulated days 2-4, after the
/// first grace period (until it has passed, nothing superseded has left a
/// page's partition).
pub const LATENCY_BASELINE: std::ops::RangeInclusive<usize> = 1..=3;

/// The days (0-based) of a janitor task's baseline: simulated days 9-11.
pub const JANITOR_BASELINE: std::ops::RangeInclusive<usize> = 8..=10;

/// The shortest run whose last three days follow a baseline ending on `last_baseline_day`.
pub const fn days_needed(last_baseline_day: usize) -> usize {
    last_baseline_day + 4
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Met,
    Missed,
    /// The run should have judged it and could not: a failure.
    NotJudged(String),
    /// The run is too short for the target's window (known before it started).
    Beyond {
        needs_days: usize,
    },
}

/// Every target's verdict in a run, in the order judged.
#[derive(Debug, Default)]
pub struct Verdicts {
    verdicts: Vec<(String, String, Outcome)>,
    run_days: usize,
}

impl Verdicts {
    /// Verdicts of a run of `run_days` simulated days.
    pub fn new(run_days: usize) -> Verdicts {
        Verdicts { verdicts: Vec::new(), run_days }
    }

    /// Whether the run is long enough for a target needing `needs_days`;
    /// records the target as beyond it when not.
    pub fn within_run(&mut self, target: &str, needs_days: usize) -> bool {
        if self.run_days >= needs_days {
            return true;
        }
        self.verdicts.push((target.to_owned(), String::new(), Outcome::Beyond { needs_days }));
        false
    }

    /// `target` judged: `measured` says the figures, `ok` whether they meet it.
    pub fn judge(&mut self, target: &str, measured: impl Into<String>, ok: bool) {
        self.verdicts.push((target.to_owned(), measured.into(), if ok { Outcome::Met } else { Outcome::Missed }));
    }

    /// `target` could not be judged, for `why`: the run fails.
    pub fn not_judged(&mut self, target: &str, why: impl Into<String>) {
        self.verdicts.push((target.to_owned(), String::new(), Outcome::NotJudged(why.into())));
    }

    /// Every target the run could judge met, and every other left to a longer run.
    pub fn passed(&self) -> bool {
        self.verdicts.iter().all(|(_, _, o)| matches!(o, Outcome::Met | Outcome::Beyond { .. }))
    }

    /// One line per target, then a line of the counts.
    pub fn report(&self) -> String {
        let mut out = String::new();
        for (target, measured, outcome) in &self.verdicts {
            let measured = if measured.is_empty() { String::new() } else { format!(": {measured}") };
            let _ = match outcome {
                Outcome::Met => writeln!(out, "{target}{measured}: met"),
                Outcome::Missed => writeln!(out, "{target}{measured}: NOT MET"),
                Outcome::NotJudged(why) => writeln!(out, "{target}: NOT JUDGED ({why}): a failure"),
                Outcome::Beyond { needs_days } => {
                    writeln!(out, "{target}: left to a longer run (needs {needs_days} simulated days, this run {})", self.run_days)
                }
            };
        }
        let count = |f: fn(&Outcome) -> bool| self.verdicts.iter().filter(|(_, _, o)| f(o)).count();
        let _ = writeln!(
            out,
            "soak targets: {} met, {} missed or not judged, {} left to a longer run: {}",
            count(|o| *o == Outcome::Met),
            count(|o| matches!(o, Outcome::Missed | Outcome::NotJudged(_))),
            count(|o| matches!(o, Outcome::Beyond { .. })),
            if self.passed() { "passed" } else { "FAILED" }
        );
        out
    }
}

/// The 99th percentile of `samples`, in milliseconds (NaN for none).
pub fn p99_ms(samples: &[Duration]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort();
    match sorted.len() {
        0 => f64::NAN,
        n => sorted[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1].as_secs_f64() * 1000.0,
    }
}

/// `(day, p99)` points through a run's days: each day's p99, consecutive days
/// pooled until they hold [`MIN_P99_SAMPLES`] (placed at their mean day; a
/// short tail joins the last point).
pub fn pooled_daily_p99s(days: &[Vec<Duration>]) -> Vec<(f64, f64)> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    for day in 0..days.len() {
        current.push(day);
        if current.iter().map(|d| days[*d].len()).sum::<usize>() >= MIN_P99_SAMPLES {
            groups.push(std::mem::take(&mut current));
        }
    }
    match groups.last_mut() {
        Some(last) => last.extend(current),
        None if !current.is_empty() => groups.push(current),
        None => {}
    }
    groups
        .iter()
        .map(|g| {
            let pooled: Vec<Duration> = g.iter().flat_map(|d| days[*d].iter().copied()).collect();
            (g.iter().sum::<usize>() as f64 / g.len() as f64, p99_ms(&pooled))
        })
        .collect()
}

/// A least-squares line through `(x, y)` points: its value at `to` over its
/// value at `from` (`None` for fewer than three points or a line not
/// positive at `from`).
pub fn fitted_growth(points: &[(f64, f64)], from: f64, to: f64) -> Option<f64> {
    if points.len() < 3 {
        return None;
    }
    let n = points.len() as f64;
    let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let slope = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>() / sxx;
    let at = |x: f64| my + slope * (x - mx);
    (at(from) > 0.0).then(|| at(to) / at(from))
}

/// One operation's latency over a run, judged: the p99 of the last three
/// days over that of days 2-4, and the fitted line through the daily p99s
/// from the first day to the last, each at most [`GROWTH_ALLOWED`], each
/// window holding at least [`MIN_P99_SAMPLES`]. `days[i]` holds day i's samples.
pub fn judge_latency(verdicts: &mut Verdicts, operation: &str, days: &[Vec<Duration>]) {
    let target = format!("{operation}: p99 of the last three days and the daily p99s' fitted line within {GROWTH_ALLOWED}x of days 2-4's");
    if !verdicts.within_run(&target, days_needed(*LATENCY_BASELINE.end())) {
        return;
    }
    let pooled = |range: std::ops::Range<usize>| -> Vec<Duration> { days[range].iter().flatten().copied().collect() };
    let baseline = pooled(*LATENCY_BASELINE.start()..LATENCY_BASELINE.end() + 1);
    let last = pooled(days.len() - 3..days.len());
    if baseline.len() < MIN_P99_SAMPLES || last.len() < MIN_P99_SAMPLES {
        verdicts.not_judged(
            &target,
            format!("{} samples in days 2-4, {} in the last three; a p99 needs {MIN_P99_SAMPLES}", baseline.len(), last.len()),
        );
        return;
    }
    let points: Vec<(f64, f64)> = pooled_daily_p99s(days).into_iter().filter(|(_, p99)| p99.is_finite()).collect();
    if points.len() < 3 {
        verdicts.not_judged(&target, format!("{} pooled daily p99s; a line needs three", points.len()));
        return;
    }
    // A line at or below zero on the first day rises from nothing: unbounded growth.
    let line = fitted_growth(&points, 0.0, (days.len() - 1) as f64).unwrap_or(f64::INFINITY);
    let (from, to) = (p99_ms(&baseline), p99_ms(&last));
    let windows = to / from;
    let series: Vec<String> = points.iter().map(|(_, p99)| format!("{p99:.1}")).collect();
    verdicts.judge(
        &target,
        format!(
            "days 2-4 {from:.1} ms ({} samples), last three {to:.1} ms ({}): {windows:.2}; fitted line through the p99s {} ms, day {} over day 1, {line:.2}",
            baseline.len(),
            last.len(),
            series.join(", "),
            days.len()
        ),
        windows <= GROWTH_ALLOWED && line <= GROWTH_ALLOWED,
    );
}

/// One janitor task's routine work over a run: the mean partitions a day of
/// the last three days at most [`GROWTH_ALLOWED`] times that of days 9-11.
/// `per_day[i]` is what the task's routine runs visited on day i.
pub fn judge_janitor_task(verdicts: &mut Verdicts, task: &str, per_day: &[u64]) {
    let target = format!("janitor's {task}: routine work of the last three days within {GROWTH_ALLOWED}x of days 9-11's");
    if !verdicts.within_run(&target, days_needed(*JANITOR_BASELINE.end())) {
        return;
    }
    let mean = |days: &[u64]| days.iter().sum::<u64>() as f64 / days.len() as f64;
    let (from, to) = (mean(&per_day[JANITOR_BASELINE]), mean(&per_day[per_day.len() - 3..]));
    if from == 0.0 {
        verdicts.not_judged(&target, "no routine work on days 9-11");
        return;
    }
    verdicts.judge(
        &target,
        format!("{from:.0} partitions a day on days 9-11, {to:.0} on the last three: {:.2}", to / from),
        to <= from * GROWTH_ALLOWED,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn days_of(p99s_ms: &[u64], per_day: usize) -> Vec<Vec<Duration>> {
        // A day of `per_day` samples: all at 1 ms but its last 2%, at the day's figure.
        p99s_ms
            .iter()
            .map(|ms| (0..per_day).map(|i| Duration::from_millis(if i * 50 >= per_day * 49 { *ms } else { 1 })).collect())
            .collect()
    }

    #[test]
    fn a_flat_week_meets_the_latency_target_and_a_growing_one_misses_it() {
        let mut verdicts = Verdicts::new(7);
        judge_latency(&mut verdicts, "reads", &days_of(&[10, 10, 11, 10, 10, 11, 10], 200));
        assert!(verdicts.passed(), "{}", verdicts.report());
        judge_latency(&mut verdicts, "writes", &days_of(&[10, 10, 11, 12, 13, 14, 15], 200));
        assert!(!verdicts.passed());
        assert!(verdicts.report().contains("writes: p99") && verdicts.report().contains("NOT MET"), "{}", verdicts.report());
    }

    #[test]
    fn a_fitted_line_that_grows_fails_even_when_the_windows_do_not() {
        // Days 2-4 are slow and the rest climb: the windows compare equal, the line does not.
        let mut verdicts = Verdicts::new(9);
        judge_latency(&mut verdicts, "reads", &days_of(&[5, 20, 20, 20, 12, 14, 16, 19, 20], 200));
        assert!(!verdicts.passed(), "{}", verdicts.report());
    }

    #[test]
    fn a_last_day_that_stalls_misses_the_target_whatever_the_line_starts_at() {
        // One stalled day tilts the line below zero on the first: growth without bound.
        let mut verdicts = Verdicts::new(7);
        judge_latency(&mut verdicts, "writes", &days_of(&[14, 14, 12, 15, 13, 11, 670], 200));
        assert!(!verdicts.passed(), "{}", verdicts.report());
        assert!(verdicts.report().contains("NOT MET"), "{}", verdicts.report());
    }

    #[test]
    fn too_few_samples_fail_the_run_and_a_short_run_leaves_a_long_window_to_a_longer_one() {
        let mut verdicts = Verdicts::new(7);
        judge_latency(&mut verdicts, "listings", &days_of(&[10; 7], 20));
        assert!(!verdicts.passed());
        assert!(verdicts.report().contains("NOT JUDGED"), "{}", verdicts.report());

        let mut short = Verdicts::new(7);
        judge_janitor_task(&mut short, "retention", &[100; 7]);
        assert!(short.passed(), "a week cannot hold days 9-11 and the last three: {}", short.report());
        assert!(short.report().contains("needs 14 simulated days"), "{}", short.report());
    }

    #[test]
    fn a_janitor_task_whose_work_grows_misses_its_target() {
        let flat = [100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 105, 110, 100, 100];
        let mut verdicts = Verdicts::new(flat.len());
        judge_janitor_task(&mut verdicts, "retention", &flat);
        assert!(verdicts.passed(), "{}", verdicts.report());
        let mut growing = flat;
        growing[12..].copy_from_slice(&[130, 125, 140]);
        judge_janitor_task(&mut verdicts, "hand-off check", &growing);
        assert!(!verdicts.passed(), "{}", verdicts.report());
    }

    #[test]
    fn pooled_p99s_join_thin_days_and_p99_is_the_slowest_of_a_hundreds_top_percent() {
        let thin = days_of(&[10; 6], 40);
        // Forty a day: three days make a point, the tail joins the last.
        let points = pooled_daily_p99s(&thin);
        assert_eq!(points.len(), 2, "{points:?}");
        let hundred: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(p99_ms(&hundred), 99.0);
        assert!(p99_ms(&[]).is_nan());
    }
}
