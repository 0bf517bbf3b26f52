//! One writer at a time per page, and the page's write clock.
//!
//! A change of a page's edges (a `PUT` of its set, a `DELETE`, a mark of
//! renders, a repair) reads what is stored, works out the difference and
//! writes both directions. Two such changes interleaving — two renders of one
//! page racing, a `PUT` beside a `DELETE` — would each diff against a state
//! the other is changing, and leave an edge twice or one direction without
//! the other. So every change runs holding the page's row in
//! `graph_page_writers`, taken by a conditional write (a lightweight
//! transaction on Cassandra, a transaction on the embedded engine) and given
//! back after; a writer that finds it held waits its turn.
//!
//! The row also keeps the page's clock: the write timestamp of the page's last
//! change. A change writes every cell at `max(now, clock + 1)`, so each write
//! of a page lands above every write acknowledged before it, whatever the
//! clocks of the service's replicas, and no time a client sends is ever a
//! write timestamp: a removal always wins over what came before it.
//!
//! A holder that dies lets go after [`HOLD_FOR`]. A change runs as a task of
//! its own, so a client that hangs up does not cut it (and the hold) short.

use std::future::Future;
use std::time::Duration;

use rand::Rng;
use revstore_keys::Domain;
use revstore_schema::tables::dependency_graph::{PAGE_WRITERS, col};
use revstore_storage::{Cas, Condition, Serialized, Site, Upsert, Value};

use crate::error::GraphError;
use crate::graph::Graph;

/// How long a hold lasts unless given back: longer than the largest change
/// (a set of 100,000 edges) takes on a loaded Cassandra.
pub const HOLD_FOR: Duration = Duration::from_secs(60);

/// How long a writer waits for its turn before it is answered 503.
const WAIT_FOR: Duration = Duration::from_secs(10);

/// Waits between tries, doubling from the first to the last (with jitter).
const FIRST_WAIT: Duration = Duration::from_millis(2);
const LONGEST_WAIT: Duration = Duration::from_millis(100);

/// The first clock value at or after `at` that is `site`'s own: with several
/// sites each takes the values congruent to its number modulo their count,
/// so changes of one page made in two sites at once never share a write
/// timestamp (a tie would let the rows of both sets outlive the other's
/// partition delete, see `Graph::diff`).
pub(crate) fn site_clock(at: i64, site: Site) -> i64 {
    let count = i64::from(site.count.max(1));
    at + (i64::from(site.index) - at).rem_euclid(count)
}

/// A page held by this writer: the write timestamp its change uses.
#[derive(Debug)]
struct Held {
    key: [Value; 2],
    holder: String,
    clock: i64,
}

impl Graph {
    /// Runs `change` holding the page `child`, handing it the write timestamp
    /// every write of the change must carry. Answers 503 (`Busy`) when the
    /// page stays held by others for [`WAIT_FOR`].
    pub(crate) async fn changing<T, F, Fut>(&self, domain: &Domain, child: &str, change: F) -> Result<T, GraphError>
    where
        T: Send + 'static,
        F: FnOnce(Graph, i64) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, GraphError>> + Send + 'static,
    {
        let graph = self.clone();
        let key = [Value::from(domain.as_str()), Value::from(child)];
        // The task continues the request's span, so its storage calls stay in the request's trace.
        let span = tracing::Span::current();
        let task = tokio::spawn(tracing::Instrument::instrument(
            async move {
                let held = graph.hold(key).await?;
                let outcome = change(graph.clone(), held.clock).await;
                // Given back whatever the outcome; if that fails, the hold lapses.
                if let Err(e) = graph.give_back(&held).await {
                    tracing::warn!(error = %e, "a page's writer hold was not given back; it lapses by itself");
                }
                outcome
            },
            span,
        ));
        task.await.map_err(GraphError::internal)?
    }

    async fn hold(&self, key: [Value; 2]) -> Result<Held, GraphError> {
        let holder = uuid::Uuid::new_v4().to_string();
        let give_up = tokio::time::Instant::now() + WAIT_FOR;
        let mut wait = FIRST_WAIT;
        loop {
            let row = self.store().get(&PAGE_WRITERS, key.to_vec(), None).await?;
            let current_holder = row.as_ref().and_then(|r| r.text(col::HOLDER)).map(str::to_owned);
            let held_until = row.as_ref().and_then(|r| r.timestamp(col::HELD_UNTIL)).unwrap_or(0);
            let clock = row.as_ref().and_then(|r| r.bigint(col::CLOCK));
            let now = self.store().now_micros();
            let free = current_holder.is_none() || held_until * 1000 <= now;
            if free {
                let next_clock = site_clock(now.max(clock.unwrap_or(0) + 1), self.store().site());
                let take = Cas {
                    serialized: Serialized::InSite,
                    table: &PAGE_WRITERS,
                    partition: key.to_vec(),
                    clustering: Some(Vec::new()),
                    // Unchanged since read: nobody took it (or moved its clock) meanwhile.
                    condition: Condition::Equals(vec![
                        (col::HOLDER, current_holder.map_or(Value::Null, Value::from)),
                        (col::CLOCK, clock.map_or(Value::Null, Value::BigInt)),
                    ]),
                    writes: vec![
                        Upsert::new(&PAGE_WRITERS, key.clone())
                            .set(col::HOLDER, holder.as_str())
                            .set(col::HELD_UNTIL, Value::Timestamp((now + HOLD_FOR.as_micros() as i64) / 1000))
                            .set(col::CLOCK, Value::BigInt(next_clock))
                            .into(),
                    ],
                };
                if self.store().cas(take).await?.applied {
                    return Ok(Held { key, holder, clock: next_clock });
                }
            }
            if tokio::time::Instant::now() + wait > give_up {
                return Err(GraphError::Busy);
            }
            let jittered = wait.mul_f64(rand::rng().random_range(0.5..1.0));
            tokio::time::sleep(jittered).await;
            wait = (wait * 2).min(LONGEST_WAIT);
        }
    }

    async fn give_back(&self, held: &Held) -> Result<(), GraphError> {
        let release = Cas {
            serialized: Serialized::InSite,
            table: &PAGE_WRITERS,
            partition: held.key.to_vec(),
            clustering: Some(Vec::new()),
            condition: Condition::Equals(vec![(col::HOLDER, Value::from(held.holder.as_str()))]),
            // Held until the epoch: free. Nothing is set to null, which would
            // leave two tombstones in every page's row for scans to step over;
            // the clock stays, so the next change writes above this one.
            writes: vec![Upsert::new(&PAGE_WRITERS, held.key.clone()).set(col::HELD_UNTIL, Value::Timestamp(0)).into()],
        };
        self.store().cas(release).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use revstore_storage::Site;

    use super::site_clock;

    #[test]
    fn each_site_takes_clock_values_of_its_own() {
        let two = |index| Site { index, count: 2, datacenter: None };
        for at in [0, 1, 1_000_001, i64::MAX / 2] {
            let (zero, one) = (site_clock(at, two(0)), site_clock(at, two(1)));
            assert!(zero >= at && one >= at && zero - at < 2 && one - at < 2, "{at}: {zero} {one}");
            assert_ne!(zero, one);
            assert_eq!((zero % 2, one % 2), (0, 1));
        }
        assert_eq!(site_clock(41, Site::ONLY), 41);
    }
}
