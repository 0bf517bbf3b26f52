//! A linearizability checker for one page's latest render, as one site serves it.
//!
//! The model is a *max register*: a write offers a version (revision, then
//! render time), and a read returns the highest version written so far (or
//! none). current-store is one: the latest render is the first row in
//! clustering order, whatever order the writes arrive in. A history is
//! linearizable if each operation can be given a point within its interval
//! (from invocation to completion) such that, in the order of the points,
//! every read returns the highest version of the writes before it.
//!
//! For a max register that reduces to ordering constraints, so the check is
//! exact and polynomial (no search over interleavings, as a general checker
//! such as porcupine needs):
//! - a read that returned version `x` comes after the write of `x`;
//! - it comes before every write of a version above `x` (a read of nothing,
//!   before every write);
//! - and each operation's point lies within its interval.
//!
//! The constraints form an acyclic graph (along them versions only rise), so
//! points exist if and only if the earliest schedule — each operation at the
//! latest of its invocation and its predecessors' points — puts none past its
//! completion. [`check`] computes that schedule and reports the first
//! operation it cannot place, with the chain of constraints that pushed it.
//!
//! Which writes take part: an acknowledged write, with its interval; a write
//! whose outcome is unknown (no answer), only if some read returned its
//! version, then with no completion (it may have landed any time after it
//! was sent); a write refused outright, never. A site's history may also hold
//! writes made in the other site: they take part, without a completion, only
//! once a read in this site returned them (replication makes them visible at
//! a time nobody observes).

use std::collections::HashMap;
use std::fmt;

/// A point in a test run's time, in any unit, rising.
pub type Instant = u64;

/// One operation on one page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation<V> {
    pub invoked: Instant,
    /// `None`: no answer came back.
    pub completed: Option<Instant>,
    pub action: Action<V>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<V> {
    /// A write of `version`: `acknowledged` if the store said it was kept;
    /// `refused` if it said it was not (a 4xx), so it never took effect.
    Write { version: V, acknowledged: bool, refused: bool },
    /// A read that returned the highest version it saw (`None`: none).
    Read { returned: Option<V> },
}

/// Why a history is not linearizable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The operation that cannot be placed within its interval (an index into the history).
    pub operation: usize,
    /// The chain of operations whose order forced it past its completion, first to last.
    pub chain: Vec<usize>,
    pub why: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "operation {} cannot be linearized: {} (chain {:?})", self.operation, self.why, self.chain)
    }
}

