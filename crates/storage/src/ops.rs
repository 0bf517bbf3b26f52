//! Requests to a store and what they return.

use std::ops::Bound;

use revstore_schema::TableDef;

use crate::error::StoreError;
use crate::value::{Row, Value, cmp_keys};

/// Insert or update one row's cells (Cassandra `INSERT`): the row's liveness
/// marker and each given cell take the write's timestamp and TTL; cells not given
/// are left as they are. With only the partition key in `key`, only static cells
/// may be given.
#[derive(Debug, Clone)]
pub struct Upsert {
    pub table: &'static TableDef,
    /// Partition key values, then clustering values (all of them, or none for a
    /// static-only write).
    pub key: Vec<Value>,
    pub cells: Vec<(&'static str, Value)>,
    /// Seconds to live; `None` takes the table's default, `Some(0)` means forever.
    pub ttl: Option<u32>,
    /// Write timestamp in microseconds; `None` lets the store take the current time.
    pub timestamp: Option<i64>,
}

impl Upsert {
    pub fn new(table: &'static TableDef, key: impl IntoIterator<Item = Value>) -> Self {
        Upsert { table, key: key.into_iter().collect(), cells: Vec::new(), ttl: None, timestamp: None }
    }

    pub fn set(mut self, column: &'static str, value: impl Into<Value>) -> Self {
        self.cells.push((column, value.into()));
        self
    }

    pub fn ttl(mut self, seconds: u32) -> Self {
        self.ttl = Some(seconds);
        self
    }

    pub fn timestamp(mut self, micros: i64) -> Self {
        self.timestamp = Some(micros);
        self
    }
}

/// What a delete removes within one partition.
#[derive(Debug, Clone, PartialEq)]
pub enum DeleteTarget {
    /// The whole partition, static cells included.
    Partition,
    /// One row, by its full clustering key.
    Row(Vec<Value>),
    /// The rows in a clustering slice (a range tombstone).
    Range(Slice),
}

/// A delete: everything it targets that was written at or before its timestamp is
/// gone, and later-arriving writes with older timestamps stay shadowed.
#[derive(Debug, Clone)]
pub struct Delete {
    pub table: &'static TableDef,
    pub partition: Vec<Value>,
    pub target: DeleteTarget,
    pub timestamp: Option<i64>,
}

impl Delete {
    pub fn partition(table: &'static TableDef, partition: impl IntoIterator<Item = Value>) -> Self {
        Delete { table, partition: partition.into_iter().collect(), target: DeleteTarget::Partition, timestamp: None }
    }

    pub fn row(table: &'static TableDef, partition: impl IntoIterator<Item = Value>, clustering: impl IntoIterator<Item = Value>) -> Self {
        Delete {
            table,
            partition: partition.into_iter().collect(),
            target: DeleteTarget::Row(clustering.into_iter().collect()),
            timestamp: None,
        }
    }

    pub fn range(table: &'static TableDef, partition: impl IntoIterator<Item = Value>, slice: Slice) -> Self {
        Delete { table, partition: partition.into_iter().collect(), target: DeleteTarget::Range(slice), timestamp: None }
    }

    pub fn timestamp(mut self, micros: i64) -> Self {
        self.timestamp = Some(micros);
        self
    }
}

/// One write of a batch.
#[derive(Debug, Clone)]
pub enum Write {
    Upsert(Upsert),
    Delete(Delete),
}

impl Write {
    pub fn table(&self) -> &'static TableDef {
        match self {
            Write::Upsert(u) => u.table,
            Write::Delete(d) => d.table,
        }
    }

    /// The write's own timestamp, if it has one.
    pub fn timestamp(&self) -> Option<i64> {
        match self {
            Write::Upsert(u) => u.timestamp,
            Write::Delete(d) => d.timestamp,
        }
    }

    /// Gives the write `micros` as its timestamp unless it has one.
    pub(crate) fn stamp_if_untimed(&mut self, micros: i64) {
        let timestamp = match self {
            Write::Upsert(u) => &mut u.timestamp,
            Write::Delete(d) => &mut d.timestamp,
        };
        timestamp.get_or_insert(micros);
    }

    /// The partition key values the write targets.
    pub fn partition(&self) -> &[Value] {
        match self {
            Write::Upsert(u) => &u.key[..u.table.partition_key().count().min(u.key.len())],
            Write::Delete(d) => &d.partition,
        }
    }
}

