//! Conditional writes (lightweight transactions) on Cassandra, and what to do
//! when Cassandra cannot say whether one was applied.
//!
//! A Paxos round that times out (`WriteTimeout` with write type CAS, a
//! client-side timeout, a connection lost after sending) leaves the outcome
//! unknown: the proposal may have been accepted by a quorum, by some replicas,
//! or by none. On a busy cluster this happens to ordinary contended writes (24
//! writers racing for one lease on three nodes of a 2-core machine), so it must
//! not surface as "unavailable": the janitor would drop a lease it holds,
//! old-store would give up a slot it took. Instead the engine settles it:
//!
//! 1. A read at SERIAL consistency runs Paxos on the partition, so it completes
//!    or supersedes any round still in flight (Cassandra has made such reads
//!    linearizable since CASSANDRA-12126); after it, what it returned is what
//!    every later reader sees.
//! 2. Every effect of the write visible: applied. The condition still holding
//!    on what is there now: not applied, and safe to send again (it cannot
//!    apply twice, since a later round would see the first one's effects).
//! 3. Otherwise another writer moved the partition on. The write's rows other
//!    than the condition row are the attempt's own (old-store's slot row, a
//!    claimed counter position): if they all hold its values, it applied;
//!    if one is missing or holds another writer's values, it did not. A write
//!    to the condition row alone (a lease, a lock) applied if that row holds
//!    its values.
//!
//! The rule in 3 relies on callers' conditions being on values that move
//! forward (counters, clocks, compaction positions, owners unique to a run),
//! which every conditional write in revstore is; a round that cannot be settled
//! in [`ATTEMPTS`] sends is reported unavailable, with the outcome unknown. So
//! is one whose SERIAL read-back the coordinator refuses because it knows too
//! few replicas are alive: with a site cut off, a SERIAL round cannot settle
//! until the link returns, and the caller is told at once rather than after
//! a minute of retries.

use std::time::Duration;

use rand::Rng;
use scylla::errors::{DbError, ExecutionError, RequestAttemptError};
use scylla::frame::types::{Consistency, SerialConsistency};
use scylla::response::query_result::QueryResult;

use super::CassandraEngine;
use super::cql::{self, Statement};
use crate::error::{StoreError, StoreResult};
use crate::ops::{Cas, CasOutcome, Condition, DeleteTarget, ReadQuery, Serialized, Slice, Upsert, Write};
use crate::value::{Row, Value};
use revstore_schema::ColumnKind;

/// Sends of one conditional write whose outcome was unknown (or whose
/// condition check timed out) each time, at most.
const ATTEMPTS: usize = 4;

/// How long SERIAL reads may go on trying to settle one unknown outcome, with
/// pauses doubling from 50 ms to 2 s between them: the read contends with the
/// same writers, and each of its rounds may itself wait out the server's
/// `cas_contention_timeout` (5 s here) before failing. Eight writers racing for
/// one counter beside the rest of the conformance suite, on three nodes of one
/// 2-core machine, needed up to 8 reads over 5.3 s, where a bound of 8 reads
/// had failed the suite; a partition still unsettled after a minute is unavailable.
const SETTLE_FOR: Duration = Duration::from_secs(60);

/// What a SERIAL read-back says about a conditional write whose outcome was unknown.
#[derive(Debug, PartialEq)]
enum Settled {
    Applied,
    /// Not applied; `current` as [`CasOutcome::current`].
    NotApplied(Option<Row>),
    /// Not applied, and the condition still holds: the write can be sent again.
    ConditionHolds,
}

