//! The tables of each service. A change here changes its component's
//! fingerprint; the test in [`crate::version`] then asks for a new version.

use crate::model::ColumnType::{BigInt, Blob, Boolean, Text, TimeUuid, Timestamp};
use crate::model::{Column as C, Compaction, Order, TableDef};

/// A week, Cassandra's usual bound for rows that only expire.
const WEEK: u32 = 7 * 86_400;

/// The columns of a dump's title index (`revstore_service::dump::TitleIndex`):
/// a domain's titles in the token order of the partitions they index, in 256
/// buckets by the token's top byte; `since` is when the title was entered.
const TITLE_INDEX: [C; 5] = [
    C::partition("domain", Text),
    C::partition("bucket", BigInt),
    C::clustering("token", BigInt, Order::Asc),
    C::clustering("title", Text, Order::Asc),
    C::regular("since", Timestamp),
];

/// The columns of a suppression table (`revstore_service::suppressions`): a
/// row per revision ever suppressed, hidden while `suppressed_at` is later
/// than `lifted_at`; each cell is written with its own value as its write
/// timestamp. The static `deleted_through_rev` records the page's deletion
/// (at its deletion timestamp), so that one scan of the table finds all a
/// site must hide, for the janitor's `hidden` task to make alike in every site.
const SUPPRESSIONS: [C; 6] = [
    C::partition("domain", Text),
    C::partition("title", Text),
    C::clustering("rev", BigInt, Order::Asc),
    C::statik("deleted_through_rev", BigInt),
    C::regular("suppressed_at", Timestamp),
    C::regular("lifted_at", Timestamp),
];

/// old-store's title index: [`TITLE_INDEX`] and what the wiki says of the
/// page (MediaWiki's page id and namespace number), when an archive write
/// carried it (an import from an XML dump does); read by history dumps in
/// the Enterprise layout.
const ARCHIVE_TITLE_INDEX: [C; 7] = [
    TITLE_INDEX[0],
    TITLE_INDEX[1],
    TITLE_INDEX[2],
    TITLE_INDEX[3],
    TITLE_INDEX[4],
    C::regular("page_id", BigInt),
    C::regular("namespace", BigInt),
];

/// Schema bookkeeping shared by all services: which version each one applied.
pub mod meta {
    use super::*;

    pub static SCHEMA_META: TableDef = TableDef {
        name: "schema_meta",
        columns: &[
            C::partition("component", Text),
            C::regular("version", BigInt),
            C::regular("fingerprint", Text),
            C::regular("applied_at", Timestamp),
            C::regular("compatible_from", BigInt),
        ],
        default_ttl: None,
        compaction: Compaction::SizeTiered,
        comment: "schema version applied per component; services refuse to serve on a mismatch",
    };
}

/// current-store: every render of a page in one partition, newest first.
pub mod current_store {
    use super::*;

    /// The column names of current-store's tables: the declarations below and
    /// the code that reads and writes rows use these, so a misspelt column is
    /// a compile error.
    pub mod col {
        pub const ATTEMPTS: &str = "attempts";
        pub const BODY_HASH: &str = "body_hash";
        pub const DATACENTER: &str = "datacenter";
        pub const DATA_PARSOID: &str = "data_parsoid";
        pub const DELETED_THROUGH_REV: &str = "deleted_through_rev";
        pub const DELIVERED_AT: &str = "delivered_at";
        pub const DELIVERED_THROUGH: &str = "delivered_through";
        pub const DOMAIN: &str = "domain";
        pub const EXPIRES_AT: &str = "expires_at";
        pub const FAILED_AT: &str = "failed_at";
        pub const HTML: &str = "html";
        pub const ID: &str = "id";
        pub const KIND: &str = "kind";
        pub const MINUTE: &str = "minute";
        pub const OWNER: &str = "owner";
        pub const PAYLOAD: &str = "payload";
        pub const REASON: &str = "reason";
        pub const REV: &str = "rev";
        pub const SECTION_OFFSETS: &str = "section_offsets";
        pub const SHARD: &str = "shard";
        pub const SITE: &str = "site";
        pub const STORED_AT: &str = "stored_at";
        pub const STORED_BYTES: &str = "stored_bytes";
        pub const HAS_SUPPRESSED_REVS: &str = "has_suppressed_revs";
        pub const STATUS: &str = "status";
        pub const SUPPRESSED_AT: &str = "suppressed_at";
        pub const TRACE: &str = "trace";
        pub const TID: &str = "tid";
        pub const TITLE: &str = "title";
    }