impl From<Upsert> for Write {
    fn from(u: Upsert) -> Self {
        Write::Upsert(u)
    }
}

impl From<Delete> for Write {
    fn from(d: Delete) -> Self {
        Write::Delete(d)
    }
}

/// A contiguous slice of a partition's rows: equality on the first clustering
/// columns (`prefix`), then an optional range on the next one, in value order
/// (`lower` is the smaller value whatever the clustering order).
#[derive(Debug, Clone, PartialEq)]
pub struct Slice {
    pub prefix: Vec<Value>,
    pub lower: Bound<Value>,
    pub upper: Bound<Value>,
}

impl Default for Slice {
    fn default() -> Self {
        Slice::all()
    }
}

impl Slice {
    /// Every row of the partition.
    pub fn all() -> Self {
        Slice { prefix: Vec::new(), lower: Bound::Unbounded, upper: Bound::Unbounded }
    }

    /// The rows whose first clustering columns equal `prefix`.
    pub fn prefix(prefix: impl IntoIterator<Item = Value>) -> Self {
        Slice { prefix: prefix.into_iter().collect(), lower: Bound::Unbounded, upper: Bound::Unbounded }
    }

    pub fn lower(mut self, bound: Bound<Value>) -> Self {
        self.lower = bound;
        self
    }

    pub fn upper(mut self, bound: Bound<Value>) -> Self {
        self.upper = bound;
        self
    }

    /// Whether a full clustering key lies in the slice.
    pub fn contains(&self, clustering: &[Value]) -> bool {
        if clustering.len() < self.prefix.len() || cmp_keys(&clustering[..self.prefix.len()], &self.prefix).is_ne() {
            return false;
        }
        let Some(next) = clustering.get(self.prefix.len()) else {
            return true;
        };
        let above_lower = match &self.lower {
            Bound::Unbounded => true,
            Bound::Included(v) => next.cmp_same_type(v).is_ge(),
            Bound::Excluded(v) => next.cmp_same_type(v).is_gt(),
        };
        let below_upper = match &self.upper {
            Bound::Unbounded => true,
            Bound::Included(v) => next.cmp_same_type(v).is_le(),
            Bound::Excluded(v) => next.cmp_same_type(v).is_lt(),
        };
        above_lower && below_upper
    }

    /// Whether every key in `other` is also in `self` (used to drop tombstones
    /// that a newer, wider one makes redundant).
    pub fn covers(&self, other: &Slice) -> bool {
        if self.prefix.len() > other.prefix.len() || cmp_keys(&other.prefix[..self.prefix.len()], &self.prefix).is_ne() {
            return false;
        }
        if self.prefix.len() < other.prefix.len() {
            // `other` pins the column `self` ranges over to one value.
            return self.contains(&other.prefix[..=self.prefix.len()]);
        }
        let lower_ok = match (&self.lower, &other.lower) {
            (Bound::Unbounded, _) => true,
            (_, Bound::Unbounded) => false,
            (Bound::Included(a), Bound::Included(b) | Bound::Excluded(b)) => a.cmp_same_type(b).is_le(),
            (Bound::Excluded(a), Bound::Excluded(b)) => a.cmp_same_type(b).is_le(),
            (Bound::Excluded(a), Bound::Included(b)) => a.cmp_same_type(b).is_lt(),
        };
        let upper_ok = match (&self.upper, &other.upper) {
            (Bound::Unbounded, _) => true,
            (_, Bound::Unbounded) => false,
            (Bound::Included(a), Bound::Included(b) | Bound::Excluded(b)) => a.cmp_same_type(b).is_ge(),
            (Bound::Excluded(a), Bound::Excluded(b)) => a.cmp_same_type(b).is_ge(),
            (Bound::Excluded(a), Bound::Included(b)) => a.cmp_same_type(b).is_gt(),
        };
        lower_ok && upper_ok
    }
}