impl CassandraEngine {
    pub(super) async fn conditional_write(&self, c: Cas) -> StoreResult<CasOutcome> {
        let statements = self.cas_statements(&c)?;
        let serial = self.serial_of(c.serialized);
        let mut last_unknown = None;
        for _ in 0..ATTEMPTS {
            let sent = match statements.as_slice() {
                [only] => self.send_at(only, Some(serial)).await?,
                _ => self.send_batch_at(&statements, true, Some(serial)).await?,
            };
            let error = match sent {
                Ok(result) => return self.reported_outcome(&c, result),
                Err(e) if outcome_unknown(&e) => e,
                Err(e) if condition_check_timed_out(&e) => {
                    // Nothing was proposed: the round stopped reading the
                    // condition, behind the same contention. Send it again.
                    last_unknown = Some(e);
                    let pause = Duration::from_millis(rand::rng().random_range(20..100));
                    tokio::time::sleep(pause).await;
                    continue;
                }
                Err(e) => return Err(super::execution_error(e)),
            };
            metrics::counter!("storage_cas_unknown_outcomes_total", "service" => self.metrics_service, "engine" => "cassandra")
                .increment(1);
            match self.settle_with_retries(&c).await? {
                Settled::Applied => return Ok(CasOutcome { applied: true, current: None }),
                Settled::NotApplied(current) => return Ok(CasOutcome { applied: false, current }),
                Settled::ConditionHolds => {
                    // The round lost to contention: let the other writers through first.
                    last_unknown = Some(error);
                    let pause = Duration::from_millis(rand::rng().random_range(20..100));
                    tokio::time::sleep(pause).await;
                }
            }
        }
        let why = last_unknown.map(|e| e.to_string()).unwrap_or_default();
        Err(StoreError::Unavailable(format!(
            "a conditional write on {} timed out {ATTEMPTS} times without being applied: {why}",
            c.table.name
        )))
    }