    /// Every render of a page, newest first: the latest render is the first row, a superseded one stays a row until
    /// it has been superseded for the grace period, then the janitor's
    /// retention sweep range-deletes it. `stored_at` is when the row was
    /// written (a late write can carry an old tid): a render is superseded no
    /// later than the newer renders were stored. `has_suppressed_revs`, a
    /// static cell, flags a page with a suppressed revision (set by the
    /// suppression, at a timestamp no delete reaches): a latest read checks
    /// suppression only on such a page. `deleted_through_rev`, a static cell,
    /// says the page was deleted through that revision (docs/design/deletes.md);
    /// `body_hash` tells a render's retry from another body under its
    /// (rev, tid); `stored_bytes` is the row's size as the storage audit
    /// counts it, so that retention reads keys and sizes, not bodies.
    pub static PAGE_RENDERS: TableDef = TableDef {
        name: "page_renders",
        columns: &[
            C::partition(col::DOMAIN, Text),
            C::partition(col::TITLE, Text),
            C::clustering(col::REV, BigInt, Order::Desc),
            C::clustering(col::TID, TimeUuid, Order::Desc),
            C::statik(col::HAS_SUPPRESSED_REVS, Boolean),
            C::statik(col::DELETED_THROUGH_REV, BigInt),
            C::regular(col::STORED_AT, Timestamp),
            C::regular(col::BODY_HASH, BigInt),
            C::regular(col::STORED_BYTES, BigInt),
            C::regular(col::HTML, Blob),
            C::regular(col::DATA_PARSOID, Blob),
            C::regular(col::SECTION_OFFSETS, Blob),
        ],
        default_ttl: None,
        compaction: Compaction::Leveled,
        comment: "every render of a page, newest first, kept until superseded for the grace period",
    };

    /// The pages of each domain in the token order of their `page_renders`
    /// partition: a dump of one domain walks its own rows, never
    /// another domain's. `bucket` is the token's top byte, so a domain's pages
    /// spread over 256 partitions and a slice of the ring reads only the
    /// buckets it covers. A row is written with every render (the same row
    /// again) and deleted with the page; `since` is the tid's time of the
    /// render that wrote it last.
    pub static DOMAIN_PAGES: TableDef = TableDef {
        name: "domain_pages",
        columns: &TITLE_INDEX,
        default_ttl: None,
        compaction: Compaction::Leveled,
        comment: "the pages of each domain in partition-token order, for dumps",
    };

    /// Revisions hidden by suppression, and lifted suppressions: a hidden
    /// revision is never served.
    pub static SUPPRESSED: TableDef = TableDef {
        name: "suppressed",
        columns: &SUPPRESSIONS,
        default_ttl: None,
        compaction: Compaction::SizeTiered,
        comment: "suppressed (hidden) revisions per title",
    };

    /// The columns of an outbox row after its key, which a dead letter keeps as they were.
    const OUTBOX_ROW: [C; 7] = [
        C::regular(col::KIND, Text),
        C::regular(col::DOMAIN, Text),
        C::regular(col::TITLE, Text),
        C::regular(col::REV, BigInt),
        C::regular(col::TID, TimeUuid),
        C::regular(col::PAYLOAD, Blob),
        C::regular(col::ATTEMPTS, BigInt),
    ];

    /// Durable hand-offs (to old-store, to the dependency graph), written in the
    /// same atomic batch as the render they describe. A partition holds one
    /// shard's rows of one minute (the minute of the row's time-UUID id). The
    /// shard's deliverer reads forward from where it has delivered through
    /// and deletes a minute's partition whole once every row in it is
    /// delivered, so no read steps over a deleted row; rows never delivered
    /// expire after four weeks (old-store may be down for hours, not for a
    /// month). docs/design/outbox.md says why.
    pub static OUTBOX: TableDef = TableDef {
        name: "outbox_by_minute",
        columns: &[
            C::partition(col::SHARD, BigInt),
            C::partition(col::MINUTE, BigInt),
            C::clustering(col::ID, TimeUuid, Order::Asc),
            OUTBOX_ROW[0],
            OUTBOX_ROW[1],
            OUTBOX_ROW[2],
            OUTBOX_ROW[3],
            OUTBOX_ROW[4],
            OUTBOX_ROW[5],
            OUTBOX_ROW[6],
            // The W3C `traceparent` of the write that queued the row, so
            // that its delivery continues that trace.
            C::regular(col::TRACE, Text),
            // Set once the receiver took the row (or it was moved to the
            // dead letters): whoever reads it again sends nothing.
            C::regular(col::DELIVERED_AT, Timestamp),
        ],
        default_ttl: Some(4 * WEEK),
        compaction: Compaction::TimeWindow,
        comment: "pending deliveries to old-store and the dependency graph, one partition per shard and minute",
    };