/// The slices that hold, one after the other and each read in `order`,
/// exactly the rows of a partition that come after the row whose full
/// clustering key is `key`: the rest of the key's last clustering value
/// first, then the rest of each shorter prefix. A listing resumes from its
/// own cursor with them wherever it cut its page.
pub fn slices_after(table: &TableDef, key: &[Value], order: ReadOrder) -> Vec<Slice> {
    let clustering: Vec<_> = table.clustering().collect();
    (0..key.len().min(clustering.len()))
        .rev()
        .map(|i| {
            let ascending = matches!(clustering[i].1, revstore_schema::Order::Asc) == (order == ReadOrder::Clustering);
            let slice = Slice::prefix(key[..i].iter().cloned());
            let past = Bound::Excluded(key[i].clone());
            if ascending { slice.lower(past) } else { slice.upper(past) }
        })
        .collect()
}

/// The slices that hold, one after the other and each read in `order`,
/// exactly the rows of `slice` that come after the full clustering key
/// `after`: first the rows sharing its longest prefix, then shorter ones,
/// each a plain range an engine reads by seeking (CQL has no `OR`, and
/// SQLite reads an `OR` of ranges by sorting every row it matches). None
/// shares a prefix with a key outside the slice's range.
pub fn slices_within_after(table: &TableDef, slice: &Slice, after: &[Value], order: ReadOrder) -> Vec<Slice> {
    let ck: Vec<_> = table.clustering().collect();
    let first = slice.prefix.len();
    let range = Slice::all().lower(slice.lower.clone()).upper(slice.upper.clone());
    let inside = after.get(first).is_none_or(|v| range.contains(std::slice::from_ref(v)));
    let mut slices = Vec::new();
    for i in (first..ck.len().min(after.len())).rev() {
        if i > first && !inside {
            continue;
        }
        let forward = matches!(ck[i].1, revstore_schema::Order::Asc) == (order == ReadOrder::Clustering);
        let mut sub = Slice::prefix(after[..i].iter().cloned());
        let past = Bound::Excluded(after[i].clone());
        if i == first {
            // The slice's own range on this column, tightened by the key.
            sub.lower = slice.lower.clone();
            sub.upper = slice.upper.clone();
            if forward {
                sub.lower = tighter(sub.lower, past, std::cmp::Ordering::Greater);
            } else {
                sub.upper = tighter(sub.upper, past, std::cmp::Ordering::Less);
            }
        } else if forward {
            sub.lower = past;
        } else {
            sub.upper = past;
        }
        slices.push(sub);
    }
    slices
}

/// Of two bounds on one column, the one that admits less: `tighter_side` is
/// `Greater` for lower bounds (the larger value wins), `Less` for upper ones.
fn tighter(bound: Bound<Value>, other: Bound<Value>, tighter_side: std::cmp::Ordering) -> Bound<Value> {
    match (&bound, &other) {
        (Bound::Unbounded, _) => other,
        (_, Bound::Unbounded) => bound,
        (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) => match a.cmp_same_type(b) {
            o if o == tighter_side => bound,
            std::cmp::Ordering::Equal if matches!(bound, Bound::Excluded(_)) => bound,
            _ => other,
        },
    }
}

/// The order rows come back in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadOrder {
    /// The table's clustering order.
    #[default]
    Clustering,
    /// The reverse of it.
    Reversed,
}

/// Read rows of one partition, a page at a time.
#[derive(Debug, Clone)]
pub struct ReadQuery {
    pub table: &'static TableDef,
    pub partition: Vec<Value>,
    pub slice: Slice,
    pub order: ReadOrder,
    /// Rows per page; `None` reads the whole slice at once.
    pub limit: Option<u32>,
    /// Resume after the last row of a previous page of the same query.
    pub page_token: Option<String>,
    /// Resume after this full clustering key, in the read's order: a
    /// service's own position, kept under its own sealed cursor (a merge of
    /// partitions resuming each one where it stopped). Not with `page_token`.
    pub after: Option<Vec<Value>>,
    /// Regular and static columns to return (key columns always are); `None` for all.
    pub columns: Option<Vec<&'static str>>,
    /// Only the first `limit` rows are wanted, never a next page: no row
    /// beyond them is read to learn whether one follows (a latest read of a
    /// page holding a day of superseded renders would read two renders'
    /// content for one).
    pub first_only: bool,
    /// Read from a quorum of every site's replicas, not only the local ones
    /// (EACH_QUORUM on Cassandra, where the keyspace spans several
    /// datacenters; the same as a local read otherwise): what a site wrote
    /// while the link was cut, and the other site never received (hints lost
    /// or expired), is seen, and the replicas read are repaired with it. Fails
    /// while a site is unreachable. For repairs, never for serving.
    pub across_sites: bool,
}

