//! What a Cassandra read meets, from the node's own trace: the live rows and
//! tombstone cells it read (summed over the replicas it asked).

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// What one traced read met.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadCost {
    pub live_rows: u64,
    pub tombstones: u64,
}

/// Runs `statement` with tracing on and reads back from the node's trace
/// what the read met.
pub async fn traced_read(
    session: &Session,
    statement: &PreparedStatement,
    values: impl scylla::serialize::row::SerializeRow,
) -> Result<ReadCost, Failure> {
    let mut statement = statement.clone();
    statement.set_tracing(true);
    let result = session.execute_unpaged(&statement, values).await?;
    let id = result.tracing_id().ok_or("no tracing id")?;
    let trace = session.get_tracing_info(&id).await?;
    let mut cost = ReadCost::default();
    for activity in trace.events.iter().filter_map(|e| e.activity.as_deref()) {
        // "Read 1 live rows and 3 tombstone cells" (one per replica read).
        let Some(rest) = activity.strip_prefix("Read ") else { continue };
        let words: Vec<&str> = rest.split_whitespace().collect();
        if let (Some(live), Some(dead)) =
            (words.first().and_then(|w| w.parse::<u64>().ok()), words.get(4).and_then(|w| w.parse::<u64>().ok()))
        {
            cost.live_rows += live;
            cost.tombstones += dead;
        }
    }
    Ok(cost)
}