    /// Who delivers each outbox shard, and how far: one row per shard. The
    /// owner takes the row by a conditional write and renews it before
    /// `expires_at`; `delivered_through` is the position before which every
    /// row of the shard has been delivered (or moved to the dead letters),
    /// where the next owner starts.
    pub static OUTBOX_SHARDS: TableDef = TableDef {
        name: "outbox_shards",
        columns: &[
            C::partition(col::SHARD, BigInt),
            C::regular(col::OWNER, Text),
            C::regular(col::EXPIRES_AT, Timestamp),
            C::regular(col::DELIVERED_THROUGH, TimeUuid),
        ],
        default_ttl: None,
        compaction: Compaction::Leveled,
        comment: "the deliverer of each outbox shard (a lease) and how far it has delivered",
    };

    /// Outbox rows the receiver refused for good (a 4xx that retrying cannot
    /// change): moved here so they stop blocking their shard, kept until an
    /// operator re-drives or removes them, by shard and then by the outbox row's id.
    pub static OUTBOX_DEAD_LETTERS: TableDef = TableDef {
        name: "outbox_dead_letters",
        columns: &[
            C::partition(col::SHARD, BigInt),
            C::clustering(col::ID, TimeUuid, Order::Asc),
            OUTBOX_ROW[0],
            OUTBOX_ROW[1],
            OUTBOX_ROW[2],
            OUTBOX_ROW[3],
            OUTBOX_ROW[4],
            OUTBOX_ROW[5],
            OUTBOX_ROW[6],
            C::regular(col::FAILED_AT, Timestamp),
            C::regular(col::STATUS, BigInt),
            C::regular(col::REASON, Text),
            C::regular(col::TRACE, Text),
        ],
        default_ttl: None,
        compaction: Compaction::SizeTiered,
        comment: "outbox deliveries the receiver refused permanently, kept for re-driving",
    };

    /// Which datacenter took each site number (the outbox's shards
    /// `16·n…16·n+15` are site n's): claimed by a conditional write across
    /// sites on a service's first start in a datacenter, checked on every
    /// start, so that two sites never deliver the same shards.
    pub static OUTBOX_SITES: TableDef = TableDef {
        name: "outbox_sites",
        columns: &[C::partition(col::SITE, BigInt), C::regular(col::DATACENTER, Text)],
        default_ttl: None,
        compaction: Compaction::Leveled,
        comment: "the datacenter of each site number, whose outbox shards it delivers",
    };

    pub static TABLES: [&TableDef; 7] =
        [&PAGE_RENDERS, &DOMAIN_PAGES, &SUPPRESSED, &OUTBOX, &OUTBOX_SHARDS, &OUTBOX_DEAD_LETTERS, &OUTBOX_SITES];
}

/// old-store: multi-revision compression blocks and a metadata table.
pub mod old_store {
    use super::*;

    /// The column names of old-store's tables, declared once: code that names
    /// a column through these cannot misspell it.
    pub mod col {
        pub const DOMAIN: &str = "domain";
        pub const TITLE: &str = "title";
        pub const REV: &str = "rev";
        pub const TID: &str = "tid";
        pub const REV_COUNT: &str = "rev_count";
        pub const OPEN_BLOCK: &str = "open_block";
        pub const OPEN_BLOCK_REVISIONS: &str = "open_block_revisions";
        pub const OPEN_BLOCK_BYTES: &str = "open_block_bytes";
        pub const LAST_TID: &str = "last_tid";
        pub const BLOCK: &str = "block";
        pub const SLOT: &str = "slot";
        pub const SEALED: &str = "sealed";
        pub const COMPACTED_THROUGH: &str = "compacted_through";
        pub const COMPACTED_LEVEL: &str = "compacted_level";
        pub const FIRST_SLOT: &str = "first_slot";
        pub const BASE_BLOCK: &str = "base_block";
        pub const BASE_SLOT: &str = "base_slot";
        pub const CONTENT: &str = "content";
        pub const DELETED_THROUGH_REV: &str = "deleted_through_rev";
        pub const SHARD: &str = "shard";
        pub const HOUR: &str = "hour";
        pub const APPENDED_AT: &str = "appended_at";
        pub const SWEPT_FROM: &str = "swept_from";
    }