impl ReadQuery {
    pub fn new(table: &'static TableDef, partition: impl IntoIterator<Item = Value>) -> Self {
        ReadQuery {
            table,
            partition: partition.into_iter().collect(),
            slice: Slice::all(),
            order: ReadOrder::Clustering,
            limit: None,
            page_token: None,
            after: None,
            across_sites: false,
            columns: None,
            first_only: false,
        }
    }

    /// Read from every site (see [`ReadQuery::across_sites`]).
    pub fn across_sites(mut self) -> Self {
        self.across_sites = true;
        self
    }

    /// The first `n` rows and nothing more: no page token comes back, and no
    /// row past them is read.
    pub fn first(mut self, n: u32) -> Self {
        self.limit = Some(n);
        self.first_only = true;
        self
    }

    /// Rows an engine reads for this query besides the limit: one, to learn
    /// whether a next page follows, unless only the first rows are wanted.
    pub fn lookahead(&self) -> usize {
        usize::from(!self.first_only)
    }

    pub fn slice(mut self, slice: Slice) -> Self {
        self.slice = slice;
        self
    }

    pub fn order(mut self, order: ReadOrder) -> Self {
        self.order = order;
        self
    }

    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }

    pub fn page_token(mut self, token: Option<String>) -> Self {
        self.page_token = token;
        self
    }

    /// Rows after this full clustering key only (see [`ReadQuery::after`]).
    pub fn after(mut self, key: impl IntoIterator<Item = Value>) -> Self {
        self.after = Some(key.into_iter().collect());
        self
    }

    pub fn columns(mut self, columns: impl IntoIterator<Item = &'static str>) -> Self {
        self.columns = Some(columns.into_iter().collect());
        self
    }
}

/// One page of a partition read.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Page {
    pub rows: Vec<Row>,
    /// The partition's static cells, when the table has any and one is set.
    /// Read with the rows, in one snapshot, when the read finds a row; when it
    /// finds none, by a second query after it. A caller that needs an order
    /// between the two (e.g. a version in the statics guarding the rows)
    /// reads them separately.
    pub statics: Option<Row>,
    /// Present when more rows may follow; pass it back as `page_token`.
    pub next: Option<String>,
}

/// The condition of a conditional write.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// The row (or, for a static-only write, the partition's static cells) does not exist.
    NotExists,
    /// Each column currently holds the value (`Value::Null`: is unset).
    Equals(Vec<(&'static str, Value)>),
}

/// Which site (datacenter) of a deployment a store writes in, among how
/// many: for state each site must keep to itself (current-store's outbox:
/// a site's queue read and deleted by another site, which cannot yet see
/// every row the first wrote, would lose them). Sites are numbered by their
/// order in the keyspace's replication setting; one site unless it names
/// several datacenters. The number each datacenter took is recorded where
/// it matters (current-store's `outbox_sites`), so that two sites given the
/// setting in different orders do not share a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Site {
    pub index: u32,
    pub count: u32,
    /// The local datacenter's name, when the deployment has several.
    pub datacenter: Option<&'static str>,
}

impl Site {
    /// A deployment in one datacenter (and the embedded engine).
    pub const ONLY: Site = Site { index: 0, count: 1, datacenter: None };
}

/// Whose conditional writes a [`Cas`] is serialised against, where the
/// keyspaces are replicated to several datacenters (sites). With one
/// datacenter the two are the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Serialized {
    /// Against writers in the same datacenter only (LOCAL_SERIAL): two sites
    /// can both win the same condition, so only for uses that are safe with a
    /// winner in each site. Answers while the link between sites is cut.
    #[default]
    InSite,
    /// Against writers in every datacenter (SERIAL): a majority of all
    /// replicas takes part, so each write waits on the link between sites and
    /// fails while it is cut (unless the operator, with every other site
    /// down, has the engine serialise these within its site).
    AcrossSites,
}

/// A conditional write (a lightweight transaction): the writes apply, atomically,
/// only if the condition holds; among concurrent callers, exactly one sees a
/// given state. All writes must target the condition's partition.
#[derive(Debug, Clone)]
pub struct Cas {
    pub table: &'static TableDef,
    pub partition: Vec<Value>,
    /// The row the condition reads; `None` for conditions on static columns only.
    pub clustering: Option<Vec<Value>>,
    pub condition: Condition,
    pub writes: Vec<Write>,
    pub serialized: Serialized,
}