/// Checks one page's history against the max-register model.
pub fn check<V: Ord + Clone + std::hash::Hash + fmt::Debug>(history: &[Operation<V>]) -> Result<(), Violation> {
    // The writes that take part, by version.
    let observed: std::collections::HashSet<&V> = history
        .iter()
        .filter_map(|op| match &op.action {
            Action::Read { returned: Some(v) } => Some(v),
            _ => None,
        })
        .collect();
    let mut writer_of: HashMap<&V, usize> = HashMap::new();
    let mut takes_part = vec![false; history.len()];
    for (i, op) in history.iter().enumerate() {
        match &op.action {
            Action::Write { version, acknowledged, refused } => {
                if *refused {
                    continue;
                }
                if *acknowledged || observed.contains(version) {
                    takes_part[i] = true;
                    writer_of.insert(version, i);
                }
            }
            Action::Read { .. } => takes_part[i] = op.completed.is_some(),
        }
    }
    // A version read that nobody wrote (or whose write was refused).
    for (i, op) in history.iter().enumerate() {
        if let Action::Read { returned: Some(v) } = &op.action
            && takes_part[i]
            && !writer_of.contains_key(v)
        {
            return Err(Violation { operation: i, chain: vec![i], why: format!("returned {v:?}, which no write offered") });
        }
    }
    // Constraints: `before[j]` lists the operations that must come before j.
    let mut writes: Vec<(&V, usize)> = writer_of.iter().map(|(v, i)| (*v, *i)).collect();
    writes.sort();
    let mut before: Vec<Vec<usize>> = vec![Vec::new(); history.len()];
    for (r, op) in history.iter().enumerate() {
        let Action::Read { returned } = &op.action else { continue };
        if !takes_part[r] {
            continue;
        }
        if let Some(v) = returned {
            before[r].push(writer_of[v]);
        }
        // Every write of a higher version comes after this read.
        let above = match returned {
            Some(v) => writes.partition_point(|(w, _)| *w <= v),
            None => 0,
        };
        for &(_, w) in &writes[above..] {
            before[w].push(r);
        }
    }
    // The earliest schedule, in an order that respects the constraints.
    let order = topological(&before, &takes_part);
    let mut earliest: Vec<Instant> = vec![0; history.len()];
    let mut pushed_by: Vec<Option<usize>> = vec![None; history.len()];
    for &j in &order {
        earliest[j] = history[j].invoked;
        for &i in &before[j] {
            if earliest[i] > earliest[j] {
                earliest[j] = earliest[i];
                pushed_by[j] = Some(i);
            }
        }
        if let Some(completed) = history[j].completed
            && earliest[j] > completed
        {
            let mut chain = vec![j];
            while let Some(p) = pushed_by[*chain.last().expect("not empty")] {
                chain.push(p);
            }
            chain.reverse();
            return Err(Violation {
                operation: j,
                chain,
                why: format!("it completed at {completed}, but what must precede it cannot happen before {}", earliest[j]),
            });
        }
    }
    Ok(())
}