    /// One skinny row per archived render, naming the block and the slot (the
    /// append position in the title's history) that hold it. The statics are
    /// the per-title allocation state, advanced only by a lightweight
    /// transaction on `rev_count`, the number of slots taken, and
    /// `deleted_through_rev`: the page was deleted through that revision, and
    /// none up to it is served (written at the deletion's timestamp).
    pub static ARCHIVE_META: TableDef = TableDef {
        name: "archive_meta",
        columns: &[
            C::partition(col::DOMAIN, Text),
            C::partition(col::TITLE, Text),
            C::clustering(col::REV, BigInt, Order::Asc),
            C::clustering(col::TID, TimeUuid, Order::Asc),
            C::statik(col::REV_COUNT, BigInt),
            C::statik(col::OPEN_BLOCK, BigInt),
            C::statik(col::OPEN_BLOCK_REVISIONS, BigInt),
            C::statik(col::OPEN_BLOCK_BYTES, BigInt),
            C::statik(col::LAST_TID, TimeUuid),
            C::statik(col::DELETED_THROUGH_REV, BigInt),
            C::regular(col::BLOCK, BigInt),
            C::regular(col::SLOT, BigInt),
        ],
        default_ttl: None,
        compaction: Compaction::SizeTiered,
        comment: "which compression block holds each archived render",
    };

    /// Compression blocks, one partition each. Appended revisions are rows,
    /// each compressed against the previous slot (the `chain` codec); a
    /// compaction rewrites the rows up to `compacted_through` as one zstd frame
    /// in the static `sealed` and drops them with one range delete.
    ///
    /// Leveled: a block's rows are often written long before the range
    /// delete that seals them (a quiet page fills a block over months), and
    /// under size-tiered compaction they sat in large old SSTables that no
    /// compaction merged with the small young one holding the delete. On the
    /// soak's three nodes that held 185.8 MiB on disk for 105.2 live (1.77),
    /// beside 1.02 for the leveled `page_renders` in the same run; leveled,
    /// the same soak held 105.5 for 102.9 (1.03).
    pub static ARCHIVE_BLOCKS: TableDef = TableDef {
        name: "archive_blocks",
        columns: &[
            C::partition(col::DOMAIN, Text),
            C::partition(col::TITLE, Text),
            C::partition(col::BLOCK, BigInt),
            C::clustering(col::SLOT, BigInt, Order::Asc),
            C::clustering(col::TID, TimeUuid, Order::Asc),
            C::statik(col::SEALED, Blob),
            C::statik(col::COMPACTED_THROUGH, BigInt),
            C::statik(col::COMPACTED_LEVEL, BigInt),
            C::statik(col::FIRST_SLOT, BigInt),
            C::statik(col::BASE_BLOCK, BigInt),
            C::statik(col::BASE_SLOT, BigInt),
            C::regular(col::REV, BigInt),
            C::regular(col::CONTENT, Blob),
        ],
        default_ttl: None,
        compaction: Compaction::Leveled,
        comment: "multi-revision zstd compression blocks",
    };

    /// The titles of each domain in the token order of their `archive_meta`
    /// partition, for history dumps: as current-store's
    /// `domain_pages`, 256 buckets by the token's top byte. Written when a
    /// title's first render is archived (and by the janitor's sweep for
    /// titles archived before); `since` is the time of that render;
    /// `page_id` and `namespace` by every archive write that names them.
    pub static ARCHIVE_TITLES: TableDef = TableDef {
        name: "archive_titles",
        columns: &ARCHIVE_TITLE_INDEX,
        default_ttl: None,
        compaction: Compaction::Leveled,
        comment: "the archived titles of each domain in partition-token order, for dumps",
    };