impl Cas {
    /// `INSERT ... IF NOT EXISTS`.
    pub fn insert_if_not_exists(upsert: Upsert) -> Self {
        let pk_len = upsert.table.partition_key().count();
        let (partition, clustering) = upsert.key.split_at(pk_len.min(upsert.key.len()));
        Cas {
            table: upsert.table,
            partition: partition.to_vec(),
            clustering: if clustering.is_empty() && upsert.table.clustering().next().is_some() { None } else { Some(clustering.to_vec()) },
            condition: Condition::NotExists,
            writes: vec![Write::Upsert(upsert)],
            serialized: Serialized::InSite,
        }
    }

    /// The same write, serialised against writers in every datacenter.
    pub fn across_sites(self) -> Self {
        Cas { serialized: Serialized::AcrossSites, ..self }
    }
}

/// The result of a conditional write.
#[derive(Debug, Clone, PartialEq)]
pub struct CasOutcome {
    pub applied: bool,
    /// When not applied: the row (and static cells) the condition was checked against.
    pub current: Option<Row>,
}

/// A partition found by a scan.
#[derive(Debug, Clone, PartialEq)]
pub struct ScannedPartition {
    /// The partition's Murmur3 token.
    pub token: i64,
    pub key: Vec<Value>,
    /// The static columns the scan asked for (`None` when it asked for none,
    /// or the partition has none alive).
    pub statics: Option<Row>,
}

impl ScannedPartition {
    /// Where a scan that stopped at this partition resumes.
    pub fn position(&self) -> ScanPosition {
        ScanPosition { token: self.token, key: self.key.clone() }
    }
}

/// A place in a token-ordered scan: after the partition with this token and
/// key; with no key, after every partition of the token (where a step that
/// covers a slice of the ring ended). Plain (not sealed), so a job can checkpoint it and resume after any
/// restart or page-token key rotation; [`Store::scan`](crate::Store::scan)
/// seals it for clients.
#[derive(Debug, Clone, PartialEq)]
pub struct ScanPosition {
    pub token: i64,
    pub key: Vec<Value>,
}

impl ScanPosition {
    /// The token's 8 bytes, then the key's value encoding.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = self.token.to_be_bytes().to_vec();
        bytes.extend_from_slice(&crate::value::encode_values(&self.key));
        bytes
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, StoreError> {
        let bad = || StoreError::invalid("not a scan position");
        let (token, key) = bytes.split_at_checked(8).ok_or_else(bad)?;
        let mut t = [0u8; 8];
        t.copy_from_slice(token);
        Ok(ScanPosition { token: i64::from_be_bytes(t), key: crate::value::decode_values(key).map_err(|_| bad())? })
    }
}

impl std::fmt::Display for ScanPosition {
    /// [`ScanPosition::to_bytes`] in hex.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::value::to_hex(&self.to_bytes()))
    }
}

impl std::str::FromStr for ScanPosition {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, StoreError> {
        let bytes = crate::value::from_hex(s).ok_or_else(|| StoreError::invalid("not a scan position"))?;
        ScanPosition::from_bytes(&bytes)
    }
}

/// The tokens `(after, through]` of the ring. The whole ring is
/// [`TokenRange::ALL`]: no key hashes to `i64::MIN`, as in Cassandra.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenRange {
    pub after: i64,
    pub through: i64,
}

impl TokenRange {
    pub const ALL: TokenRange = TokenRange { after: i64::MIN, through: i64::MAX };

    /// The ring cut into `n` contiguous ranges of about equal width, in order
    /// (for workers that each take one).
    pub fn split(n: u32) -> Vec<TokenRange> {
        let n = i128::from(n.max(1));
        let (lo, hi) = (i128::from(i64::MIN), i128::from(i64::MAX));
        let bound = |i: i128| if i == n { i64::MAX } else { (lo + (hi - lo) * i / n) as i64 };
        (0..n).map(|i| TokenRange { after: bound(i), through: bound(i + 1) }).collect()
    }

    pub fn contains(&self, token: i64) -> bool {
        token > self.after && token <= self.through
    }
}