/// The operations taking part, each after every operation it must follow.
/// The constraint graph is acyclic by construction (versions rise along it).
fn topological(before: &[Vec<usize>], takes_part: &[bool]) -> Vec<usize> {
    let n = before.len();
    let mut after: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut waiting: Vec<usize> = vec![0; n];
    for (j, preds) in before.iter().enumerate() {
        for &i in preds {
            after[i].push(j);
            waiting[j] += 1;
        }
    }
    let mut ready: Vec<usize> = (0..n).filter(|&j| takes_part[j] && waiting[j] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop() {
        order.push(i);
        for &j in &after[i] {
            waiting[j] -= 1;
            if waiting[j] == 0 {
                ready.push(j);
            }
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn write(invoked: u64, completed: u64, version: u32) -> Operation<u32> {
        Operation { invoked, completed: Some(completed), action: Action::Write { version, acknowledged: true, refused: false } }
    }

    fn read(invoked: u64, completed: u64, returned: Option<u32>) -> Operation<u32> {
        Operation { invoked, completed: Some(completed), action: Action::Read { returned } }
    }

    #[test]
    fn a_read_after_a_write_returns_it_or_newer() {
        assert!(check(&[write(0, 10, 1), read(11, 12, Some(1))]).is_ok());
        assert!(check(&[write(0, 10, 2), write(0, 10, 1), read(11, 12, Some(2))]).is_ok());
        let stale = check(&[write(0, 10, 1), read(11, 12, None)]).expect_err("stale");
        // The read must precede the write, which then cannot end by its completion.
        assert_eq!((stale.operation, stale.chain.clone()), (0, vec![1, 0]), "{stale}");
    }

    #[test]
    fn a_read_concurrent_with_a_write_may_return_either() {
        assert!(check(&[write(0, 10, 1), read(5, 6, None)]).is_ok());
        assert!(check(&[write(0, 10, 1), read(5, 6, Some(1))]).is_ok());
    }

    #[test]
    fn reads_never_go_back() {
        let history = [write(0, 10, 1), read(5, 6, Some(1)), read(7, 8, None)];
        assert!(check(&history).is_err());
    }

    #[test]
    fn a_lower_version_is_not_served_over_a_higher_one_written_before_it() {
        // Version 2 acknowledged before version 1 was sent: a read of 1 after both is stale...
        let history = [write(0, 2, 2), write(3, 4, 1), read(0, 10, Some(1))];
        // ...even though the read began before either (the case a pairwise check misses).
        assert!(check(&history).is_err());
    }

    #[test]
    fn a_write_with_no_answer_counts_only_once_seen() {
        let lost = Operation { invoked: 0, completed: None, action: Action::Write { version: 5, acknowledged: false, refused: false } };
        assert!(check(&[lost.clone(), read(10, 11, None)]).is_ok());
        assert!(check(&[lost.clone(), read(10, 11, Some(5))]).is_ok());
        assert!(check(&[lost, read(10, 11, Some(5)), read(12, 13, None)]).is_err());
    }

    #[test]
    fn a_version_nobody_wrote_is_a_violation() {
        let refused =
            Operation { invoked: 0, completed: Some(1), action: Action::Write { version: 3, acknowledged: false, refused: true } };
        assert!(check(&[refused, read(2, 3, Some(3))]).is_err());
        assert!(check(&[read(2, 3, Some(9))]).is_err());
    }

    /// Every interleaving of the operations that keeps their real-time order,
    /// tried one by one: the definition, for small histories.
    fn brute_force(history: &[Operation<u32>]) -> bool {
        let n = history.len();
        let end = |op: &Operation<u32>| op.completed.unwrap_or(u64::MAX);
        fn search(history: &[Operation<u32>], placed: &mut Vec<usize>, end: &dyn Fn(&Operation<u32>) -> u64) -> bool {
            let n = history.len();
            if placed.len() == n {
                let mut highest: Option<u32> = None;
                for &i in placed.iter() {
                    match &history[i].action {
                        Action::Write { version, .. } => highest = highest.max(Some(*version)),
                        Action::Read { returned } => {
                            if *returned != highest {
                                return false;
                            }
                        }
                    }
                }
                return true;
            }
            for i in 0..n {
                if placed.contains(&i) {
                    continue;
                }
                // Nothing unplaced may have completed before i was invoked.
                if (0..n).any(|j| j != i && !placed.contains(&j) && end(&history[j]) < history[i].invoked) {
                    continue;
                }
                placed.push(i);
                if search(history, placed, end) {
                    return true;
                }
                placed.pop();
            }
            false
        }
        search(history, &mut Vec::with_capacity(n), &end)
    }

    #[test]
    fn agrees_with_trying_every_interleaving() {
        let mut rng = StdRng::seed_from_u64(7);
        let (mut linearizable, mut not) = (0, 0);
        for _ in 0..3000 {
            let n = rng.random_range(2..=6);
            let mut history = Vec::new();
            let mut version = 0;
            for _ in 0..n {
                let invoked = rng.random_range(0..20);
                let completed = invoked + rng.random_range(0..8);
                if rng.random_bool(0.45) {
                    version += 1;
                    // Versions offered in a random order, as two sites' writers would.
                    let v = if rng.random_bool(0.3) { version + 10 } else { version };
                    history.push(write(invoked, completed, v));
                } else {
                    let written: Vec<u32> = history
                        .iter()
                        .filter_map(|op: &Operation<u32>| match op.action {
                            Action::Write { version, .. } => Some(version),
                            _ => None,
                        })
                        .collect();
                    let returned =
                        if written.is_empty() || rng.random_bool(0.2) { None } else { Some(written[rng.random_range(0..written.len())]) };
                    history.push(read(invoked, completed, returned));
                }
            }
            // Reads of versions written later in the list are fine to keep:
            // a read may be invoked before the write that it returns completes.
            let expected = brute_force(&history);
            assert_eq!(check(&history).is_ok(), expected, "{history:?}");
            if expected { linearizable += 1 } else { not += 1 }
        }
        // Both kinds were tried, many times.
        assert!(linearizable > 300 && not > 300, "{linearizable} linearizable, {not} not");
    }
}