    /// Revisions hidden by current-store's suppression (and lifted
    /// suppressions): a hidden revision is never served.
    pub static ARCHIVE_SUPPRESSED: TableDef = TableDef {
        name: "archive_suppressed",
        columns: &SUPPRESSIONS,
        default_ttl: None,
        compaction: Compaction::SizeTiered,
        comment: "archived revisions that must not be served (suppression)",
    };

    /// Compaction debt: one row per appended render whose block has not yet
    /// been compacted at the seal level since. Written before the render's slot
    /// is taken, deleted by the seal-level compaction that covers it, so a
    /// restart (clean or not) finds every block still owed a compaction.
    /// Partitioned by a hash of the title into shards, and by the hour of the
    /// append: a sweep reads each shard's hours from where debt may still be
    /// (`archive_debt_shards`), so it never steps over the deletions of the
    /// hours behind it (the design: `docs/design/compaction-debt.md`).
    pub static ARCHIVE_DEBT: TableDef = TableDef {
        name: "archive_debt_by_hour",
        columns: &[
            C::partition(col::SHARD, BigInt),
            C::partition(col::HOUR, BigInt),
            C::clustering(col::DOMAIN, Text, Order::Asc),
            C::clustering(col::TITLE, Text, Order::Asc),
            C::clustering(col::BLOCK, BigInt, Order::Asc),
            C::clustering(col::SLOT, BigInt, Order::Asc),
            C::regular(col::APPENDED_AT, Timestamp),
        ],
        default_ttl: None,
        compaction: Compaction::Leveled,
        comment: "blocks still owed a seal-level compaction, one row per appended render, by shard and hour of the append",
    };

    /// Per debt shard, the first hour whose partition may still hold debt:
    /// every hour before it was found empty by a sweep (past the margin for
    /// a late append), and is never read again.
    pub static ARCHIVE_DEBT_SHARDS: TableDef = TableDef {
        name: "archive_debt_shards",
        columns: &[C::partition(col::SHARD, BigInt), C::regular(col::SWEPT_FROM, BigInt)],
        default_ttl: None,
        compaction: Compaction::Leveled,
        comment: "where each compaction-debt shard's sweep starts",
    };

    pub static TABLES: [&TableDef; 6] =
        [&ARCHIVE_META, &ARCHIVE_BLOCKS, &ARCHIVE_TITLES, &ARCHIVE_SUPPRESSED, &ARCHIVE_DEBT, &ARCHIVE_DEBT_SHARDS];
}

/// dependency-graph: adjacency lists in both directions.
///
/// An edge is one row in `graph_dependencies` (by child) and one in
/// `graph_parent_dependents` (by parent), written in the same batch. A
/// popular template's dependents are spread over partitions by a hash bucket
/// of the child, each in listing order (priority descending, then child), so
/// none grows past tens of megabytes at ten million dependents and a listing
/// is a merge of at most 32 ordered partitions; `graph_parent_buckets` lists
/// which buckets a parent has. Selectors are JSON arrays of fragment ids, as
/// text. The design: `docs/design/dependency-graph.md`.
pub mod dependency_graph {
    use super::*;

    /// The column names of the graph's tables.
    pub mod col {
        pub const DOMAIN: &str = "domain";
        pub const CHILD: &str = "child";
        pub const PARENT: &str = "parent";
        pub const DEP_TYPE: &str = "dep_type";
        pub const PRIORITY: &str = "priority";
        pub const BUCKET: &str = "bucket";
        pub const PARENT_SELECTOR: &str = "parent_selector";
        pub const CHILD_SELECTOR: &str = "child_selector";
        pub const LAST_UPDATED: &str = "last_updated";
        pub const CREATED: &str = "created";
        pub const PAGE: &str = "page";
        pub const SELECTOR: &str = "selector";
        pub const CHANGED_AT: &str = "changed_at";
        pub const HOLDER: &str = "holder";
        pub const HELD_UNTIL: &str = "held_until";
        pub const CLOCK: &str = "clock";
    }