/// One step of a token-ordered scan of a table's partitions.
#[derive(Debug, Clone)]
pub struct ScanQuery {
    pub table: &'static TableDef,
    pub range: TokenRange,
    /// Resume after this partition (within `range`); `None`: from its start.
    pub after: Option<ScanPosition>,
    /// Static columns to return with each partition.
    pub statics: Vec<&'static str>,
    pub limit: u32,
    /// Scan a quorum of every site's replicas (see [`ReadQuery::across_sites`]).
    pub across_sites: bool,
}

impl ScanQuery {
    /// The first `limit` partitions of the whole ring, keys only.
    pub fn new(table: &'static TableDef, limit: u32) -> Self {
        ScanQuery { table, range: TokenRange::ALL, after: None, statics: Vec::new(), limit, across_sites: false }
    }

    pub fn range(mut self, range: TokenRange) -> Self {
        self.range = range;
        self
    }

    pub fn after(mut self, after: Option<ScanPosition>) -> Self {
        self.after = after;
        self
    }

    pub fn statics(mut self, columns: impl IntoIterator<Item = &'static str>) -> Self {
        self.statics = columns.into_iter().collect();
        self
    }

    /// Scan every site (see [`ReadQuery::across_sites`]).
    pub fn across_sites(mut self) -> Self {
        self.across_sites = true;
        self
    }
}

/// One step of a scan, with where the next one starts (`None`: the range is done).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScanRows {
    pub partitions: Vec<ScannedPartition>,
    pub next: Option<ScanPosition>,
}

/// What an engine holds of some partitions of a table, counted for storage
/// audits in value bytes ([`Value::stored_len`](crate::Value::stored_len)) of
/// clustering, regular and static cells (partition keys are not counted).
/// "Held" is what the engine still keeps: on the embedded engine that includes
/// expired rows and cells not yet purged (a deleted row leaves its table at
/// once; its small tombstone record is kept aside and not counted). Cassandra
/// does not let a client see expired cells or tombstones, so there "held"
/// equals "live".
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Holdings {
    /// Partitions visited (on the embedded engine including ones with nothing live).
    pub partitions: u64,
    pub rows_held: u64,
    pub bytes_held: u64,
    pub rows_live: u64,
    pub bytes_live: u64,
    /// Where the next step resumes; `None` when the range is done.
    pub next: Option<ScanPosition>,
}

impl Holdings {
    /// Adds another step's counts (keeping this one's `next`).
    pub fn add(&mut self, other: &Holdings) {
        self.partitions += other.partitions;
        self.rows_held += other.rows_held;
        self.bytes_held += other.bytes_held;
        self.rows_live += other.rows_live;
        self.bytes_live += other.bytes_live;
    }
}

/// What a purge of expired data removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeStats {
    /// Rows dropped, counting a partition's expired static cells as one row.
    pub rows: u64,
    pub tombstones: u64,
    /// Bytes the database files shrank by.
    pub bytes_freed: u64,
}

/// What the storage nodes keep on disk for one table, as the engine itself
/// reports it: compressed SSTables (or files) with everything in them that
/// compaction has not removed yet — superseded copies, tombstones, expired
/// cells — for one copy of the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskUsage {
    /// Bytes on disk for one copy of the table: on Cassandra the nodes'
    /// `system_views.disk_usage` summed and divided by the replication factor.
    pub bytes: u64,
    /// How coarse `bytes` is: Cassandra reports whole mebibytes per node,
    /// rounded up, so the figure is at most this much above the truth.
    pub resolution: u64,
    /// Nodes that reported.
    pub nodes: u32,
}

/// How reads of one table fare on the storage nodes, as the engine itself
/// measures them: what decays with time (tombstones every read steps over,
/// partitions that keep growing) shows here before reads fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadHealth {
    /// Tombstones scanned by one read: the 99th percentile and the most, the
    /// worst node's (Cassandra's `tombstones_per_read`, a recent-weighted
    /// histogram per node). Cassandra warns past 1,000 and aborts the read
    /// past 100,000 (`tombstone_warn_threshold`, `tombstone_failure_threshold`).
    /// Reads that met none count in the histogram's lowest bucket, 1; a
    /// table not read since the node started shows 0.
    pub tombstones_per_read_p99: u64,
    pub tombstones_per_read_max: u64,
    /// The largest partition any node has written to an SSTable, in bytes
    /// (Cassandra's `max_partition_size`, whole mebibytes rounded up).
    pub largest_partition_bytes: u64,
    /// Nodes that reported.
    pub nodes: u32,
}