    fn cas_statements(&self, c: &Cas) -> StoreResult<Vec<Statement>> {
        let mut statements = Vec::with_capacity(c.writes.len() + 1);
        let condition_key: Vec<Value> = c.partition.iter().cloned().chain(c.clustering.iter().flatten().cloned()).collect();
        match &c.condition {
            Condition::NotExists => {
                for w in &c.writes {
                    let is_condition_row = matches!(w, Write::Upsert(u) if u.key == condition_key);
                    statements.push(match w {
                        Write::Upsert(u) if is_condition_row => cql::insert(&self.keyspace, u, true),
                        other => self.statement_for(other),
                    });
                }
            }
            Condition::Equals(expected) => {
                // The condition rides on the write to the condition row when there is
                // one: a separate carrier writing the same cell with the same (Paxos)
                // timestamp would conflict with it.
                let carrier = c.writes.iter().position(|w| matches!(w, Write::Upsert(u) if u.key == condition_key && !u.cells.is_empty()));
                // Or the delete of the condition row, which carries it as `DELETE ... IF`.
                let deletes_condition_row = |w: &Write| match w {
                    Write::Delete(d) => match &d.target {
                        DeleteTarget::Row(ck) => d.partition.iter().chain(ck).eq(condition_key.iter()),
                        DeleteTarget::Partition => c.table.clustering().next().is_none() && d.partition == condition_key,
                        DeleteTarget::Range(_) => false,
                    },
                    Write::Upsert(_) => false,
                };
                let deleting = if carrier.is_none() { c.writes.iter().position(deletes_condition_row) } else { None };
                if let Some(i) = deleting {
                    let Write::Delete(d) = &c.writes[i] else { unreachable!("position matched a delete") };
                    statements.push(cql::conditional_delete(&self.keyspace, d, expected));
                    statements.extend(c.writes.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, w)| self.statement_for(w)));
                }
                match carrier {
                    _ if deleting.is_some() => {}
                    Some(i) => {
                        let Write::Upsert(u) = &c.writes[i] else { unreachable!("position matched an upsert") };
                        statements.push(cql::conditional_update(&self.keyspace, u, expected));
                        for (j, w) in c.writes.iter().enumerate() {
                            // A row's INSERT stays too, for its liveness marker (same values).
                            if j != i || u.key.len() > c.partition.len() || c.table.clustering().next().is_none() {
                                statements.push(self.statement_for(w));
                            }
                        }
                    }
                    None => {
                        let (first, _) = &expected[0];
                        let conflict = c.writes.iter().any(|w| matches!(w, Write::Upsert(u) if u.cells.iter().any(|(n, _)| n == first)));
                        if conflict {
                            return Err(StoreError::invalid(format!(
                                "a conditional batch that sets {first} must do so in the write of the condition row"
                            )));
                        }
                        statements.push(cql::condition_carrier(&self.keyspace, c.table, &condition_key, expected));
                        statements.extend(c.writes.iter().map(|w| self.statement_for(w)));
                    }
                }
            }
        }
        Ok(statements)
    }

    /// The outcome Cassandra reported (`[applied]`, and the current values when not).
    fn reported_outcome(&self, c: &Cas, result: QueryResult) -> StoreResult<CasOutcome> {
        let rows = self.rows(result, c.table)?;
        let applied = rows
            .first()
            .and_then(|(applied, _)| *applied)
            .ok_or_else(|| StoreError::Internal("conditional write answered without [applied]".into()))?;
        let current = if applied {
            None
        } else {
            // Cassandra answers with the current values of the condition row (one row
            // per condition in a batch); nothing when the row does not exist.
            let mut cells: Vec<(&'static str, Value)> = Vec::new();
            for (_, row) in rows {
                for (name, value) in row.columns() {
                    if !value.is_null() && !cells.iter().any(|(n, _)| *n == name) {
                        cells.push((name, value.clone()));
                    }
                }
            }
            let key_only = cells.iter().all(|(n, _)| {
                c.table.column(n).is_some_and(|col| matches!(col.kind, ColumnKind::PartitionKey | ColumnKind::Clustering(_)))
            });
            if key_only { None } else { Some(Row::new(cells)) }
        };
        Ok(CasOutcome { applied, current })
    }

    /// [`Self::settle`], tried again after a jittered pause when the SERIAL read
    /// itself times out: it runs Paxos too, so it meets the contention the write met.
    async fn settle_with_retries(&self, c: &Cas) -> StoreResult<Settled> {
        let deadline = tokio::time::Instant::now() + SETTLE_FOR;
        let mut pause = Duration::from_millis(50);
        for attempt in 1.. {
            match self.settle(c).await {
                // Replicas the SERIAL read needs are known down (a node lost,
                // the other site cut off): no retry settles it while they are.
                Err(e) if super::replicas_known_down(&e) => {
                    return Err(StoreError::Unavailable(format!(
                        "a conditional write on {} timed out and cannot be settled while replicas are down (its outcome is unknown): {e}",
                        c.table.name
                    )));
                }
                Err(StoreError::Unavailable(why)) if tokio::time::Instant::now() + pause < deadline => {
                    tracing::debug!(table = c.table.name, attempt, %why, "settling a conditional write: the SERIAL read failed; trying again");
                    let jittered = pause.mul_f64(rand::rng().random_range(0.5..1.0));
                    tokio::time::sleep(jittered).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                settled => return settled,
            }
        }
        unreachable!("the loop returns")
    }

    /// The serial consistency a conditional write's Paxos runs at.
    fn serial_of(&self, serialized: Serialized) -> SerialConsistency {
        match serialized {
            Serialized::AcrossSites if self.serial_across_sites => SerialConsistency::Serial,
            _ => self.serial_consistency,
        }
    }

    /// Settles a conditional write whose outcome is unknown (see the module's notes).
    async fn settle(&self, c: &Cas) -> StoreResult<Settled> {
        let condition_key: Vec<Value> = c.partition.iter().cloned().chain(c.clustering.iter().flatten().cloned()).collect();
        // Read back at the write's own serial consistency: the same replicas' Paxos.
        let read = match self.serial_of(c.serialized) {
            SerialConsistency::Serial => Consistency::Serial,
            SerialConsistency::LocalSerial => Consistency::LocalSerial,
        };
        let mut all_visible = true;
        let mut condition_row_write = None;
        let mut own_rows = Vec::new();
        for w in &c.writes {
            let visible = self.visible(w, read).await?;
            all_visible &= visible;
            match w {
                Write::Upsert(u) if u.key == condition_key => condition_row_write = Some(visible),
                Write::Upsert(_) => own_rows.push(visible),
                Write::Delete(_) => {}
            }
        }
        let current = if all_visible { None } else { self.condition_row(c, read).await? };
        Ok(settle_by(&c.condition, ReadBack { all_visible, condition_row_write, own_rows, current }))
    }

    /// Whether the effect of `w` is what a SERIAL read finds now.
    async fn visible(&self, w: &Write, read: Consistency) -> StoreResult<bool> {
        match w {
            Write::Upsert(u) => {
                let (row, statics) = self.serial_row(u.table, &u.key, Some(u.cells.iter().map(|(n, _)| *n).collect()), read).await?;
                Ok(upsert_visible(u, row.as_ref(), statics.as_ref()))
            }
            Write::Delete(d) => {
                let slice = match &d.target {
                    DeleteTarget::Row(ck) => Slice::prefix(ck.iter().cloned()),
                    DeleteTarget::Range(slice) => slice.clone(),
                    DeleteTarget::Partition => Slice::all(),
                };
                let query = ReadQuery { slice, limit: Some(1), ..ReadQuery::new(d.table, d.partition.iter().cloned()) };
                let (rows, statics) = self.read_at(&query, None, Some(read)).await?;
                let statics_gone = !matches!(d.target, DeleteTarget::Partition) || statics.is_none();
                Ok(rows.is_empty() && statics_gone)
            }
        }
    }

    /// The row the condition is checked against (the static cells when it names
    /// no row), read at SERIAL.
    async fn condition_row(&self, c: &Cas, read: Consistency) -> StoreResult<Option<Row>> {
        let key: Vec<Value> = c.partition.iter().cloned().chain(c.clustering.iter().flatten().cloned()).collect();
        let (row, statics) = self.serial_row(c.table, &key, None, read).await?;
        Ok(if c.clustering.is_some() { row } else { statics })
    }

    /// One row (by its full key) and the partition's static cells, read at SERIAL.
    async fn serial_row(
        &self,
        table: &'static revstore_schema::TableDef,
        key: &[Value],
        columns: Option<Vec<&'static str>>,
        read: Consistency,
    ) -> StoreResult<(Option<Row>, Option<Row>)> {
        let pk_len = table.partition_key().count().min(key.len());
        let (partition, clustering) = key.split_at(pk_len);
        let query = ReadQuery {
            slice: Slice::prefix(clustering.iter().cloned()),
            limit: Some(1),
            columns,
            ..ReadQuery::new(table, partition.iter().cloned())
        };
        let (rows, statics) = self.read_at(&query, None, Some(read)).await?;
        // A partition-only key on a table with clustering columns names no row.
        let names_a_row = clustering.len() == table.clustering().count();
        Ok((rows.into_iter().next().filter(|_| names_a_row), statics))
    }
}

/// What the SERIAL read-back found of a conditional write's effects.
#[derive(Debug)]
struct ReadBack {
    /// Every upsert's cells hold its values and every deleted row is gone.
    all_visible: bool,
    /// Whether the write to the condition row (if the write has one) is visible.
    condition_row_write: Option<bool>,
    /// Whether each write to a row other than the condition row is visible.
    own_rows: Vec<bool>,
    /// The condition row now (unread when everything is visible).
    current: Option<Row>,
}

/// The rules of the module's notes, steps 2 and 3.
fn settle_by(condition: &Condition, found: ReadBack) -> Settled {
    if found.all_visible {
        return Settled::Applied;
    }
    if condition_holds(condition, found.current.as_ref()) {
        return Settled::ConditionHolds;
    }
    let applied = if found.own_rows.is_empty() { found.condition_row_write.unwrap_or(false) } else { found.own_rows.iter().all(|v| *v) };
    if applied { Settled::Applied } else { Settled::NotApplied(found.current) }
}

/// Whether every cell `u` sets holds its value (static cells among the
/// partition's statics, the others in the row, which must exist).
fn upsert_visible(u: &Upsert, row: Option<&Row>, statics: Option<&Row>) -> bool {
    let names_a_row = u.key.len() > u.table.partition_key().count() || u.table.clustering().next().is_none();
    if names_a_row && row.is_none() {
        return false;
    }
    u.cells.iter().all(|(name, value)| {
        let is_static = u.table.column(name).is_some_and(|c| matches!(c.kind, ColumnKind::Static));
        let held = if is_static { statics } else { row };
        held.and_then(|r| r.get(name)).unwrap_or(&Value::Null) == value
    })
}

fn condition_holds(condition: &Condition, current: Option<&Row>) -> bool {
    match condition {
        Condition::NotExists => current.is_none(),
        Condition::Equals(expected) => {
            expected.iter().all(|(name, value)| current.and_then(|r| r.get(name)).unwrap_or(&Value::Null) == value)
        }
    }
}

/// Whether a failed send may still have been applied: the coordinator took the
/// write and did not say how it ended. Refusals before any replica was asked
/// (unavailable, overloaded, a read timeout of the condition check) are not.
fn outcome_unknown(e: &ExecutionError) -> bool {
    match e {
        ExecutionError::RequestTimeout(_) => true,
        ExecutionError::LastAttemptError(attempt) => matches!(
            attempt,
            RequestAttemptError::DbError(DbError::WriteTimeout { .. } | DbError::WriteFailure { .. }, _)
                | RequestAttemptError::BrokenConnectionError(_)
        ),
        _ => false,
    }
}

/// Whether a conditional write failed reading its condition (a Paxos round's
/// read at quorum timed out): before any proposal, so it was not applied and
/// can be sent again. Three nodes on a busy machine time out this way under
/// contention, as they time out proposing.
fn condition_check_timed_out(e: &ExecutionError) -> bool {
    matches!(e, ExecutionError::LastAttemptError(RequestAttemptError::DbError(DbError::ReadTimeout { .. }, _)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(n: i64) -> Option<Row> {
        Some(Row::new(vec![("count", Value::BigInt(n))]))
    }

    fn count_was(n: i64) -> Condition {
        Condition::Equals(vec![("count", Value::BigInt(n))])
    }

    #[test]
    fn a_write_whose_effects_are_all_there_applied() {
        let found = ReadBack { all_visible: true, condition_row_write: Some(true), own_rows: vec![true], current: None };
        assert_eq!(settle_by(&count_was(4), found), Settled::Applied);
    }

    #[test]
    fn a_condition_that_still_holds_means_not_applied_and_safe_to_send_again() {
        let found = ReadBack { all_visible: false, condition_row_write: Some(false), own_rows: vec![false], current: count(4) };
        assert_eq!(settle_by(&count_was(4), found), Settled::ConditionHolds);
        let lease_free = ReadBack { all_visible: false, condition_row_write: Some(false), own_rows: vec![], current: None };
        assert_eq!(settle_by(&Condition::NotExists, lease_free), Settled::ConditionHolds);
    }

    #[test]
    fn another_writer_that_set_the_same_counter_value_is_not_this_write() {
        // Both read 4 and set 5; the other won, so the counter shows this
        // write's value but slot 5's row holds the other writer's.
        let found = ReadBack { all_visible: false, condition_row_write: Some(true), own_rows: vec![false], current: count(5) };
        assert_eq!(settle_by(&count_was(4), found), Settled::NotApplied(count(5)));
    }

    #[test]
    fn a_write_whose_own_rows_are_there_applied_though_the_counter_moved_on() {
        // old-store's slot claim: it took slot 4, a later writer moved the count to 6.
        let found = ReadBack { all_visible: false, condition_row_write: Some(false), own_rows: vec![true], current: count(6) };
        assert_eq!(settle_by(&count_was(4), found), Settled::Applied);
    }

    #[test]
    fn a_single_row_write_is_judged_by_that_row() {
        let lease = |owner: &str| Some(Row::new(vec![("owner", Value::from(owner))]));
        let ours = ReadBack { all_visible: false, condition_row_write: Some(true), own_rows: vec![], current: lease("me") };
        assert_eq!(settle_by(&Condition::NotExists, ours), Settled::Applied);
        let theirs = ReadBack { all_visible: false, condition_row_write: Some(false), own_rows: vec![], current: lease("other") };
        assert_eq!(settle_by(&Condition::NotExists, theirs), Settled::NotApplied(lease("other")));
    }

    #[test]
    fn only_writes_that_may_have_reached_a_replica_are_unknown() {
        use scylla::errors::WriteType;
        use scylla::frame::types::Consistency;
        let db = |e: DbError| ExecutionError::LastAttemptError(RequestAttemptError::DbError(e, "message".into()));
        let timeout_of_the_proposal =
            || DbError::WriteTimeout { consistency: Consistency::LocalSerial, received: 1, required: 2, write_type: WriteType::Cas };
        assert!(outcome_unknown(&db(timeout_of_the_proposal())));
        assert!(outcome_unknown(&ExecutionError::RequestTimeout(std::time::Duration::from_secs(10))));
        let unavailable = DbError::Unavailable { consistency: Consistency::LocalSerial, required: 2, alive: 1 };
        assert!(!outcome_unknown(&db(unavailable.clone())));
        assert!(!outcome_unknown(&db(DbError::Overloaded)));
        // A timed-out read of the condition was never proposed: not unknown, sent again.
        let condition_read = DbError::ReadTimeout { consistency: Consistency::LocalQuorum, received: 1, required: 2, data_present: true };
        assert!(!outcome_unknown(&db(condition_read.clone())));
        assert!(condition_check_timed_out(&db(condition_read)));
        assert!(!condition_check_timed_out(&db(unavailable)));
        assert!(!condition_check_timed_out(&db(timeout_of_the_proposal())));
    }
}