    /// What a page depends on: one row per (priority, type, parent), push first.
    /// Bounded by the edge-set limit of a write.
    pub static DEPENDENCIES: TableDef = TableDef {
        name: "graph_dependencies",
        columns: &[
            C::partition(col::DOMAIN, Text),
            C::partition(col::CHILD, Text),
            C::clustering(col::PRIORITY, BigInt, Order::Desc),
            C::clustering(col::DEP_TYPE, Text, Order::Asc),
            C::clustering(col::PARENT, Text, Order::Asc),
            C::regular(col::PARENT_SELECTOR, Text),
            C::regular(col::CHILD_SELECTOR, Text),
            C::regular(col::LAST_UPDATED, Timestamp),
            C::regular(col::CREATED, Timestamp),
        ],
        default_ttl: None,
        compaction: Compaction::Leveled,
        comment: "dependencies of each page, priority descending",
    };

    /// What depends on a page, for one type, in one hash bucket of the
    /// child: priority descending, then child. A listing merges the parent's
    /// buckets in that order, so its reads do not depend on how the
    /// priorities are spread.
    pub static DEPENDENTS: TableDef = TableDef {
        name: "graph_parent_dependents",
        columns: &[
            C::partition(col::DOMAIN, Text),
            C::partition(col::PARENT, Text),
            C::partition(col::DEP_TYPE, Text),
            C::partition(col::BUCKET, BigInt),
            C::clustering(col::PRIORITY, BigInt, Order::Desc),
            C::clustering(col::CHILD, Text, Order::Asc),
            C::regular(col::PARENT_SELECTOR, Text),
            C::regular(col::CHILD_SELECTOR, Text),
            C::regular(col::CREATED, Timestamp),
        ],
        default_ttl: None,
        compaction: Compaction::Leveled,
        comment: "dependents of each page by type and bucket, priority descending",
    };

    /// The buckets of `graph_parent_dependents` a parent has dependents in,
    /// per type: a parent with a few dependents is listed in a few reads.
    pub static DEPENDENT_BUCKETS: TableDef = TableDef {
        name: "graph_parent_buckets",
        columns: &[
            C::partition(col::DOMAIN, Text),
            C::partition(col::PARENT, Text),
            C::partition(col::DEP_TYPE, Text),
            C::clustering(col::BUCKET, BigInt, Order::Asc),
            C::regular(col::CREATED, Timestamp),
        ],
        default_ttl: None,
        compaction: Compaction::Leveled,
        comment: "which graph_parent_dependents buckets each parent has",
    };

    /// The latest change of each page, by type and selector (`""`: the whole
    /// page); written with the change's time as write timestamp, so the
    /// latest wins whatever order changes arrive in.
    pub static CHANGES: TableDef = TableDef {
        name: "graph_changes",
        columns: &[
            C::partition(col::DOMAIN, Text),
            C::partition(col::PAGE, Text),
            C::partition(col::DEP_TYPE, Text),
            C::clustering(col::SELECTOR, Text, Order::Asc),
            C::regular(col::CHANGED_AT, Timestamp),
        ],
        default_ttl: None,
        compaction: Compaction::Leveled,
        comment: "the latest change of each page, by type and selector",
    };

    /// Who is changing a page's edges now, and the page's write clock.
    /// Every change of a page's edges first takes this row by a conditional
    /// write, so changes of one page never interleave, and each takes a write
    /// timestamp above every earlier one's, whatever the writers' clocks.
    pub static PAGE_WRITERS: TableDef = TableDef {
        name: "graph_page_writers",
        columns: &[
            C::partition(col::DOMAIN, Text),
            C::partition(col::CHILD, Text),
            C::regular(col::HOLDER, Text),
            C::regular(col::HELD_UNTIL, Timestamp),
            // Microseconds: the write timestamp the page's last change took.
            C::regular(col::CLOCK, BigInt),
        ],
        default_ttl: None,
        compaction: Compaction::Leveled,
        comment: "one writer at a time per page, and the page's write clock",
    };

    pub static TABLES: [&TableDef; 5] = [&DEPENDENCIES, &DEPENDENTS, &DEPENDENT_BUCKETS, &CHANGES, &PAGE_WRITERS];
}

/// janitor: resumable sweeps and a lease so two runs never overlap.
pub mod janitor {
    use super::*;

    pub static CHECKPOINTS: TableDef = TableDef {
        name: "janitor_checkpoints",
        columns: &[
            C::partition("job", Text),
            C::regular("cursor", Text),
            C::regular("run_id", TimeUuid),
            C::regular("updated_at", Timestamp),
        ],
        default_ttl: None,
        compaction: Compaction::SizeTiered,
        comment: "where each janitor sweep resumes",
    };

    pub static LEASES: TableDef = TableDef {
        name: "janitor_leases",
        columns: &[
            C::partition("name", Text),
            C::regular("owner", Text),
            C::regular("acquired_at", Timestamp),
            // When the lease lapses unless renewed.
            C::regular("expires_at", Timestamp),
        ],
        default_ttl: None,
        compaction: Compaction::SizeTiered,
        comment: "mutual exclusion of janitor runs (conditional insert with a TTL)",
    };

    /// The pages each service changed, by the minute they changed in: what
    /// a routine janitor run visits instead of every page of the wiki. A
    /// write records its page here before the change is visible; a run reads
    /// the minutes since the one before it ended, never a deleted row (rows
    /// only expire, whole windows at a time).
    pub static JOURNAL: TableDef = TableDef {
        name: "janitor_journal",
        columns: &[
            C::partition("service", Text),
            C::partition("shard", BigInt),
            C::partition("minute", BigInt),
            // When the page changed (microseconds, the writer's clock), then
            // the page's partition key in the service's own table.
            C::clustering("at", BigInt, Order::Asc),
            C::clustering("page", Blob, Order::Asc),
        ],
        // Longer than the longest wait of a page for its visit (the graph's
        // change retention, 30 days by default); a run whose last one is
        // further back than this visits every page instead.
        default_ttl: Some(5 * WEEK),
        compaction: Compaction::TimeWindow,
        comment: "pages each service changed, by minute, for the janitor's routine runs",
    };

    pub static TABLES: [&TableDef; 3] = [&CHECKPOINTS, &LEASES, &JOURNAL];
}

/// Every table, in a stable order.
pub static ALL_TABLES: [&TableDef; 22] = [
    &meta::SCHEMA_META,
    &current_store::PAGE_RENDERS,
    &current_store::DOMAIN_PAGES,
    &current_store::SUPPRESSED,
    &current_store::OUTBOX,
    &current_store::OUTBOX_SHARDS,
    &current_store::OUTBOX_DEAD_LETTERS,
    &current_store::OUTBOX_SITES,
    &old_store::ARCHIVE_META,
    &old_store::ARCHIVE_BLOCKS,
    &old_store::ARCHIVE_TITLES,
    &old_store::ARCHIVE_SUPPRESSED,
    &old_store::ARCHIVE_DEBT,
    &old_store::ARCHIVE_DEBT_SHARDS,
    &dependency_graph::DEPENDENCIES,
    &dependency_graph::DEPENDENTS,
    &dependency_graph::DEPENDENT_BUCKETS,
    &dependency_graph::CHANGES,
    &dependency_graph::PAGE_WRITERS,
    &janitor::CHECKPOINTS,
    &janitor::LEASES,
    &janitor::JOURNAL,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declaration_is_valid_and_names_are_unique() {
        let mut names = std::collections::HashSet::new();
        for t in ALL_TABLES {
            t.validate().unwrap();
            assert!(names.insert(t.name), "table {} declared twice", t.name);
        }
    }

    #[test]
    fn validation_catches_bad_declarations() {
        static NO_PK: TableDef =
            TableDef { name: "t", columns: &[C::regular("a", Text)], default_ttl: None, compaction: Compaction::SizeTiered, comment: "" };
        static STATIC_NO_CK: TableDef = TableDef {
            name: "t",
            columns: &[C::partition("a", Text), C::statik("s", Text)],
            default_ttl: None,
            compaction: Compaction::SizeTiered,
            comment: "",
        };
        static OUT_OF_ORDER: TableDef = TableDef {
            name: "t",
            columns: &[C::partition("a", Text), C::regular("b", Text), C::clustering("c", Text, Order::Asc)],
            default_ttl: None,
            compaction: Compaction::SizeTiered,
            comment: "",
        };
        static BAD_NAME: TableDef = TableDef {
            name: "T-1",
            columns: &[C::partition("a", Text)],
            default_ttl: None,
            compaction: Compaction::SizeTiered,
            comment: "",
        };
        for t in [&NO_PK, &STATIC_NO_CK, &OUT_OF_ORDER, &BAD_NAME] {
            assert!(t.validate().is_err(), "{t:?}");
        }
    }
}
